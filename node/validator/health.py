"""The validator's /health: whether it may sign, whether its RPC answers, whether its event cursor keeps up.

A daemon whose RPC is cut, or whose event cursor froze while the chain moved on, checks nothing and must
not look healthy to an orchestrator or a load balancer. `HealthMonitor` reads the chain head through its
own short-timeout connection every interval (one read in flight at most) and notes when the durable event
cursor last moved; `decide_health` (pure) turns those facts into a typed status.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from pydantic import BaseModel, ConfigDict
from web3 import Web3

log = logging.getLogger(__name__)


class HealthStatus(StrEnum):
    """What /health answers, worst first."""

    NOT_SIGNING = "not_signing"  # a conflicting verdict or a deep reorg stopped signing
    RPC_UNREACHABLE = "rpc_unreachable"  # no chain read succeeded within the grace period
    CURSOR_STALLED = "cursor_stalled"  # the chain moved on, the event cursor did not
    OK = "ok"


@dataclass(frozen=True)
class HealthLimits:
    """How long the RPC may be silent and how far and long the cursor may lag (the validator's settings)."""

    rpc_grace: float  # seconds since the last successful chain read
    max_lag_blocks: int  # blocks the cursor may trail the head beyond the confirmations
    stall_seconds: float  # ... for this long without moving
    confirmations: int


@dataclass(frozen=True)
class HealthFacts:
    """What the monitor observed, with the time it was read."""

    now: float
    signing: bool
    last_rpc_ok: float | None
    head: int | None
    cursor: int | None
    cursor_moved: float


def decide_health(facts: HealthFacts, limits: HealthLimits) -> HealthStatus:
    """Return the health status of the observed facts."""
    if not facts.signing:
        return HealthStatus.NOT_SIGNING
    if facts.last_rpc_ok is None or facts.now - facts.last_rpc_ok > limits.rpc_grace:
        return HealthStatus.RPC_UNREACHABLE
    lag = 0 if facts.head is None or facts.cursor is None else facts.head - facts.cursor
    if lag > limits.confirmations + limits.max_lag_blocks and facts.now - facts.cursor_moved > limits.stall_seconds:
        return HealthStatus.CURSOR_STALLED
    return HealthStatus.OK


class HealthReport(BaseModel):
    """GET /health's body (200 when status is ok, else 503)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    status: HealthStatus
    healthy: bool
    address: str
    queue: int
    cursor: int | None
    head: int | None
    rpc_age_s: float | None  # seconds since the last successful chain read


class HealthMonitor:
    """Probes the RPC and watches the event cursor; `facts()` is what /health decides on."""

    def __init__(self, rpc_url: str, timeout: float, read_cursor: Callable[[], int | None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.w3 = Web3(Web3.HTTPProvider(rpc_url, request_kwargs={"timeout": timeout}))
        self.timeout = timeout
        self.read_cursor = read_cursor
        self.clock = clock
        self.last_rpc_ok: float | None = None
        self.head: int | None = None
        self.cursor: int | None = read_cursor()
        self.cursor_moved = clock()
        self._probe: asyncio.Future[int] | None = None

    async def probe(self) -> None:
        """Read the head (a read still hanging from before is waited for, never doubled) and the cursor."""
        if self._probe is None or self._probe.done():
            self._probe = asyncio.ensure_future(asyncio.to_thread(lambda: int(self.w3.eth.block_number)))
        try:
            self.head = await asyncio.wait_for(asyncio.shield(self._probe), self.timeout)
            self.last_rpc_ok = self.clock()
        except Exception as exc:  # unreachable, timed out, an error answer: all mean "not reachable now"
            log.debug("health: chain read failed", extra={"error": f"{type(exc).__name__}: {exc}"})
        cursor = self.read_cursor()
        if cursor != self.cursor:
            self.cursor, self.cursor_moved = cursor, self.clock()

    async def run(self, stop: asyncio.Event, interval: float) -> None:
        """Probe every `interval` seconds until `stop` is set."""
        while not stop.is_set():
            await self.probe()
            try:
                await asyncio.wait_for(stop.wait(), interval)
            except TimeoutError:
                continue

    def facts(self, signing: bool) -> HealthFacts:
        """Return what was observed, as of now."""
        return HealthFacts(self.clock(), signing, self.last_rpc_ok, self.head, self.cursor, self.cursor_moved)


__all__ = ["HealthFacts", "HealthLimits", "HealthMonitor", "HealthReport", "HealthStatus", "decide_health"]

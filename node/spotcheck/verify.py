"""The verifier over one device's log (pure): measure each window, then decide it against a policy.

Inputs come from the workload record: the device's declaration (with Y from the trusted catalog), its
step events, and the pinger's challenge/response events with the answers. Latencies are the pinger's
(send → receive on its clock), never the device's. Labels are checked against the stuffing recomputed
from the seed; state answers against the state re-executed from the recorded inputs (a callable, so the
engine stays an adapter). An answer counts only if the device's operator signed it for exactly that
challenge (``node.spotcheck.auth``); one that is not is counted as missing (and as unsigned).
``measure_window`` returns numbers; ``decide_window`` applies the thresholds.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from node.spotcheck.answers import (
    compute_challenge_indices,
    compute_labels_digest,
    compute_state_answer,
    compute_state_distance,
)
from node.spotcheck.auth import compute_challenge_digest, is_answer_signed_by
from node.spotcheck.errors import ReplayedNonce, SpotCode, UnknownDevice
from node.spotcheck.feasibility import compute_max_late
from node.spotcheck.stuffing import StuffingParams
from node.spotcheck.throughput import compute_overlap_steps
from node.spotcheck.wire import Answer, Challenge


@dataclass(frozen=True)
class DeviceDeclaration:
    """What a device registered (declared bytes) and what the verifier trusts (the catalog's Y for its kind)."""

    device_id: str
    kind: str
    declared_bytes: int
    catalog_bytes: int
    state_bytes: int
    stuffing: StuffingParams
    stuffing_seed: bytes
    run_id: str
    operator: str  # from the verifier's own source (run config, the chain's openRun), never from the prover
    registry_flops: float = 0.0  # the compute the device registered (prover)
    catalog_flops: float = 0.0  # the kind's peak FLOP/s from the verifier's catalogue
    achieved_share: float = 1.0  # the share of that peak the declared model reaches on the kind (verifier-measured)
    step_flops: int = 0  # one declared step's cost, computed by the verifier from the declared model's config

    @property
    def accounted_bytes(self) -> int:
        """Return the bytes the verifier can account for: identifying state plus kept stuffing."""
        return self.state_bytes + self.stuffing.total_bytes


@dataclass(frozen=True)
class StepRecord:
    """One declared workload step: its index and when its state was complete (device clock)."""

    step: int
    start_ns: int
    end_ns: int


@dataclass(frozen=True)
class Exchange:
    """One challenge and what came back: the pinger's send and receive times, the answer or an error code."""

    device_id: str
    seq: int
    kind: str
    nonce: bytes
    count: int
    issued_ms: int
    verifier: str
    sent_ns: int
    received_ns: int | None
    answer: Answer | None
    error: SpotCode | None = None

    def get_challenge(self) -> Challenge:
        """Return the challenge as it was sent (without its signature: the digest does not cover it)."""
        return Challenge(device_id=self.device_id, seq=self.seq, nonce=self.nonce.hex(),
                         kind="labels" if self.kind == "labels" else "state", count=self.count,
                         issued_ms=self.issued_ms, verifier=self.verifier)


@dataclass(frozen=True)
class WindowMeasurement:
    """The numbers of one device's window; no threshold applied."""

    device_id: str
    window: int
    challenges: int
    state_challenges: int
    labels_challenges: int
    missing: int
    errors: int
    unsigned: int
    wrong_labels: int
    stale_state: int
    unknown_step: int
    latencies_ms: tuple[float, ...]
    state_quanta: tuple[int, ...]
    declared_bytes: int
    catalog_bytes: int
    accounted_bytes: int
    # the declared-throughput check: declared steps in the window × their cost vs what the device could do in it
    declared_steps: float = 0.0
    declared_flops: float = 0.0
    device_s: float = 0.0
    capacity_flops: float = 0.0  # catalogue peak × the model's achieved share × device seconds
    registry_flops: float = 0.0
    catalog_flops: float = 0.0
    audited_steps: int = 0  # declared steps of the window whose recorded token the verifier replayed
    fabricated_steps: int = 0  # of those, steps whose token the replayed logits do not give: never computed

    @property
    def utilisation(self) -> float:
        """Return declared work ÷ capacity (1 where there is no capacity to account for)."""
        return self.declared_flops / self.capacity_flops if self.capacity_flops > 0 else 1.0


class SpotcheckPolicy(BaseModel):
    """The thresholds a verifier applies (operator settings, from a calibration on the machine)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    x_ms: float = Field(gt=0, le=60_000)
    max_late: int = Field(0, ge=0)
    # with a measured honest late rate, a window may hold at most the late answers that rate explains for the
    # challenges it *actually* held (never more than max_late): a device that answers slowly lowers its own
    # challenge count, and an allowance sized for the expected count then let every slow answer pass
    honest_late_rate: float = Field(0.0, ge=0, lt=1)
    false_alarm_target: float = Field(1e-6, gt=0, lt=1)
    state_tolerance_quanta: int = Field(0, ge=0)
    capacity_slack_bytes: int = Field(ge=0)
    min_challenges: int = Field(1, ge=0)
    # the least declared work ÷ capacity a window may show; below it the unused capacity is room for undeclared
    # work ("idle_capacity"); 0 disables the check (from a measured honest calibration, docs/spotcheck.md)
    min_utilisation: float = Field(0.0, ge=0, le=1)


@dataclass(frozen=True)
class WindowVerdict:
    """A device's verdict for one window: passed, or the failures found (codes for logs and a signed verdict)."""

    device_id: str
    window: int
    passed: bool
    failures: tuple[str, ...]


def check_exchanges(declarations: Sequence[DeviceDeclaration], exchanges: Sequence[Exchange]) -> None:
    """Raise UnknownDevice for an exchange naming an unregistered device, ReplayedNonce for a reused nonce."""
    known = {d.device_id for d in declarations}
    seen: set[bytes] = set()
    for ex in exchanges:
        if ex.device_id not in known:
            raise UnknownDevice(f"challenge {ex.seq} names an unregistered device", device=ex.device_id)
        if ex.nonce in seen:
            raise ReplayedNonce(f"nonce {ex.nonce.hex()[:16]}… used twice", device=ex.device_id)
        seen.add(ex.nonce)


def _is_stale(steps: Sequence[StepRecord], ends: list[int], step: int, sent_ns: int) -> bool:
    # stale: a newer step had completed before the challenge was sent
    newest_before = bisect.bisect_right(ends, sent_ns) - 1
    return newest_before >= 0 and steps[newest_before].step > step


def measure_window(declaration: DeviceDeclaration, window: int, steps: Sequence[StepRecord],
                   exchanges: Sequence[Exchange], blocks: np.ndarray,
                   recompute_state: Callable[[int], np.ndarray | None], *,
                   bounds_ns: tuple[int, int] | None = None, device_s: float | None = None,
                   audited: Sequence[int] = (), check_token: Callable[[int], bool | None] | None = None
                   ) -> WindowMeasurement:
    """Measure one window of one device: latencies, missing, wrong labels, state distances, stale answers, work.

    With the window's bounds (verifier clock) the declared work done in it is measured against the device's
    capacity over `device_s` device seconds (None: the window's wall time, a dedicated device). The declared
    steps in `audited` (drawn by the verifier) are replayed with `check_token`: a step whose recorded token its
    logits do not give was recorded, not computed, and its claimed work is fabricated.
    """
    by_step = {s.step: s for s in steps}
    ordered = sorted(steps, key=lambda s: s.end_ns)
    ends = [s.end_ns for s in ordered]
    latencies: list[float] = []
    quanta: list[int] = []
    missing = errors = unsigned = wrong_labels = stale = unknown = n_state = 0
    for ex in exchanges:
        n_state += ex.kind == "state"
        if ex.answer is None or ex.received_ns is None:
            missing += 1
            errors += ex.error is not None
            continue
        if not is_answer_signed_by(ex.answer, compute_challenge_digest(ex.get_challenge(), declaration.run_id),
                                   declaration.operator):
            missing += 1  # not attributable to the operator: not an answer
            unsigned += 1
            continue
        latencies.append((ex.received_ns - ex.sent_ns) / 1e6)
        answer = ex.answer
        if ex.kind == "labels":
            indices = compute_challenge_indices(ex.nonce, declaration.stuffing.n_blocks, ex.count)
            wrong_labels += answer.digest != compute_labels_digest(ex.nonce, indices, blocks)
            continue
        record = by_step.get(answer.step if answer.step is not None else -1)
        if record is None or record.end_ns > ex.received_ns:
            unknown += 1  # a step the device never recorded, or one finished only after it answered
            continue
        state = recompute_state(record.step)
        if state is None:
            unknown += 1  # a step past the recorded tokens: nothing to re-execute
            continue
        stale += _is_stale(ordered, ends, record.step, ex.sent_ns)
        recomputed = compute_state_answer(state, ex.nonce)
        quanta.append(compute_state_distance(answer.sketch or (), recomputed))
    done, seconds, capacity = _measure_work(declaration, steps, bounds_ns, device_s)
    results = [check_token(step) for step in audited] if check_token is not None else []
    return WindowMeasurement(
        device_id=declaration.device_id, window=window, challenges=len(exchanges), state_challenges=n_state,
        labels_challenges=len(exchanges) - n_state, missing=missing, errors=errors, unsigned=unsigned,
        wrong_labels=wrong_labels,
        stale_state=stale, unknown_step=unknown, latencies_ms=tuple(latencies), state_quanta=tuple(quanta),
        declared_bytes=declaration.declared_bytes, catalog_bytes=declaration.catalog_bytes,
        accounted_bytes=declaration.accounted_bytes, declared_steps=done, declared_flops=done * declaration.step_flops,
        device_s=seconds, capacity_flops=capacity, registry_flops=declaration.registry_flops,
        catalog_flops=declaration.catalog_flops, audited_steps=sum(r is not None for r in results),
        fabricated_steps=sum(r is False for r in results))


def _measure_work(declaration: DeviceDeclaration, steps: Sequence[StepRecord], bounds_ns: tuple[int, int] | None,
                  device_s: float | None) -> tuple[float, float, float]:
    # (declared steps, device seconds, capacity FLOPs) of the window; nothing measured without its bounds
    if bounds_ns is None:
        return 0.0, 0.0, 0.0
    done = compute_overlap_steps([(s.start_ns, s.end_ns) for s in steps], *bounds_ns)
    seconds = (bounds_ns[1] - bounds_ns[0]) / 1e9 if device_s is None else device_s
    return done, seconds, declaration.catalog_flops * declaration.achieved_share * seconds


def decide_window(m: WindowMeasurement, policy: SpotcheckPolicy) -> WindowVerdict:
    """Apply the policy: a wrong, stale, unknown or missing answer, too many late ones, a capacity gap, idle compute."""
    failures: list[str] = []
    late = sum(latency > policy.x_ms for latency in m.latencies_ms)
    allowed = policy.max_late
    if policy.honest_late_rate > 0:
        allowed = min(allowed, compute_max_late(max(m.challenges, 1), policy.honest_late_rate,
                                                policy.false_alarm_target))
    checks = [
        ("late", late > allowed),
        ("missing", m.missing > 0),
        ("wrong_labels", m.wrong_labels > 0),
        ("wrong_state", any(q > policy.state_tolerance_quanta for q in m.state_quanta)),
        ("stale_state", m.stale_state > 0),
        ("unknown_step", m.unknown_step > 0),
        ("fabricated_step", m.fabricated_steps > 0),
        ("capacity", m.declared_bytes != m.catalog_bytes or m.registry_flops != m.catalog_flops
         or m.catalog_bytes - m.accounted_bytes > policy.capacity_slack_bytes),
        ("too_few_challenges", m.challenges < policy.min_challenges),
        ("idle_capacity", policy.min_utilisation > 0 and (m.capacity_flops <= 0
                                                          or m.utilisation < policy.min_utilisation)),
    ]
    failures = [name for name, failed in checks if failed]
    return WindowVerdict(device_id=m.device_id, window=m.window, passed=not failures, failures=tuple(failures))


def split_windows(exchanges: Sequence[Exchange], start_ns: int, window_ns: int) -> dict[int, list[Exchange]]:
    """Group exchanges by window index ((sent − start) // window) in send order."""
    windows: dict[int, list[Exchange]] = {}
    for ex in sorted(exchanges, key=lambda e: e.sent_ns):
        windows.setdefault(max(0, (ex.sent_ns - start_ns) // window_ns), []).append(ex)
    return windows

"""Issue 31, finding 4: /health reflects RPC reachability and event-cursor progress (typed status).

The review cut the RPC for 20 s and /health kept answering healthy while the event cursor was frozen.
Here anvil itself is paused (SIGSTOP: every RPC call hangs) and resumed; and the event handler is held
while the chain moves on (the cursor freezes with the RPC fine).
"""

from __future__ import annotations

import asyncio
import os
import signal

import aiohttp
import pytest

from node.validator.health import HealthFacts, HealthLimits, HealthStatus, decide_health
from tests.node.validator.harness import harness

LIMITS = HealthLimits(rpc_grace=5.0, max_lag_blocks=10, stall_seconds=20.0, confirmations=2)
FAST = dict(health_interval=0.25, health_rpc_timeout=1.0, health_rpc_grace=2.0, health_max_lag_blocks=4,
            health_stall_seconds=2.0)


@pytest.mark.parametrize(("facts", "status"), [
    (HealthFacts(100.0, True, 99.0, 50, 48, 90.0), HealthStatus.OK),
    (HealthFacts(100.0, False, 99.0, 50, 48, 90.0), HealthStatus.NOT_SIGNING),
    (HealthFacts(100.0, True, None, None, 48, 90.0), HealthStatus.RPC_UNREACHABLE),
    (HealthFacts(100.0, True, 94.0, 50, 48, 90.0), HealthStatus.RPC_UNREACHABLE),  # 6 s without a read
    (HealthFacts(100.0, True, 99.0, 80, 48, 70.0), HealthStatus.CURSOR_STALLED),  # 32 behind, still for 30 s
    (HealthFacts(100.0, True, 99.0, 80, 48, 95.0), HealthStatus.OK),  # far behind but moving (catching up)
    (HealthFacts(100.0, True, 99.0, 60, 48, 10.0), HealthStatus.OK),  # a quiet chain: within the lag allowed
])
def test_decide_health(facts: HealthFacts, status: HealthStatus) -> None:
    assert decide_health(facts, LIMITS) is status


async def get_health(session: aiohttp.ClientSession, port: int) -> tuple[int, dict]:
    async with session.get(f"http://127.0.0.1:{port}/health") as response:
        return response.status, await response.json()


async def wait_for(session: aiohttp.ClientSession, port: int, status: str, timeout: float = 30.0) -> dict:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    body: dict = {}
    while loop.time() < deadline:
        try:
            code, body = await get_health(session, port)
        except aiohttp.ClientConnectionError:  # the daemon is still starting
            await asyncio.sleep(0.2)
            continue
        if body["status"] == status:
            assert code == (200 if status == "ok" else 503), (code, body)
            return body
        await asyncio.sleep(0.2)
    raise AssertionError(f"/health never said {status}: {body}")


def test_health_says_rpc_unreachable_while_anvil_is_paused_and_ok_again_after(tiny, tmp_path) -> None:
    async def scenario() -> None:
        async with harness(tiny, tmp_path, **FAST) as h:
            stop = asyncio.Event()
            h.task = asyncio.create_task(h.node.run(stop))
            port = h.config.metrics_port
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
                await wait_for(session, port, "ok")
                pid = h.anvil.process.pid
                os.kill(pid, signal.SIGSTOP)  # the RPC outage: every call hangs
                try:
                    body = await wait_for(session, port, "rpc_unreachable", timeout=15)
                    assert body["healthy"] is False and body["rpc_age_s"] > FAST["health_rpc_grace"]
                finally:
                    os.kill(pid, signal.SIGCONT)
                body = await wait_for(session, port, "ok", timeout=60)
                assert body["healthy"] is True and body["cursor"] is not None
            assert not h.task.done()
            iid = await h.infer()  # and it still checks
            assert (await h.settled(iid)).name == "VALID"
            stop.set()
            await asyncio.wait_for(asyncio.gather(h.task, return_exceptions=True), 20)

    asyncio.run(scenario())


def test_health_says_cursor_stalled_while_the_event_handler_is_held_and_ok_once_it_moves(tiny, tmp_path) -> None:
    async def scenario() -> None:
        async with harness(tiny, tmp_path, **FAST) as h:
            hold, release = asyncio.Event(), asyncio.Event()
            handle = h.node._on_events

            async def held(events, reorg) -> None:  # a stuck handler: the stream, and its cursor, wait
                if hold.is_set():
                    await release.wait()
                await handle(events, reorg)

            h.node._on_events = held
            stop = asyncio.Event()
            h.task = asyncio.create_task(h.node.run(stop))
            port = h.config.metrics_port
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
                await wait_for(session, port, "ok")
                hold.set()
                iid = await h.infer()  # events arrive; their handler does not return
                body = await wait_for(session, port, "cursor_stalled", timeout=30)
                assert body["head"] - body["cursor"] > 1 + FAST["health_max_lag_blocks"]
                release.set()
                await wait_for(session, port, "ok", timeout=30)
            assert (await h.settled(iid)).name == "VALID"
            stop.set()
            await asyncio.wait_for(asyncio.gather(h.task, return_exceptions=True), 20)

    asyncio.run(scenario())

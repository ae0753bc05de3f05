"""Issue 31, finding 1 on the validator's side (anvil, the tiny model, a real daemon and executer server):
a payload nobody serves yet (an executer restarting) is asked for again within the check window instead of
being voted invalid at once; one never served is voted PAYLOAD_UNAVAILABLE before the window closes."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from chain.contracts import Status
from node.errors import Reason
from tests.node.validator.harness import finish, harness, run, start


def not_found(_: dict[str, Any]) -> dict[str, Any]:
    """What a restarting executer answered before payloads were durable: nothing for that id."""
    raise web.HTTPNotFound(reason="unknown inference id")




def test_a_payload_served_only_after_a_while_is_checked_and_the_inference_settles_valid(tiny, tmp_path) -> None:
    async def scenario() -> None:
        async with harness(tiny, tmp_path) as h:
            h.tamper["payload"] = not_found  # the executer is down or restarting: its payloads are not there
            stop, task = await start(h)
            iid = await h.infer()
            await asyncio.sleep(6)  # several rounds of asking (on 404c0a8: voted invalid after ~1 s)
            assert h.store.get_verdict(iid) is None
            assert (await asyncio.to_thread(h.hub.get_inference, iid)).status is Status.COMMITTED
            h.tamper["payload"] = None  # back, with the payload on disk
            assert await h.settled(iid) is Status.VALID
            assert h.store.get_verdict(iid).valid
            await finish(stop, task)

    run(scenario())


def test_a_payload_never_served_is_voted_unavailable_inside_the_check_window(tiny, tmp_path) -> None:
    async def scenario() -> None:
        # the window is 100 blocks of 0.5 s; with a 90-block margin the last round comes after ~5 s
        async with harness(tiny, tmp_path, unavailable_margin_blocks=90) as h:
            h.tamper["payload"] = not_found
            stop, task = await start(h)
            iid = await h.infer()
            assert await h.settled(iid, timeout=60) is Status.INVALID
            record = h.store.get_verdict(iid)
            assert record is not None and not record.valid and record.reason == Reason.PAYLOAD_UNAVAILABLE
            await finish(stop, task)

    run(scenario())

"""Confirmed events on a real anvil node: confirmations, dedupe, reorgs (shallow, processed, deep), RPC loss."""

from __future__ import annotations

import asyncio

import pytest
from web3 import Web3

from chain.contracts import Params
from chain.errors import ChainUnavailable
from chain.events import DeepReorg, EventStream, MemoryCursor
from node.protocol.hashing import keccak256
from tests.chain.conftest import MODEL_ID, Net


def request(net: Net) -> int:
    return net.hub.request_inference(net.requester, net.operator.address, MODEL_ID, keccak256(b"p"), 1,
                                     Params(0x3F800000, 0x3F800000, 0, 64), 10**15)


def stream(net: Net, **kw) -> EventStream:
    head = int(net.w3.eth.block_number)
    w3 = Web3(Web3.HTTPProvider(net.w3.provider.endpoint_uri))  # type: ignore[attr-defined]
    contract = w3.eth.contract(address=net.hub.address, abi=net.hub.contract.abi)
    return EventStream(w3, contract, MemoryCursor(), start_block=head + 1, confirmations=2, **kw)


def reorg(net: Net, depth: int) -> None:
    """Replace the last `depth` blocks by empty ones (anvil_reorg)."""
    net.w3.provider.make_request("anvil_reorg", [depth, []])  # type: ignore[arg-type]


def names(events) -> list[str]:
    return [e.name for e in events]


def test_events_arrive_once_and_only_when_confirmed(anvil_net: Net) -> None:
    s = stream(anvil_net)
    inference_id = request(anvil_net)
    assert s.poll() == ([], None)  # 0 confirmations
    anvil_net.mine(1)
    assert s.poll() == ([], None)  # 1
    anvil_net.mine(1)
    events, reorg_notice = s.poll()
    assert names(events) == ["InferenceRequested"] and events[0].args["inferenceId"] == inference_id
    assert reorg_notice is None
    anvil_net.mine(3)
    assert s.poll() == ([], None)  # handed out once


def test_a_reorg_before_confirmation_never_shows_the_dropped_event(anvil_net: Net) -> None:
    s = stream(anvil_net)
    request(anvil_net)
    anvil_net.mine(1)
    reorg(anvil_net, 2)  # the request's block and the next are replaced: the request is gone
    anvil_net.mine(3)
    events, notice = s.poll()
    assert events == [] and notice is None


def test_a_reorg_of_processed_blocks_is_reported_and_the_new_branch_followed(anvil_net: Net) -> None:
    s = stream(anvil_net)
    request(anvil_net)
    anvil_net.mine(3)
    assert names(s.poll()[0]) == ["InferenceRequested"]
    reorg(anvil_net, 4)  # reaches below the processed block
    second = request(anvil_net)
    anvil_net.mine(2)
    events, notice = s.poll()
    assert notice is not None and notice.depth >= 1
    assert names(events) == ["InferenceRequested"] and events[0].args["inferenceId"] == second


def test_a_reorg_deeper_than_the_window_halts_the_stream(anvil_net: Net) -> None:
    s = stream(anvil_net, safety_window=3)
    anvil_net.mine(10)
    s.poll()
    reorg(anvil_net, 8)
    with pytest.raises(DeepReorg):
        s.poll()
    assert not s.healthy
    with pytest.raises(DeepReorg):  # stays halted: a node must not sign past this
        s.poll()


def test_a_rewound_cursor_does_not_hand_out_duplicates(anvil_net: Net) -> None:
    s = stream(anvil_net)
    request(anvil_net)
    anvil_net.mine(3)
    assert names(s.poll()[0]) == ["InferenceRequested"]
    s.cursor.save(s.cursor.load()[:1])  # back to the base block, as a restored old backup would be
    assert s.poll() == ([], None)  # same logs, same (block hash, log index): not again


def test_rpc_loss_is_typed_and_the_run_loop_recovers(anvil_net: Net) -> None:
    s = stream(anvil_net)
    live = s.w3.provider
    s.w3.provider = Web3.HTTPProvider("http://127.0.0.1:9", request_kwargs={"timeout": 0.5})  # nothing listens
    with pytest.raises(ChainUnavailable):
        s.poll()
    assert s.healthy
    request(anvil_net)
    anvil_net.mine(3)
    got: list[str] = []

    async def scenario() -> None:
        stop = asyncio.Event()

        async def handle(events, notice) -> None:
            got.extend(names(events))
            stop.set()

        task = asyncio.create_task(s.run(handle, interval=0.05, stop=stop))
        await asyncio.sleep(0.3)  # a few failing polls
        s.w3.provider = live
        await asyncio.wait_for(task, timeout=20)

    asyncio.run(scenario())
    assert got == ["InferenceRequested"]


def test_a_restart_resumes_from_the_leveldb_cursor_and_sees_a_reorg_that_happened_while_down(
        anvil_net: Net, tmp_path) -> None:
    from node.store.leveldb import Store

    first = stream(anvil_net)
    with Store(tmp_path, 31337, anvil_net.hub.address) as store:
        first.cursor = store.cursor("events")
        request(anvil_net)
        anvil_net.mine(3)
        assert names(first.poll()[0]) == ["InferenceRequested"]
    reorg(anvil_net, 3)  # while the node is down
    again = request(anvil_net)
    anvil_net.mine(2)
    with Store(tmp_path, 31337, anvil_net.hub.address) as store:
        restarted = stream(anvil_net)
        restarted.cursor = store.cursor("events")
        events, notice = restarted.poll()
        assert notice is not None
        assert [e.args["inferenceId"] for e in events] == [again]


def test_websocket_new_heads_wake_the_poller(anvil_net: Net, anvil) -> None:
    s = stream(anvil_net)
    request(anvil_net)
    got: list[str] = []

    async def scenario() -> float:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        async def handle(events, notice) -> None:
            got.extend(names(events))
            stop.set()

        # a 60 s poll interval: only a WebSocket wake-up can deliver within the timeout below
        task = asyncio.create_task(s.run(handle, interval=60.0, ws_url=anvil.ws_url, stop=stop))
        await asyncio.wait_for(s.heads_live.wait(), timeout=30)  # subscription up (no fixed sleep: CI is slow)
        await asyncio.sleep(0.5)  # the catch-up poll it triggers finds nothing confirmed
        started = loop.time()
        await asyncio.to_thread(anvil_net.mine, 2)
        await asyncio.wait_for(task, timeout=20)
        return loop.time() - started

    elapsed = asyncio.run(scenario())
    assert got == ["InferenceRequested"] and elapsed < 20


def test_stop_ends_the_run_loop_without_waiting_out_the_poll_interval(anvil_net: Net) -> None:
    s = stream(anvil_net)
    request(anvil_net)
    anvil_net.mine(2)

    async def scenario() -> float:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        started = loop.time()

        async def handle(events, notice) -> None:
            stop.set()  # e.g. a shutdown signal arriving while the loop is about to sleep 60 s

        await asyncio.wait_for(s.run(handle, interval=60.0, stop=stop), timeout=30)
        return loop.time() - started

    assert asyncio.run(scenario()) < 10

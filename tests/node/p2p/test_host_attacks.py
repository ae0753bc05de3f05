"""Attacks on a running libp2p host (real hosts on 127.0.0.1, Noise), each followed by an honest peer it
must still serve: bad payload requests, failing providers, stream floods, failing or hanging gossip
callbacks (findings 5 and 9 of issue 15)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import multiaddr
import pytest
import trio
from libp2p.custom_types import TProtocol
from libp2p.peer.peerinfo import info_from_p2p_addr

from node.p2p.host import PAYLOAD_PROTOCOL, P2PHost, PayloadNotFound
from node.p2p.wire import MAX_FETCHES_PER_PEER

PAYLOADS = {7: b'{"inference_id": "7"}' * 100}
TOPIC = "verinfer/31337/0xabc/verdicts"


def full_addr(host: P2PHost) -> str:
    return host.addrs[0] if "/p2p/" in host.addrs[0] else f"{host.addrs[0]}/p2p/{host.peer_id}"


def store_like(inference_id: int) -> bytes | None:
    """Look an id up the way node/store/leveldb.py keys records: a uint256 key (negative or huge ids overflow)."""
    key = b"record/payload/" + inference_id.to_bytes(32, "big")
    return PAYLOADS.get(int.from_bytes(key[-32:], "big"))


async def _read_all(stream: Any, deadline: float) -> bytes:
    out = b""
    with trio.move_on_after(deadline):
        try:
            while chunk := await stream.read(65536):
                out += chunk
        except Exception:  # reset by the server: what came before is the answer
            pass
    return out


async def _send_raw(attacker: P2PHost, addr: str, frame: bytes, protocol: str) -> bytes:
    info = info_from_p2p_addr(multiaddr.Multiaddr(addr))
    with trio.fail_after(5):
        await attacker._host.connect(info)
        stream = await attacker._host.new_stream(info.peer_id, [TProtocol(protocol)])
        await stream.write(frame)
        return await _read_all(stream, 3)


def send_raw(attacker: P2PHost, addr: str, frame: bytes, protocol: str = PAYLOAD_PROTOCOL) -> bytes:
    """Send raw bytes on a stream (payload protocol unless told) as a hostile peer would; return what comes back."""
    return bytes(trio.from_thread.run(_send_raw, attacker, addr, frame, protocol, trio_token=attacker._token))


def frame(body: bytes) -> bytes:
    return len(body).to_bytes(4, "big") + body


BAD_REQUESTS = [
    frame(b"-1"),  # overflowed the store's uint256 key and ended the host (finding 5)
    frame(str(2**256).encode()),
    frame(str(10**100).encode()),
    frame("٧".encode()),  # int() reads it as 7
    frame("é".encode()),
    frame(b"\xff\xfe"),
    frame(b"+7"),
    frame(b" 7"),
    frame(b"7\n"),
    frame(b"1_0"),
    frame(b"07"),
    frame(b""),
    frame(b"1" * 200),  # over-long
    (2**32 - 1).to_bytes(4, "big"),  # announces 4 GiB, sends nothing
]


def test_bad_payload_requests_end_only_their_stream_and_honest_peers_are_still_served(tmp_path: Path) -> None:
    with P2PHost(tmp_path / "b.key", provider=store_like, timeout=3.0) as b, \
            P2PHost(tmp_path / "m.key", timeout=3.0) as mallory, P2PHost(tmp_path / "a.key", timeout=3.0) as alice:
        assert alice.fetch_payload_blocking(full_addr(b), 7) == PAYLOADS[7]
        answers = [send_raw(mallory, full_addr(b), request) for request in BAD_REQUESTS]
        assert alice.fetch_payload_blocking(full_addr(b), 7) == PAYLOADS[7]  # still serving
        assert answers == [b""] * len(BAD_REQUESTS)  # each refused: no answer, its stream reset
        assert b.counts["payload_invalid_request"] == len(BAD_REQUESTS) and b.is_running()
        assert send_raw(mallory, full_addr(b), frame(b"7"))[5:] == PAYLOADS[7]  # the same peer, asking properly
        with pytest.raises(PayloadNotFound):
            alice.fetch_payload_blocking(full_addr(b), 2**256 - 1)  # the largest id is valid: not found, no crash


def test_a_burst_of_100_bad_requests_leaves_the_host_serving(tmp_path: Path) -> None:
    with P2PHost(tmp_path / "b.key", provider=store_like, timeout=3.0) as b, \
            P2PHost(tmp_path / "m.key", timeout=3.0) as mallory, P2PHost(tmp_path / "a.key", timeout=3.0) as alice:
        for i in range(100):
            send_raw(mallory, full_addr(b), BAD_REQUESTS[i % len(BAD_REQUESTS)])
        started = time.perf_counter()
        assert alice.fetch_payload_blocking(full_addr(b), 7) == PAYLOADS[7]
        assert time.perf_counter() - started < 1.0
        assert b.counts["payload_invalid_request"] == 100


def test_a_provider_that_raises_or_hangs_costs_one_answer_not_the_host(tmp_path: Path) -> None:
    release = threading.Event()

    def provider(inference_id: int) -> bytes | None:
        if inference_id == 1:
            raise OverflowError("int too big to convert")  # what the store's key did for a huge id
        if inference_id == 2:
            raise KeyError("commitment")  # a record without the expected field
        if inference_id == 3:
            release.wait(10)  # a store stuck on its lock or disk
        if inference_id == 4:
            return "not bytes"  # type: ignore[return-value]
        return PAYLOADS.get(inference_id)

    with P2PHost(tmp_path / "b.key", provider=provider, timeout=3.0) as b, \
            P2PHost(tmp_path / "a.key", timeout=5.0) as alice:
        addr = full_addr(b)
        for iid in (1, 2, 4):
            with pytest.raises(PayloadNotFound):
                alice.fetch_payload_blocking(addr, iid)
        def fetch_stuck() -> None:
            with pytest.raises(PayloadNotFound):
                alice.fetch_payload_blocking(addr, 3)

        stuck = threading.Thread(target=fetch_stuck)
        stuck.start()
        try:
            started = time.perf_counter()
            assert alice.fetch_payload_blocking(addr, 7) == PAYLOADS[7]  # while the provider hangs on id 3
            assert time.perf_counter() - started < 1.0
        finally:
            release.set()
            stuck.join(10)
        assert b.is_running() and b.counts["payload_provider_error"] == 3


async def _hold_streams(attacker: P2PHost, addr: str, n: int, opened: threading.Event) -> list[tuple[bytes, float]]:
    """Open n payload streams that send half a length prefix and wait; return what each got back, and when."""
    info = info_from_p2p_addr(multiaddr.Multiaddr(addr))
    await attacker._host.connect(info)
    started = trio.current_time()
    ended: list[tuple[bytes, float]] = []
    streams = []
    for _ in range(n):
        try:
            stream = await attacker._host.new_stream(info.peer_id, [PAYLOAD_PROTOCOL])
            await stream.write(b"\x00\x00")
            streams.append(stream)
        except Exception:  # reset by the host before the protocol was even acknowledged: refused
            ended.append((b"", trio.current_time() - started))
    opened.set()

    async def wait_out(stream: Any) -> None:
        answer = await _read_all(stream, 10)
        ended.append((answer, trio.current_time() - started))

    async with trio.open_nursery() as nursery:
        for stream in streams:
            nursery.start_soon(wait_out, stream)
    return sorted(ended, key=lambda e: e[1])


def test_a_peer_cannot_hold_more_than_its_share_of_payload_streams(tmp_path: Path) -> None:
    with P2PHost(tmp_path / "b.key", provider=store_like, timeout=3.0, request_timeout=1.0,
                 max_streams_per_peer=4) as b, P2PHost(tmp_path / "m.key") as mallory, \
            P2PHost(tmp_path / "a.key", timeout=3.0) as alice:
        addr = full_addr(b)
        result: dict[str, Any] = {}
        opened = threading.Event()

        def attack() -> None:
            result["ended"] = trio.from_thread.run(_hold_streams, mallory, addr, 6, opened, trio_token=mallory._token)

        attacker = threading.Thread(target=attack)
        attacker.start()
        assert opened.wait(5)
        assert alice.fetch_payload_blocking(addr, 7) == PAYLOADS[7]  # another peer is served meanwhile
        attacker.join(15)
        ended = result["ended"]
        assert [answer for answer, _ in ended] == [b""] * 6  # none answered
        assert [t < 0.5 for _, t in ended] == [True] * 2 + [False] * 4  # 5 and 6 refused at once, not held
        assert all(0.9 < t < 2.0 for _, t in ended[2:])  # the admitted four: cut at the request timeout
        assert b.counts["payload_busy"] == 2 and b.counts["payload_timeout"] == 4
        assert send_raw(mallory, addr, frame(b"7"))[5:] == PAYLOADS[7]  # its share is free again


def test_an_honest_burst_of_fetches_never_meets_the_per_peer_limit(tmp_path: Path) -> None:
    with P2PHost(tmp_path / "b.key", provider=store_like, timeout=5.0) as b, \
            P2PHost(tmp_path / "a.key", timeout=5.0) as alice:
        async def many() -> list[bytes]:
            n = 5 * MAX_FETCHES_PER_PEER
            return await asyncio.gather(*(alice.fetch_payload(full_addr(b), 7) for _ in range(n)))

        assert asyncio.run(many()) == [PAYLOADS[7]] * 5 * MAX_FETCHES_PER_PEER  # our side queues its own fetches
        assert b.counts["payload_busy"] == 0


@contextmanager
def gossip_host(path: Path, validate: Callable[[bytes], bool], on_message: Callable[[bytes], None],
                **kwargs: Any) -> Iterator[P2PHost]:
    with P2PHost(path, topic=TOPIC, validate=validate, on_message=on_message, **kwargs) as host:
        yield host


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    return condition()


def test_gossip_callbacks_that_raise_or_hang_cost_one_message_not_the_host(tmp_path: Path) -> None:
    release, hanging = threading.Event(), threading.Event()
    seen: dict[str, list[bytes]] = {"b": [], "h": []}

    def validate(data: bytes) -> bool:
        if data.startswith(b"raise:"):
            raise ValueError("malformed vote")  # what a decoder does with garbage
        if data.startswith(b"hang:"):
            hanging.set()
            release.wait(20)  # a blocking RPC to a chain node that does not answer
        return data.startswith(b"signed:")

    def on_message_b(data: bytes) -> None:
        if data == b"signed: boom":
            raise KeyError("artifact_root")
        seen["b"].append(data)

    try:
        with gossip_host(tmp_path / "b.key", validate, on_message_b, provider=store_like, timeout=3.0,
                         validate_budget=0.5) as b, \
                gossip_host(tmp_path / "m.key", lambda _: True, lambda _: None) as mallory, \
                gossip_host(tmp_path / "h.key", validate, seen["h"].append, timeout=3.0) as honest:
            mallory.connect_blocking(full_addr(b))
            honest.connect_blocking(full_addr(b))
            # the attack: mallory's messages pass its own validator and reach b
            assert wait_for(lambda: bool(mallory._pubsub.peer_topics.get(TOPIC))), "mallory never saw b subscribe"
            for data in (b"raise: 1", b"hang: 2", b"signed: boom", b"raise: 3"):
                mallory.publish_blocking(data)
            assert hanging.wait(10)
            # b still serves a payload while a validation hangs, and still gossips both ways with an honest peer
            started = time.perf_counter()
            assert honest.fetch_payload_blocking(full_addr(b), 7) == PAYLOADS[7]
            assert time.perf_counter() - started < 1.0

            def both_ways() -> bool:
                return any(d.startswith(b"signed: from b") for d in seen["h"]) and \
                    any(d.startswith(b"signed: from h") for d in seen["b"])

            for n in range(50):  # until the honest pair's meshes have formed
                b.publish_blocking(b"signed: from b %d" % n)
                honest.publish_blocking(b"signed: from h %d" % n)
                if wait_for(both_ways, 0.2):
                    break
            assert any(d.startswith(b"signed: from b") for d in seen["h"])
            assert any(d.startswith(b"signed: from h") for d in seen["b"])
            assert wait_for(lambda: b.counts["gossip_validate_error"] == 2 and b.counts["gossip_handler_error"] == 1
                            and b.counts["gossip_validate_timeout"] == 1), dict(b.counts)
            assert b.is_running()
    finally:
        release.set()


def test_garbage_on_libp2p_own_protocols_ends_only_that_stream(tmp_path: Path) -> None:
    seen: list[bytes] = []
    with gossip_host(tmp_path / "b.key", lambda d: d.startswith(b"signed:"), lambda _: None, provider=store_like,
                     timeout=3.0) as b, P2PHost(tmp_path / "m.key", timeout=3.0) as mallory, \
            gossip_host(tmp_path / "h.key", lambda d: d.startswith(b"signed:"), seen.append, timeout=3.0) as honest:
        for protocol in ("/meshsub/1.0.0", "/ipfs/id/push/1.0.0"):
            send_raw(mallory, full_addr(b), b"\x05\xff\xff\xff\xff\xff", protocol)  # a length, then no protobuf
        assert honest.fetch_payload_blocking(full_addr(b), 7) == PAYLOADS[7]
        honest.connect_blocking(full_addr(b))
        for n in range(50):  # until the pair's meshes have formed
            b.publish_blocking(b"signed: from b %d" % n)
            if wait_for(lambda: bool(seen), 0.2):
                break
        assert seen and b.is_running() and b.counts["stream_handler_error"] >= 1


def test_a_bad_request_on_a_kept_alive_stream_ends_that_stream_after_the_good_answer(tmp_path: Path) -> None:
    with P2PHost(tmp_path / "b.key", provider=store_like, timeout=3.0) as b, \
            P2PHost(tmp_path / "m.key", timeout=3.0) as mallory, P2PHost(tmp_path / "a.key", timeout=3.0) as alice:
        answer = send_raw(mallory, full_addr(b), frame(b"7") + frame(b"-1") + frame(b"7"))
        assert answer[5:] == PAYLOADS[7], "the first request is answered, nothing after the bad one"
        assert b.counts["payload_invalid_request"] == 1 and b.is_running()
        assert alice.fetch_payload_blocking(full_addr(b), 7) == PAYLOADS[7]

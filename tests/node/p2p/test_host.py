"""Real libp2p hosts on 127.0.0.1 (Noise): payload exchange, not-found, bad peers scored down, restart."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from node.p2p.host import SCORE_FLOOR, P2PHost, PayloadNotFound, PeerUnavailable

PAYLOADS = {7: b'{"inference_id": "7"}' * 1000, 8: b"x" * (2 * 2**20)}


def full_addr(host: P2PHost) -> str:
    return host.addrs[0] if "/p2p/" in host.addrs[0] else f"{host.addrs[0]}/p2p/{host.peer_id}"


def test_a_payload_travels_between_two_hosts_and_unknown_ids_are_typed(tmp_path: Path) -> None:
    with P2PHost(tmp_path / "a.key") as a, P2PHost(tmp_path / "b.key", provider=PAYLOADS.get) as b:
        assert a.fetch_payload_blocking(full_addr(b), 7) == PAYLOADS[7]
        assert a.fetch_payload_blocking(full_addr(b), 8) == PAYLOADS[8]  # 2 MiB
        with pytest.raises(PayloadNotFound):
            a.fetch_payload_blocking(full_addr(b), 9)


def test_fetches_to_one_peer_reuse_one_stream_and_a_stream_the_server_ended_is_replaced(tmp_path: Path) -> None:
    with P2PHost(tmp_path / "a.key") as a, P2PHost(tmp_path / "b.key", provider=PAYLOADS.get, keepalive=0.5) as b:
        addr = full_addr(b)
        for _ in range(4):
            assert a.fetch_payload_blocking(addr, 7) == PAYLOADS[7]
        with pytest.raises(PayloadNotFound):  # a complete not-found answer leaves the stream usable
            a.fetch_payload_blocking(addr, 9)
        assert a.fetch_payload_blocking(addr, 8) == PAYLOADS[8]
        time.sleep(0.1)
        assert b.streams_served == 1, "one negotiated stream carried every request"
        time.sleep(1.5)  # the server ends the idle stream after its keepalive
        assert a.fetch_payload_blocking(addr, 7) == PAYLOADS[7], "the ended stream is replaced, the fetch succeeds"
        deadline = time.monotonic() + 5  # the server counts after its write returns, maybe after we read
        while b.requests_served < 7 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert (b.streams_served, b.requests_served) == (2, 7)
        assert not b.counts, "ending an idle kept-alive stream is not a rejection"


def test_the_asyncio_bridge(tmp_path: Path) -> None:
    with P2PHost(tmp_path / "a.key") as a, P2PHost(tmp_path / "b.key", provider=PAYLOADS.get) as b:
        async def many() -> list[bytes]:
            return await asyncio.gather(*(a.fetch_payload(full_addr(b), 7) for _ in range(5)))

        assert asyncio.run(many()) == [PAYLOADS[7]] * 5


def test_the_peer_key_persists_so_a_restarted_node_keeps_its_identity(tmp_path: Path) -> None:
    with P2PHost(tmp_path / "b.key", provider=PAYLOADS.get) as b:
        first = b.peer_id
    assert oct((tmp_path / "b.key").stat().st_mode & 0o777) == "0o600"
    with P2PHost(tmp_path / "b.key", provider=PAYLOADS.get) as b, P2PHost(tmp_path / "a.key") as a:
        assert b.peer_id == first
        assert a.fetch_payload_blocking(full_addr(b), 7) == PAYLOADS[7]  # re-joined: reachable again


def test_a_peer_that_serves_bad_data_is_scored_down_and_dropped(tmp_path: Path) -> None:
    with P2PHost(tmp_path / "a.key") as a, P2PHost(tmp_path / "b.key", provider=lambda _: b"tampered") as b:
        addr = full_addr(b)
        while a.score_down(addr) > SCORE_FLOOR:  # the caller found the bytes did not match the commitment
            assert a.fetch_payload_blocking(addr, 7) == b"tampered"
        with pytest.raises(PeerUnavailable, match="dropped"):
            a.fetch_payload_blocking(addr, 7)


def test_a_gone_peer_is_unavailable_not_a_crash(tmp_path: Path) -> None:
    with P2PHost(tmp_path / "b.key", provider=PAYLOADS.get) as b:
        addr = full_addr(b)
    with P2PHost(tmp_path / "a.key", timeout=3.0) as a, pytest.raises(PeerUnavailable):
        a.fetch_payload_blocking(addr, 7)


def test_gossip_relays_only_valid_messages_across_hosts_that_are_not_directly_connected(tmp_path: Path) -> None:
    import threading
    import time

    received: dict[str, list[bytes]] = {"a": [], "b": [], "c": []}
    lock = threading.Lock()

    def host(name: str) -> P2PHost:
        def on_message(data: bytes) -> None:
            with lock:
                received[name].append(data)

        return P2PHost(tmp_path / f"{name}.key", topic="verinfer/31337/0xabc/verdicts",
                       validate=lambda data: data.startswith(b"signed:"), on_message=on_message)

    with host("a") as a, host("b") as b, host("c") as c:
        a.connect_blocking(full_addr(b))  # b -- a -- c: b and c only meet through a
        a.connect_blocking(full_addr(c))
        time.sleep(2.0)  # meshes form on the heartbeat
        b.publish_blocking(b"signed: verdict 1")
        b.publish_blocking(b"forged: verdict 2")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not received["c"]:
            time.sleep(0.05)
        time.sleep(0.3)
        with lock:
            assert received["c"] == [b"signed: verdict 1"]  # relayed by a; the invalid one stopped
            assert received["a"] == [b"signed: verdict 1"]


def test_served_payloads_are_kept_in_memory_within_their_byte_bound_and_not_found_is_not(tmp_path: Path) -> None:
    calls: list[int] = []
    store: dict[int, bytes] = {7: PAYLOADS[7], 8: b"y" * 30_000}

    def provider(inference_id: int) -> bytes | None:
        calls.append(inference_id)
        return store.get(inference_id)

    with P2PHost(tmp_path / "a.key") as a, P2PHost(tmp_path / "b.key", provider=provider, cache_bytes=40_000) as b:
        addr = full_addr(b)
        for _ in range(3):
            assert a.fetch_payload_blocking(addr, 7) == PAYLOADS[7]
        assert calls == [7], "a quorum's later fetches are answered from memory"
        with pytest.raises(PayloadNotFound):
            a.fetch_payload_blocking(addr, 9)
        store[9] = b"z" * 100  # stored after the first ask: "not found" was not kept
        assert a.fetch_payload_blocking(addr, 9) == b"z" * 100
        assert a.fetch_payload_blocking(addr, 8) == store[8]  # 21,000 + 100 + 30,000 > 40,000: 7 is dropped
        assert a.fetch_payload_blocking(addr, 7) == PAYLOADS[7]
        assert calls == [7, 9, 9, 8, 7]
        assert b._cached <= 40_000


def test_the_asyncio_bridge_hands_on_typed_errors_and_a_stopped_host_is_unavailable(tmp_path: Path) -> None:
    a = P2PHost(tmp_path / "a.key").start()
    with P2PHost(tmp_path / "b.key", provider=PAYLOADS.get) as b:
        addr = full_addr(b)

        async def ask(iid: int) -> bytes:
            return await a.fetch_payload(addr, iid)

        assert asyncio.run(ask(7)) == PAYLOADS[7]
        with pytest.raises(PayloadNotFound):
            asyncio.run(ask(9))
    with pytest.raises(PeerUnavailable):  # the serving host is gone
        asyncio.run(ask(7))
    a.stop()
    with pytest.raises(PeerUnavailable):  # our own host is stopped: typed, not a hang
        asyncio.run(asyncio.wait_for(ask(7), 10))

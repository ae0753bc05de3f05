"""A libp2p host in its own trio thread, with a clean bridge to the asyncio daemon.

Security is Noise only (no plaintext transport is configured). The peer key is persistent: a
secp256k1 private key in the node's data dir (0600). The payload protocol `/verinfer/payload/1`:
  request   uint32 length ‖ UTF-8 decimal inference id
  response  uint8 status (0 found, 1 not found) ‖ uint32 length ‖ payload JSON bytes
with a size limit and a timeout on every read. The answer is only bytes: the caller checks them
against the on-chain commitments before caching or passing them on, and scores the peer down if
they do not match; a peer under the floor is dropped.

asyncio → trio: `trio.from_thread.run` (with the host's trio token) inside `asyncio.to_thread`.
trio → the provider: a plain function called in the trio thread (it must be thread-safe and quick:
a cache or store lookup).
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import multiaddr
import trio
from libp2p import new_host
from libp2p.crypto.secp256k1 import create_new_key_pair
from libp2p.crypto.x25519 import create_new_key_pair as create_noise_key_pair
from libp2p.custom_types import TProtocol
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport

from node.errors import FatalError, InvalidInput, Reason, RecoverableError

log = logging.getLogger(__name__)
PAYLOAD_PROTOCOL = TProtocol("/verinfer/payload/1")
MAX_PAYLOAD = 32 * 2**20
MAX_REQUEST = 128
FOUND, NOT_FOUND = 0, 1
SCORE_FLOOR = -3


class PeerUnavailable(RecoverableError):
    """The peer could not be reached or did not answer in time."""


class PayloadNotFound(RecoverableError):
    """The peer does not have the payload."""


class BadPeerAnswer(InvalidInput):
    """The peer's answer broke the protocol (size, framing)."""


def load_peer_key(path: Path) -> bytes:
    """Return the node's persistent libp2p secp256k1 secret, creating it (0600) on first use."""
    if path.exists():
        secret = path.read_bytes()
        if len(secret) != 32:
            raise FatalError(f"{path} is not a 32-byte peer key", Reason.OUT_OF_RANGE)
        return secret
    path.parent.mkdir(parents=True, exist_ok=True)
    secret = secrets.token_bytes(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(secret)
    return secret


def compute_peer_id(key_path: Path) -> str:
    """Return the libp2p peer id of a node's persistent key (created if missing): for announcing addresses."""
    from libp2p.peer.id import ID

    return str(ID.from_pubkey(create_new_key_pair(load_peer_key(key_path)).public_key))


async def _read_exact(stream: Any, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = await stream.read(n - len(buf))
        if not chunk:
            raise EOFError("stream closed early")
        buf += chunk
    return buf


@dataclass
class P2PHost:
    """One node's libp2p host; start() runs it in a thread, stop() ends it."""

    key_path: Path
    provider: Callable[[int], bytes | None] = lambda _: None
    listen: str = "/ip4/127.0.0.1/tcp/0"
    timeout: float = 10.0
    scores: dict[str, int] = field(default_factory=dict)
    _thread: threading.Thread | None = None
    _token: Any = None
    _stop: Any = None
    _ready: threading.Event = field(default_factory=threading.Event)
    _error: BaseException | None = None
    addrs: list[str] = field(default_factory=list)
    peer_id: str = ""
    topic: str | None = None  # gossipsub topic for verdicts (one per chain + contract); None: no gossip
    validate: Callable[[bytes], bool] = lambda _: False  # checked before a message is delivered or relayed
    on_message: Callable[[bytes], None] = lambda _: None  # called in the trio thread for every valid message

    def start(self) -> P2PHost:
        """Start the host in its own trio thread and wait until it listens."""
        self._thread = threading.Thread(target=trio.run, args=(self._main,), name="libp2p", daemon=True)
        self._thread.start()
        if not self._ready.wait(30) or self._error is not None:
            raise FatalError(f"libp2p host did not start: {self._error!r}", Reason.OUT_OF_RANGE)
        return self

    def stop(self) -> None:
        """Stop the host and join its thread."""
        if self._token is not None and self._thread is not None and self._thread.is_alive():
            trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
            self._thread.join(10)

    async def _main(self) -> None:
        try:
            secret = load_peer_key(self.key_path)
            key_pair = create_new_key_pair(secret)
            noise = NoiseTransport(libp2p_keypair=key_pair, noise_privkey=create_noise_key_pair().private_key,
                                   early_data=None)
            self._host = new_host(key_pair=key_pair, sec_opt={NOISE_PROTOCOL_ID: noise})
            self._host.set_stream_handler(PAYLOAD_PROTOCOL, self._serve)
            self._stop = trio.Event()
            self._token = trio.lowlevel.current_trio_token()
            async with self._host.run(listen_addrs=[multiaddr.Multiaddr(self.listen)]):
                self.addrs = [str(a) for a in self._host.get_addrs()]
                self.peer_id = str(self._host.get_id())
                if self.topic is None:
                    self._ready.set()
                    await self._stop.wait()
                else:
                    await self._run_gossip(self.topic)
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            raise

    async def _run_gossip(self, topic: str) -> None:
        from libp2p.pubsub.gossipsub import PROTOCOL_ID as GOSSIPSUB_PROTOCOL_ID
        from libp2p.pubsub.gossipsub import GossipSub
        from libp2p.pubsub.pubsub import Pubsub
        from libp2p.tools.anyio_service import background_trio_service

        router = GossipSub(protocols=[GOSSIPSUB_PROTOCOL_ID], degree=6, degree_low=4, degree_high=12,
                           heartbeat_initial_delay=0.2, heartbeat_interval=1)
        self._pubsub = Pubsub(self._host, router)
        async with background_trio_service(self._pubsub), background_trio_service(router):
            await self._pubsub.wait_until_ready()
            self._pubsub.set_topic_validator(topic, lambda _peer, msg: self._is_valid(msg.data), False)
            subscription = await self._pubsub.subscribe(topic)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._deliver, subscription)
                self._ready.set()
                await self._stop.wait()
                nursery.cancel_scope.cancel()

    def _is_valid(self, data: bytes) -> bool:
        try:
            return bool(self.validate(data))
        except Exception as exc:  # a validator that fails rejects: a message is relayed only when known good
            log.info("gossip message rejected: %s", exc)
            return False

    async def _deliver(self, subscription: Any) -> None:
        while True:
            message = await subscription.get()
            try:
                self.on_message(bytes(message.data))
            except Exception:
                log.exception("gossip handler failed")

    async def _connect(self, addr: str) -> None:
        with trio.fail_after(self.timeout):
            await self._host.connect(info_from_p2p_addr(multiaddr.Multiaddr(addr)))

    def connect_blocking(self, addr: str) -> None:
        """Dial a peer (call from a non-trio thread); failures are logged, not raised: peers come and go."""
        try:
            trio.from_thread.run(self._connect, addr, trio_token=self._token)
        except Exception as exc:
            log.info("peer %s not reachable: %s", addr, exc)

    async def _publish(self, data: bytes) -> None:
        assert self.topic is not None
        await self._pubsub.publish(self.topic, data)

    def publish_blocking(self, data: bytes) -> None:
        """Publish on the verdict topic (call from a non-trio thread)."""
        if self.topic is None:
            raise FatalError("this host has no gossip topic", Reason.OUT_OF_RANGE)
        trio.from_thread.run(self._publish, data, trio_token=self._token)

    async def _serve(self, stream: Any) -> None:
        try:
            with trio.fail_after(self.timeout):
                n = int.from_bytes(await _read_exact(stream, 4), "big")
                if n > MAX_REQUEST:
                    return
                inference_id = int((await _read_exact(stream, n)).decode())
                body = self.provider(inference_id)
                if body is None or len(body) > MAX_PAYLOAD:
                    await stream.write(bytes([NOT_FOUND]) + (0).to_bytes(4, "big"))
                else:
                    await stream.write(bytes([FOUND]) + len(body).to_bytes(4, "big") + body)
        except (trio.TooSlowError, EOFError, ValueError) as exc:
            log.info("payload request dropped: %s", exc)
        finally:
            await stream.close()

    async def _fetch(self, addr: str, inference_id: int) -> bytes:
        info = info_from_p2p_addr(multiaddr.Multiaddr(addr))
        with trio.fail_after(self.timeout):
            await self._host.connect(info)
            stream = await self._host.new_stream(info.peer_id, [PAYLOAD_PROTOCOL])
            try:
                request = str(inference_id).encode()
                await stream.write(len(request).to_bytes(4, "big") + request)
                status = (await _read_exact(stream, 1))[0]
                n = int.from_bytes(await _read_exact(stream, 4), "big")
                if status == NOT_FOUND:
                    raise PayloadNotFound(f"{info.peer_id} has no payload for {inference_id}", Reason.OK)
                if status != FOUND or n > MAX_PAYLOAD:
                    raise BadPeerAnswer(f"{info.peer_id}: status {status}, {n} bytes", Reason.WIRE_TOO_LARGE)
                return await _read_exact(stream, n)
            finally:
                await stream.close()

    def fetch_payload_blocking(self, addr: str, inference_id: int) -> bytes:
        """Fetch a payload from a peer (call from a non-trio thread)."""
        peer = addr.rsplit("/p2p/", 1)[-1]
        if self.scores.get(peer, 0) <= SCORE_FLOOR:
            raise PeerUnavailable(f"peer {peer} was dropped for serving bad data", Reason.OK)
        try:
            return bytes(trio.from_thread.run(self._fetch, addr, inference_id, trio_token=self._token))
        except (trio.TooSlowError, OSError, EOFError) as exc:
            raise PeerUnavailable(f"{peer}: {type(exc).__name__}: {exc}", Reason.OK) from exc
        except (PayloadNotFound, BadPeerAnswer):
            raise
        except Exception as exc:  # libp2p's own errors (dial, negotiation): the peer is unavailable
            raise PeerUnavailable(f"{peer}: {type(exc).__name__}: {exc}", Reason.OK) from exc

    async def fetch_payload(self, addr: str, inference_id: int) -> bytes:
        """Fetch a payload from a peer (from the asyncio loop)."""
        return await asyncio.to_thread(self.fetch_payload_blocking, addr, inference_id)

    def score_down(self, addr: str) -> int:
        """Lower a peer's score after bad data; return the new score (dropped at or under the floor)."""
        peer = addr.rsplit("/p2p/", 1)[-1]
        self.scores[peer] = self.scores.get(peer, 0) - 2
        return self.scores[peer]

    def __enter__(self) -> P2PHost:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

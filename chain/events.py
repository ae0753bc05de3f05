"""Confirmed contract events with reorg detection by block hash (no node sends `removed` logs).

A stream hands out each log once, only after `confirmations` blocks sit on top of it, in chain
order. It remembers the hashes of the blocks it processed within `safety_window`; if the chain
under its cursor changed, it rewinds to the common ancestor and hands out the new branch's logs
(a log is identified by block hash and log index, so a log re-included in another block is new).
A reorg deeper than the window raises DeepReorg: the node must stop signing (it can no longer tell
what it acted on). The cursor is persisted by the caller's store after every poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from web3 import Web3
from web3.contract import Contract

from chain.contracts import abi_type
from chain.errors import ChainError, ChainUnavailable

log = logging.getLogger(__name__)


class DeepReorg(ChainError):
    """The chain changed below the safety window: stop signing."""

    code = "deep_reorg"


class CursorStore(Protocol):
    """Where a stream keeps its position: the hashes of the last processed blocks, oldest first."""

    def load(self) -> list[tuple[int, str]]:
        """Return [(block, hash), …] of the recently processed blocks; the last one is the cursor."""

    def save(self, blocks: list[tuple[int, str]]) -> None:
        """Persist them (the node's LevelDB, synced)."""


@dataclass
class MemoryCursor:
    """A CursorStore in memory (tests, one-shot tools)."""

    blocks: list[tuple[int, str]] = field(default_factory=list)

    def load(self) -> list[tuple[int, str]]:
        """Return the processed blocks."""
        return list(self.blocks)

    def save(self, blocks: list[tuple[int, str]]) -> None:
        """Keep them."""
        self.blocks = list(blocks)


@dataclass(frozen=True)
class ChainEvent:
    """One decoded, confirmed contract log."""

    name: str
    args: dict[str, Any]
    block_number: int
    block_hash: str
    transaction_hash: str
    log_index: int

    @property
    def key(self) -> tuple[str, int]:
        """Return the log's identity (block hash, log index)."""
        return (self.block_hash, self.log_index)


@dataclass(frozen=True)
class Reorg:
    """The processed chain changed: blocks after `ancestor` were replaced."""

    ancestor: int
    depth: int


@dataclass
class EventStream:
    """Confirmed logs of one contract."""

    w3: Web3
    contract: Contract
    cursor: CursorStore
    start_block: int = 0
    confirmations: int = 2
    safety_window: int = 64
    chunk: int = 2000
    _seen: OrderedDict[tuple[str, int], None] = field(default_factory=OrderedDict)
    healthy: bool = True
    heads_live: asyncio.Event = field(default_factory=asyncio.Event)  # set while a newHeads subscription is up

    def __post_init__(self) -> None:
        self._decoders: dict[bytes, Any] = {}
        for item in cast(list[dict[str, Any]], self.contract.abi):
            if item.get("type") == "event":
                topic = Web3.keccak(text=f"{item['name']}({','.join(abi_type(i) for i in item['inputs'])})")
                self._decoders[bytes(topic)] = getattr(self.contract.events, item["name"])()

    def poll(self) -> tuple[list[ChainEvent], Reorg | None]:
        """Return the logs confirmed since the last poll, and a Reorg notice if the processed chain changed."""
        if not self.healthy:
            raise DeepReorg("the stream halted after a deep reorg")
        try:
            reorg = self._check_reorg()
            events = self._advance()
        except (ChainError, DeepReorg):
            raise
        except Exception as exc:  # RPC trouble: the caller retries with back-off
            raise ChainUnavailable(f"{type(exc).__name__}: {exc}") from exc
        return events, reorg

    def _block_hash(self, number: int) -> str:
        return str(Web3.to_hex(self.w3.eth.get_block(number)["hash"]))

    def _check_reorg(self) -> Reorg | None:
        blocks = self.cursor.load()
        if not blocks:
            return None
        block, block_hash = blocks[-1]
        if self._block_hash(block) == block_hash:
            return None
        for i in range(len(blocks) - 2, -1, -1):
            number, known = blocks[i]
            if self._block_hash(number) == known:
                depth = block - number
                log.warning("reorg detected", extra={"ancestor": number, "depth": depth})
                self.cursor.save(blocks[: i + 1])
                return Reorg(number, depth)
        self.healthy = False
        raise DeepReorg(f"block {block} changed and no common ancestor within the last {len(blocks)} blocks")

    def _advance(self) -> list[ChainEvent]:
        blocks = self.cursor.load()
        if not blocks:  # the base: the block before the first one processed, to find ancestors from
            base = max(self.start_block - 1, 0)
            blocks = [(base, self._block_hash(base))]
            self.cursor.save(blocks)
        start = blocks[-1][0] + 1
        safe = int(self.w3.eth.block_number) - self.confirmations
        out: list[ChainEvent] = []
        while start <= safe:
            end = min(safe, start + self.chunk - 1)
            hashes = {n: self._block_hash(n) for n in range(max(start, end - self.safety_window + 1), end + 1)}
            logs = self.w3.eth.get_logs({"fromBlock": start, "toBlock": end, "address": self.contract.address})
            batch = []
            for entry in logs:
                number, block_hash = int(entry["blockNumber"]), str(Web3.to_hex(entry["blockHash"]))
                if number in hashes and hashes[number] != block_hash:
                    return out  # the chain moved under this poll: the next poll sees the reorg
                event = self._decode(entry)
                if event is not None and event.key not in self._seen:
                    batch.append(event)
            for event in batch:
                self._remember(event)
            out.extend(batch)
            blocks = (blocks + sorted(hashes.items()))[-self.safety_window:]
            self.cursor.save(blocks)
            start = end + 1
        return out

    def _decode(self, entry: Any) -> ChainEvent | None:
        topics = entry["topics"]
        decoder = self._decoders.get(bytes(topics[0])) if topics else None
        if decoder is None:
            return None
        decoded = decoder.process_log(entry)
        args = decoded["args"]  # an AttributeDict: an event argument named "keys" shadows its .keys()
        return ChainEvent(str(decoded["event"]), {name: args[name] for name in args}, int(entry["blockNumber"]),
                          str(Web3.to_hex(entry["blockHash"])), str(Web3.to_hex(entry["transactionHash"])),
                          int(entry["logIndex"]))

    def _remember(self, event: ChainEvent) -> None:
        self._seen[event.key] = None
        while len(self._seen) > 100_000:
            self._seen.popitem(last=False)

    async def run(self, handle: Callable[[list[ChainEvent], Reorg | None], Awaitable[None]],
                  interval: float = 1.0, ws_url: str | None = None, stop: asyncio.Event | None = None) -> None:
        """Poll forever (woken by new heads over WebSocket when available), handing batches to `handle`."""
        stop = stop or asyncio.Event()
        wake = asyncio.Event()
        heads = asyncio.create_task(_watch_heads(ws_url, wake, stop, self.heads_live)) if ws_url else None
        backoff = interval
        try:
            while not stop.is_set():
                wake.clear()  # before polling: a head that arrives during the poll wakes the next one
                try:
                    events, reorg = await asyncio.to_thread(self.poll)
                    backoff = interval
                    if events or reorg:
                        await handle(events, reorg)
                except ChainUnavailable as exc:
                    log.warning("rpc unavailable, retrying", extra={"error": str(exc), "in_s": backoff})
                    backoff = min(backoff * 2, 30.0)
                await _wait_any(wake, stop, timeout=backoff)
        finally:
            if heads:
                heads.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await heads


async def _wait_any(*events: asyncio.Event, timeout: float) -> None:
    """Return when any of `events` is set or `timeout` seconds have passed."""
    waiters = [asyncio.create_task(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()


async def _watch_heads(ws_url: str, wake: asyncio.Event, stop: asyncio.Event, live: asyncio.Event) -> None:
    """Set `wake` on every new head; on any WebSocket failure fall back to polling and retry later."""
    from web3 import AsyncWeb3, WebSocketProvider

    while not stop.is_set():
        try:
            async with AsyncWeb3(WebSocketProvider(ws_url)) as w3:
                await w3.eth.subscribe("newHeads")
                live.set()
                wake.set()  # one catch-up poll for heads that arrived while connecting
                async for _ in w3.socket.process_subscriptions():
                    wake.set()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the HTTP poll keeps working meanwhile
            log.info("websocket unavailable, polling", extra={"error": str(exc)})
        finally:
            live.clear()
        await asyncio.sleep(5.0)

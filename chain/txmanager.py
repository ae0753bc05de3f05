"""Transactions that survive crashes: journal the signed bytes first, send second, confirm N deep.

Rules (the issue's, Lighthouse's): the signed raw transaction is persisted (synced) before it is
sent; a restart re-sends exactly those bytes; one nonce at a time per account, tracked locally; a
stuck transaction is replaced at the same nonce with fees raised by `bump` (at least the 10 %
nodes require) up to `max_fee_cap`; "nonce too low" or "already known" hands the nonce to the
confirmer, which looks for the receipt of any transaction this journal signed at that nonce.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from eth_account.signers.local import LocalAccount
from web3 import Web3
from web3.exceptions import TransactionNotFound
from web3.types import TxReceipt

from chain.contracts import translate_error
from chain.errors import ChainError

log = logging.getLogger(__name__)
PENDING, CONFIRMED, FAILED = "pending", "confirmed", "failed"


class TxJournal(Protocol):
    """Durable storage of signed transactions by nonce (the node's LevelDB)."""

    def journal_put(self, nonce: int, entry: dict[str, Any]) -> None:
        """Persist (synced) the entry of a nonce."""

    def journal_get(self, nonce: int) -> dict[str, Any] | None:
        """Return the entry of a nonce."""

    def journal_entries(self) -> list[dict[str, Any]]:
        """Return every entry by nonce."""


class MemoryJournal:
    """A TxJournal in memory (tests)."""

    def __init__(self) -> None:
        self.entries: dict[int, dict[str, Any]] = {}

    def journal_put(self, nonce: int, entry: dict[str, Any]) -> None:
        """Keep an entry."""
        self.entries[nonce] = dict(entry)

    def journal_get(self, nonce: int) -> dict[str, Any] | None:
        """Return an entry."""
        return dict(self.entries[nonce]) if nonce in self.entries else None

    def journal_entries(self) -> list[dict[str, Any]]:
        """Return the entries by nonce."""
        return [dict(self.entries[n]) for n in sorted(self.entries)]


class TxFailed(ChainError):
    """A transaction was mined and reverted, or could not be placed within the fee cap."""

    code = "tx_failed"


@dataclass
class TxManager:
    """Sends one account's transactions through a journal."""

    w3: Web3
    account: LocalAccount
    journal: TxJournal
    confirmations: int = 1
    bump: float = 1.125
    gas_margin: float = 1.5
    max_fee_cap: int = 500 * 10**9
    # one nonce per transaction even when several threads send (a daemon's quorum and fraud-proof duties)
    _lock: threading.RLock = field(default_factory=threading.RLock, repr=False, compare=False)

    def next_nonce(self) -> int:
        """Return the next nonce: past both the chain's pending count and every journaled nonce."""
        chain = int(self.w3.eth.get_transaction_count(self.account.address, "pending"))
        journaled = [int(e["nonce"]) + 1 for e in self.journal.journal_entries()]
        return max([chain, *journaled])

    def prepare(self, fn: Any, value: int = 0, purpose: str = "") -> dict[str, Any]:
        """Sign a contract call at the next nonce and journal it (synced) without sending."""
        with self._lock:
            return self._prepare(fn, value, purpose)

    def _prepare(self, fn: Any, value: int, purpose: str) -> dict[str, Any]:
        try:
            nonce = self.next_nonce()
            tx = fn.build_transaction({"from": self.account.address, "value": value, "nonce": nonce})
            # the estimate holds for today's state; a transaction mined after another one (a second
            # vote that now completes a quorum) may need more: leave headroom, unused gas is refunded
            tx["gas"] = int(int(tx["gas"]) * self.gas_margin) + 30_000
        except Exception as exc:
            raise translate_error(exc) from exc
        signed = self.account.sign_transaction(tx)
        entry = {"nonce": nonce, "purpose": purpose, "status": PENDING, "tx": _jsonable(tx),
                 "raw": [Web3.to_hex(signed.raw_transaction)], "hashes": [Web3.to_hex(signed.hash)]}
        self.journal.journal_put(nonce, entry)
        return entry

    def send(self, fn: Any, value: int = 0, purpose: str = "") -> dict[str, Any]:
        """Journal then broadcast a contract call; return its journal entry."""
        with self._lock:
            entry = self.prepare(fn, value, purpose)
            self._broadcast(entry["raw"][-1])
            return entry

    def resume(self) -> list[dict[str, Any]]:
        """After a restart: re-send every pending journaled transaction, byte for byte."""
        pending = [e for e in self.journal.journal_entries() if e["status"] == PENDING]
        for entry in pending:
            self._broadcast(entry["raw"][-1])
        return pending

    def bump_fees(self, nonce: int) -> dict[str, Any]:
        """Replace a stuck transaction at the same nonce with fees raised by `bump` (up to the cap)."""
        with self._lock:
            return self._bump_fees(nonce)

    def _bump_fees(self, nonce: int) -> dict[str, Any]:
        entry = self.journal.journal_get(nonce)
        if entry is None or entry["status"] != PENDING:
            raise TxFailed(f"no pending transaction at nonce {nonce}")
        tx = {k: (int(v) if k in _INT_FIELDS else v) for k, v in entry["tx"].items()}
        tip = int(tx["maxPriorityFeePerGas"] * self.bump) + 1
        fee = int(tx["maxFeePerGas"] * self.bump) + 1
        if fee > self.max_fee_cap:
            raise TxFailed(f"nonce {nonce}: fee {fee} would exceed the cap {self.max_fee_cap}")
        tx.update(maxPriorityFeePerGas=tip, maxFeePerGas=fee)
        signed = self.account.sign_transaction(tx)
        entry["tx"] = _jsonable(tx)
        entry["raw"].append(Web3.to_hex(signed.raw_transaction))
        entry["hashes"].append(Web3.to_hex(signed.hash))
        self.journal.journal_put(nonce, entry)  # record before send, as always
        self._broadcast(entry["raw"][-1])
        log.info("fee bumped", extra={"nonce": nonce, "max_fee": fee})
        return entry

    def confirm(self, nonce: int, timeout: float = 60.0, poll: float = 0.2) -> TxReceipt:
        """Wait until one of the nonce's transactions is `confirmations` deep; return its receipt."""
        deadline = time.monotonic() + timeout
        while True:
            entry = self.journal.journal_get(nonce)
            if entry is None:
                raise TxFailed(f"nothing journaled at nonce {nonce}")
            receipt = self._find_receipt(entry["hashes"])
            if receipt is not None:
                depth = int(self.w3.eth.block_number) - int(receipt["blockNumber"]) + 1
                if depth >= self.confirmations:
                    entry["status"] = CONFIRMED if receipt["status"] == 1 else FAILED
                    entry["mined"] = Web3.to_hex(receipt["transactionHash"])
                    self.journal.journal_put(nonce, entry)
                    if receipt["status"] != 1:
                        raise TxFailed(f"nonce {nonce} reverted on chain ({entry['purpose']})")
                    return receipt
            if time.monotonic() > deadline:
                raise TxFailed(f"nonce {nonce} not confirmed within {timeout} s")
            time.sleep(poll)

    def _find_receipt(self, hashes: Sequence[str]) -> TxReceipt | None:
        for tx_hash in reversed(hashes):
            try:
                return self.w3.eth.get_transaction_receipt(tx_hash)  # type: ignore[arg-type]
            except TransactionNotFound:
                continue
        return None

    def _broadcast(self, raw: str) -> None:
        try:
            self.w3.eth.send_raw_transaction(raw)  # type: ignore[arg-type]
        except Exception as exc:
            text = str(exc).lower()
            if "nonce too low" in text or "already known" in text or "already imported" in text:
                log.info("transaction already placed; the confirmer takes it", extra={"error": str(exc)})
                return
            raise translate_error(exc) from exc


_INT_FIELDS = ("value", "gas", "maxFeePerGas", "maxPriorityFeePerGas", "nonce", "chainId")


def _jsonable(tx: Any) -> dict[str, Any]:
    return {k: (Web3.to_hex(v) if isinstance(v, bytes) else str(v) if k in _INT_FIELDS else v) for k, v in tx.items()}

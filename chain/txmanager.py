"""Transactions that survive crashes: journal the signed bytes first, send second, confirm N deep.

Rules (the issue's, Lighthouse's, Chainlink txmgr's): every signed attempt is persisted (synced)
before it is sent; a restart re-sends exactly those bytes; nonces are handed out once per account,
tracked locally, and never skipped nor reused. While a caller waits in `confirm`, `process_pending`
tends the account's journal:

- a nonce gap (a journaled transaction the node does not know: its broadcast failed, the node
  dropped it, its mempool restarted) is refilled with the journaled bytes; a transaction that can
  no longer be sent (the node refuses it for good, or, being the next nonce to mine, it would now
  revert) is replaced by a zero-value self-transfer (a no-op) so that later nonces can be mined; a
  nonce below ours that nothing in the journal or the node's pool holds is filled the same way;
- a transaction not mined `stuck_blocks` blocks or `stuck_seconds` seconds after it was signed, or
  refused as underpriced, is re-signed at the same nonce with both fees raised by `bump` (never less
  than the +10 % nodes require for a replacement) and at least twice the base fee, up to `max_fee_cap`;
- "nonce too low" or "already known" hands the nonce to the confirmer, which takes the receipt of
  whichever attempt at that nonce was mined.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from eth_account.signers.local import LocalAccount
from web3 import Web3
from web3.exceptions import TransactionNotFound, Web3RPCError
from web3.types import TxReceipt

from chain.contracts import revert_from_exception, translate_error
from chain.errors import ChainError

log = logging.getLogger(__name__)
PENDING, CONFIRMED, FAILED, FILLED = "pending", "confirmed", "failed", "filled"
ORIGINAL, BUMP, NOOP = "original", "bump", "noop"  # kinds of attempt at one nonce
PLACED, RETRY, UNDERPRICED, REFUSED = "placed", "retry", "underpriced", "refused"  # a node's answer to a send
REPLACEMENT_MIN_PERCENT = 10  # geth and anvil refuse a replacement that raises either fee by less
NOOP_GAS = 21_000
MAX_REPRICES_PER_SEND = 3

_PLACED_TEXT = ("nonce too low", "already known", "already imported", "known transaction")
_UNDERPRICED_TEXT = ("underpriced", "less than block base fee", "fee too low", "gas price too low", "fee cap too low")
_REFUSED_TEXT = ("insufficient funds", "intrinsic gas", "exceeds block gas limit", "invalid sender",
                 "invalid signature", "invalid chain id", "oversized data", "max initcode size")


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
    """A transaction reverted, was replaced (by a no-op or a foreign transaction) or did not confirm in time."""

    code = "tx_failed"


class ChainView(NamedTuple):
    """What one pass of `process_pending` reads from the node about the account."""

    mined: int  # transactions mined (the "latest" nonce)
    pooled: int  # the node's "pending" nonce: mined plus the gapless run of its pool
    block: int
    base_fee: int


@dataclass
class TxManager:
    """Sends one account's transactions through a journal; refills nonce gaps and re-prices stuck ones."""

    w3: Web3
    account: LocalAccount
    journal: TxJournal
    confirmations: int = 1
    bump: float = 1.125
    gas_margin: float = 1.5
    max_fee_cap: int = 500 * 10**9
    stuck_blocks: int = 3  # re-price an attempt still unmined this many blocks after it was signed
    stuck_seconds: float = 60.0  # ... or this many seconds after (wall clock: it survives restarts)
    # one nonce per transaction even when several threads send (a daemon's quorum and fraud-proof duties)
    _lock: threading.RLock = field(default_factory=threading.RLock, repr=False, compare=False)

    # ---- sending ------------------------------------------------------------------------------

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
            block = int(self.w3.eth.block_number)
        except Exception as exc:
            raise translate_error(exc) from exc
        entry: dict[str, Any] = {"nonce": nonce, "purpose": purpose, "status": PENDING, "tx": {}, "raw": [],
                                 "hashes": [], "attempts": []}
        self._sign_attempt(entry, dict(tx), ORIGINAL, block)
        self.journal.journal_put(nonce, entry)
        return entry

    def send(self, fn: Any, value: int = 0, purpose: str = "") -> dict[str, Any]:
        """Journal then broadcast a contract call; return its journal entry.

        A broadcast that fails for a passing reason (RPC down, timeout) leaves the transaction
        journaled: `confirm` and `process_pending` send it again. One the node refuses for good is
        replaced by a no-op at its nonce (so later transactions still mine) and raises TxFailed.
        """
        with self._lock:
            entry = self._prepare(fn, value, purpose)
            try:
                outcome = self._push(entry)
            except Exception as exc:  # the node went away while re-pricing: journaled, tended later
                entry["last_error"], outcome = str(translate_error(exc)), RETRY
            if entry.get("filled"):
                raise TxFailed(f"nonce {entry['nonce']} refused by the node ({entry.get('last_error')}); "
                               f"filled with a no-op ({purpose})")
            if outcome != PLACED:
                log.warning("transaction journaled but not placed yet; it is retried",
                            extra={"nonce": entry["nonce"], "outcome": outcome, "error": entry.get("last_error")})
            return entry

    def resume(self) -> list[dict[str, Any]]:
        """After a restart: re-send every pending journaled transaction, byte for byte.

        The next nonce to mine is first simulated: if it would now revert, a no-op takes its place.
        Refused or underpriced ones are filled or re-priced as in `process_pending`.
        """
        with self._lock:
            pending = [e for e in self.journal.journal_entries() if e["status"] == PENDING]
            self._tend(pending, resend_all=True)
            return pending

    def bump_fees(self, nonce: int) -> dict[str, Any]:
        """Replace a pending transaction at the same nonce with fees raised by `bump` (up to the cap)."""
        with self._lock:
            entry = self.journal.journal_get(nonce)
            if entry is None or entry["status"] != PENDING:
                raise TxFailed(f"no pending transaction at nonce {nonce}")
            try:
                base_fee = int(self.w3.eth.get_block("latest").get("baseFeePerGas", 0))
                if not self._resign(entry, BUMP, base_fee):
                    raise TxFailed(f"nonce {nonce}: a fee {REPLACEMENT_MIN_PERCENT} % higher would exceed the cap "
                                   f"{self.max_fee_cap}")
                self._push(entry)
            except Exception as exc:
                raise translate_error(exc) from exc
            return entry

    # ---- tending the journal ------------------------------------------------------------------

    def process_pending(self) -> list[dict[str, Any]]:
        """Refill nonce gaps and re-price stuck transactions; return the entries acted on."""
        with self._lock:
            pending = [e for e in self.journal.journal_entries() if e["status"] == PENDING]
            return self._tend(pending, resend_all=False)

    def _tend(self, pending: list[dict[str, Any]], resend_all: bool) -> list[dict[str, Any]]:
        if not pending:
            return []
        try:
            view = self._read_chain()
            acted: list[dict[str, Any]] = []
            gap_below = False  # a later transaction cannot mine before a gap is refilled: do not re-price it
            for entry in pending:
                nonce = int(entry["nonce"])
                if nonce < view.mined:
                    self._settle(entry, view)
                elif resend_all or not self._is_known(entry):
                    gap_below = True
                    self._refill(entry, view)
                    acted.append(entry)
                elif not gap_below and self._is_stuck(entry, view):
                    if self._resign(entry, BUMP, view.base_fee):
                        log.info("stuck transaction re-priced", extra=_summary(entry))
                        self._push(entry)
                        acted.append(entry)
            filler = self._fill_unjournaled_gap(pending, view)
            return acted + ([filler] if filler is not None else [])
        except Exception as exc:
            raise translate_error(exc) from exc

    def _read_chain(self) -> ChainView:
        address = self.account.address
        mined = int(self.w3.eth.get_transaction_count(address, "latest"))
        pooled = int(self.w3.eth.get_transaction_count(address, "pending"))
        block = self.w3.eth.get_block("latest")
        return ChainView(mined, pooled, int(block["number"]), int(block.get("baseFeePerGas", 0)))

    def _settle(self, entry: dict[str, Any], view: ChainView) -> None:
        """Record how a nonce the chain has used ended: our attempt's receipt, or replaced by a foreign one."""
        receipt = self._find_receipt(entry["hashes"])
        if receipt is None:
            entry.update(status=FAILED, replaced=True)
            self.journal.journal_put(int(entry["nonce"]), entry)
            log.warning("nonce used by a transaction this journal did not sign", extra=_summary(entry))
        elif view.block - int(receipt["blockNumber"]) + 1 >= self.confirmations:
            self._record_mined(entry, receipt)

    def _is_known(self, entry: dict[str, Any]) -> bool:
        """Check whether the node holds (in its pool or a block) any attempt at this entry's nonce."""
        for tx_hash in reversed(entry["hashes"]):
            try:
                if self.w3.eth.get_transaction(tx_hash) is not None:
                    return True
            except TransactionNotFound:
                continue
        return False

    def _is_stuck(self, entry: dict[str, Any], view: ChainView) -> bool:
        """Check whether the latest attempt has waited `stuck_blocks` blocks or `stuck_seconds` seconds."""
        last = _last_attempt(entry)
        if last is None:  # journaled by an older version: start its clock now
            entry.setdefault("attempts", []).append(_attempt_record(entry["hashes"][-1], entry["tx"], ORIGINAL,
                                                                    view.block))
            self.journal.journal_put(int(entry["nonce"]), entry)
            return False
        return (view.block - int(last["block"]) >= self.stuck_blocks
                or time.time() - float(last["time"]) >= self.stuck_seconds)

    def _refill(self, entry: dict[str, Any], view: ChainView) -> None:
        """Put a journaled transaction the node does not hold back in its pool, or fill its nonce."""
        if int(entry["nonce"]) == view.mined and not entry.get("filled") and self._would_revert(entry):
            entry["last_error"] = "reverts in the current state"
            self._resign(entry, NOOP, view.base_fee)
            log.warning("a dropped transaction would now revert; its nonce is filled with a no-op",
                        extra=_summary(entry))
        else:
            entry["resent"] = int(entry.get("resent", 0)) + 1
            self.journal.journal_put(int(entry["nonce"]), entry)
            log.info("nonce gap: re-sending the journaled transaction", extra=_summary(entry))
        self._push(entry)

    def _would_revert(self, entry: dict[str, Any]) -> bool:
        """Simulate a journaled contract call on the latest state; True if it reverts."""
        tx = _typed(entry["tx"])
        if not tx.get("to"):
            return False
        call = {"from": self.account.address, "to": tx["to"], "value": tx.get("value", 0), "gas": tx["gas"],
                "data": tx.get("data", "0x")}
        try:
            self.w3.eth.call(call, "latest")  # type: ignore[arg-type]
        except Exception as exc:
            if revert_from_exception(exc) is not None:
                return True
            raise
        return False

    def _fill_unjournaled_gap(self, pending: list[dict[str, Any]], view: ChainView) -> dict[str, Any] | None:
        """Fill a nonce below our pending ones that neither the journal nor the node's pool holds."""
        top = max(int(e["nonce"]) for e in pending)
        gap = view.pooled
        if not view.mined <= gap < top or self.journal.journal_get(gap) is not None:
            return None
        entry: dict[str, Any] = {"nonce": gap, "purpose": "nonce gap fill", "status": PENDING, "tx": {},
                                 "raw": [], "hashes": [], "attempts": []}
        self._resign(entry, NOOP, view.base_fee)
        log.warning("a nonce gap no journal entry explains; filled with a no-op", extra=_summary(entry))
        self._push(entry)
        return entry

    def cancel(self, nonce: int) -> bool:
        """Replace the journaled, still pending transaction at `nonce` by a no-op (signed and journaled, synced,
        before anything is sent; `resume` broadcasts it). Return False if there is none or the fee cap is reached."""
        with self._lock:
            entry = self.journal.journal_get(nonce)
            if entry is None or entry["status"] != PENDING:
                return False
            base_fee = int(self.w3.eth.get_block("latest").get("baseFeePerGas", 0))
            return self._resign(entry, NOOP, base_fee)

    # ---- signing and broadcasting attempts ----------------------------------------------------

    def _resign(self, entry: dict[str, Any], kind: str, base_fee: int) -> bool:
        """Sign and journal (synced) a new attempt at the entry's nonce: a fee bump or a no-op."""
        old = _typed(entry["tx"]) if entry["tx"] else None
        fees = self._raised_fees(old, base_fee, strict=kind == BUMP)
        if fees is None:
            if not entry.get("capped"):
                entry["capped"] = True
                self.journal.journal_put(int(entry["nonce"]), entry)
                log.warning("fee cap reached: the transaction is left as it is", extra=_summary(entry))
            return False
        tip, fee = fees
        if kind == BUMP and old is not None:
            tx = dict(old)
        else:
            chain_id = int(old["chainId"]) if old and "chainId" in old else int(self.w3.eth.chain_id)
            tx = {"from": self.account.address, "to": self.account.address, "value": 0, "gas": NOOP_GAS,
                  "data": "0x", "nonce": int(entry["nonce"]), "chainId": chain_id}
            entry["filled"] = True
        if tx.pop("gasPrice", None) is not None:  # a legacy transaction is replaced by a dynamic-fee one
            tx.pop("type", None)
        tx.update(maxPriorityFeePerGas=tip, maxFeePerGas=fee)
        self._sign_attempt(entry, tx, kind, int(self.w3.eth.block_number))
        self.journal.journal_put(int(entry["nonce"]), entry)  # record before send, as always
        log.info("attempt signed", extra=_summary(entry))
        return True

    def _raised_fees(self, old: dict[str, Any] | None, base_fee: int, strict: bool) -> tuple[int, int] | None:
        """Return (tip, max fee) for a replacement: past the node's minimum raise and twice the base fee,
        within the cap; None when a strict bump cannot meet the minimum within the cap."""
        if old is None:  # nothing of ours to replace: today's fees
            tip = int(self.w3.eth.max_priority_fee)
            fee = min(2 * base_fee + tip, self.max_fee_cap)
            return min(tip, fee), fee
        old_fee = int(old.get("maxFeePerGas", old.get("gasPrice", 0)))
        old_tip = int(old.get("maxPriorityFeePerGas", old.get("gasPrice", 0)))
        tip = max(math.ceil(old_tip * self.bump), _minimum_raise(old_tip))
        fee = min(max(math.ceil(old_fee * self.bump), _minimum_raise(old_fee), 2 * base_fee + tip), self.max_fee_cap)
        tip = min(tip, fee)
        if strict and (fee < _minimum_raise(old_fee) or tip < _minimum_raise(old_tip)):
            return None
        return tip, fee

    def _sign_attempt(self, entry: dict[str, Any], tx: dict[str, Any], kind: str, block: int) -> None:
        signed = self.account.sign_transaction(tx)
        tx_hash = Web3.to_hex(signed.hash)
        entry["tx"] = _jsonable(tx)
        entry["raw"].append(Web3.to_hex(signed.raw_transaction))
        entry["hashes"].append(tx_hash)
        entry.setdefault("attempts", []).append(_attempt_record(tx_hash, entry["tx"], kind, block))

    def _push(self, entry: dict[str, Any]) -> str:
        """Broadcast the entry's latest attempt; re-price it if underpriced, fill its nonce if refused."""
        outcome = RETRY
        for _ in range(MAX_REPRICES_PER_SEND):
            outcome, error = self._broadcast(entry["raw"][-1])
            if outcome == PLACED:
                return outcome
            entry["last_error"] = error
            entry["failed_sends"] = int(entry.get("failed_sends", 0)) + 1
            self.journal.journal_put(int(entry["nonce"]), entry)
            log.warning("broadcast failed", extra={**_summary(entry), "outcome": outcome, "error": error})
            if outcome == RETRY or (outcome == REFUSED and entry.get("filled")):
                return outcome
            base_fee = int(self.w3.eth.get_block("latest").get("baseFeePerGas", 0))
            if not self._resign(entry, BUMP if outcome == UNDERPRICED else NOOP, base_fee):
                return outcome
        return outcome

    def _broadcast(self, raw: str) -> tuple[str, str]:
        """Send signed bytes; return how the node answered (placed, retry, underpriced, refused) and why."""
        try:
            self.w3.eth.send_raw_transaction(raw)  # type: ignore[arg-type]
        except Exception as exc:
            outcome = classify_send_error(exc)
            if outcome == PLACED:
                log.info("transaction already placed; the confirmer takes it", extra={"error": str(exc)})
                return PLACED, ""
            return outcome, f"{type(exc).__name__}: {exc}"
        return PLACED, ""

    # ---- confirming -----------------------------------------------------------------------------

    def confirm(self, nonce: int, timeout: float = 60.0, poll: float = 0.2) -> TxReceipt:
        """Wait until one of the nonce's attempts is `confirmations` deep; return its receipt.

        While waiting, the journal is tended (gaps refilled, stuck attempts re-priced); a nonce that
        was filled with a no-op or taken by a foreign transaction raises TxFailed.
        """
        deadline = time.monotonic() + timeout
        while True:
            try:
                receipt = self._confirm_step(nonce)
            except TxFailed:
                raise
            except Exception as exc:
                error = translate_error(exc)
                if not error.recoverable:
                    raise error from exc
                log.warning("confirm: chain read failed; retrying", extra={"nonce": nonce, "error": str(error)})
                receipt = None  # a passing RPC failure: keep trying until the deadline
            if receipt is not None:
                return receipt
            if time.monotonic() > deadline:
                raise TxFailed(f"nonce {nonce} not confirmed within {timeout} s")
            time.sleep(poll)

    def _confirm_step(self, nonce: int) -> TxReceipt | None:
        entry = self.journal.journal_get(nonce)
        if entry is None:
            raise TxFailed(f"nothing journaled at nonce {nonce}")
        receipt = self._find_receipt(entry["hashes"])
        if receipt is None:
            if entry.get("replaced"):
                raise TxFailed(f"nonce {nonce} was used by a transaction this journal did not sign")
            self.process_pending()
            return None
        if int(self.w3.eth.block_number) - int(receipt["blockNumber"]) + 1 < self.confirmations:
            return None
        with self._lock:
            entry = self.journal.journal_get(nonce) or entry
            status = self._record_mined(entry, receipt)
        if status == FILLED:
            raise TxFailed(f"nonce {nonce} was filled with a no-op; the call was not executed ({entry['purpose']})")
        if status != CONFIRMED:
            raise TxFailed(f"nonce {nonce} reverted on chain ({entry['purpose']})")
        return receipt

    def _record_mined(self, entry: dict[str, Any], receipt: TxReceipt) -> str:
        mined = Web3.to_hex(receipt["transactionHash"])
        kinds = {a["hash"]: a["kind"] for a in entry.get("attempts", [])}
        status = FILLED if kinds.get(mined) == NOOP else CONFIRMED if receipt["status"] == 1 else FAILED
        if entry["status"] != status or entry.get("mined") != mined:
            entry.update(status=status, mined=mined)
            self.journal.journal_put(int(entry["nonce"]), entry)
        return status

    def _find_receipt(self, hashes: Sequence[str]) -> TxReceipt | None:
        for tx_hash in reversed(hashes):
            try:
                return self.w3.eth.get_transaction_receipt(tx_hash)  # type: ignore[arg-type]
            except TransactionNotFound:
                continue
        return None


def classify_send_error(exc: BaseException) -> str:
    """Return what a failed eth_sendRawTransaction means: placed, retry, underpriced or refused."""
    text = str(exc).lower()
    if any(s in text for s in _PLACED_TEXT):
        return PLACED
    if not isinstance(exc, Web3RPCError):  # no answer (connection, timeout, HTTP status): try again
        return RETRY
    if any(s in text for s in _UNDERPRICED_TEXT):
        return UNDERPRICED
    if any(s in text for s in _REFUSED_TEXT):
        return REFUSED
    return RETRY  # an answer we do not know: sending the same bytes again is always safe


def _minimum_raise(old: int) -> int:
    """Return the smallest value a replacement node accepts in place of `old` (+10 %, at least +1)."""
    return old + max(1, math.ceil(old * REPLACEMENT_MIN_PERCENT / 100))


def _last_attempt(entry: dict[str, Any]) -> dict[str, Any] | None:
    attempts = entry.get("attempts") or []
    return attempts[-1] if attempts and attempts[-1]["hash"] == entry["hashes"][-1] else None


def _attempt_record(tx_hash: str, tx: dict[str, Any], kind: str, block: int) -> dict[str, Any]:
    return {"kind": kind, "hash": tx_hash, "max_fee": str(tx.get("maxFeePerGas", tx.get("gasPrice", 0))),
            "tip": str(tx.get("maxPriorityFeePerGas", tx.get("gasPrice", 0))), "block": block, "time": time.time()}


def _summary(entry: dict[str, Any]) -> dict[str, Any]:
    return {"nonce": entry["nonce"], "purpose": entry.get("purpose", ""), "attempts": len(entry["hashes"]),
            "tx_hash": entry["hashes"][-1] if entry["hashes"] else ""}


_INT_FIELDS = ("value", "gas", "maxFeePerGas", "maxPriorityFeePerGas", "gasPrice", "nonce", "chainId")


def _typed(tx: dict[str, Any]) -> dict[str, Any]:
    return {k: (int(v) if k in _INT_FIELDS else v) for k, v in tx.items()}


def _jsonable(tx: Any) -> dict[str, Any]:
    return {k: (Web3.to_hex(v) if isinstance(v, bytes) else str(v) if k in _INT_FIELDS else v) for k, v in tx.items()}

"""The prover's ledger on disk (LevelDB): entries that chain, each with its EIP-712 signed head.

An entry is accepted only if it chains onto the stored head at the next step; it is written with its
signature and the new head in one synced batch, so a refused or interrupted write leaves nothing.
Auditors keep the nonces they have issued here too: a replayed nonce is refused.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import plyvel
from eth_account import Account
from eth_account.messages import encode_typed_data
from eth_account.signers.local import LocalAccount

from node.errors import FatalError, Reason
from node.protocol.ledger import (
    InvalidTraining,
    LedgerEntry,
    TrainingReason,
    compute_genesis_head,
    verify_entry_link,
)

log = logging.getLogger(__name__)
HEAD_FIELDS = [{"name": "runId", "type": "bytes32"}, {"name": "step", "type": "uint64"},
               {"name": "head", "type": "bytes32"}]


def compute_head_typed_data(run_id: bytes, step: int, head: bytes) -> dict[str, Any]:
    """Return the EIP-712 typed data `LedgerHead(bytes32 runId, uint64 step, bytes32 head)`."""
    return {"types": {"EIP712Domain": [{"name": "name", "type": "string"}, {"name": "version", "type": "string"}],
                      "LedgerHead": HEAD_FIELDS},
            "primaryType": "LedgerHead", "domain": {"name": "verinfer-training", "version": "1"},
            "message": {"runId": run_id, "step": step, "head": head}}


def sign_head(account: LocalAccount, run_id: bytes, step: int, head: bytes) -> bytes:
    """Return the prover's 65-byte signature of a ledger head."""
    msg = encode_typed_data(full_message=compute_head_typed_data(run_id, step, head))
    return bytes(account.sign_message(msg).signature)


def recover_head_signer(run_id: bytes, step: int, head: bytes, signature: bytes) -> str:
    """Return the address that signed a ledger head."""
    msg = encode_typed_data(full_message=compute_head_typed_data(run_id, step, head))
    address: str = Account.recover_message(msg, signature=signature)
    return address


def encode_entry(entry: LedgerEntry, signature: bytes) -> bytes:
    """Return the JSON bytes of a stored entry."""
    d = {k: v for k, v in entry.__dict__.items()}
    for k in ("run_id", "prev_head", "state_root", "head"):
        d[k] = d[k].hex()
    d["batch_roots"] = [r.hex() for r in entry.batch_roots]
    d["signature"] = signature.hex()
    return json.dumps(d, allow_nan=True).encode()


def decode_entry(raw: bytes) -> tuple[LedgerEntry, bytes]:
    """Return (entry, signature) from stored JSON, refusing malformed records."""
    try:
        d = json.loads(raw)
        sig = bytes.fromhex(d.pop("signature"))
        for k in ("run_id", "prev_head", "state_root", "head"):
            d[k] = bytes.fromhex(d[k])
        d["batch_roots"] = tuple(bytes.fromhex(r) for r in d["batch_roots"])
        for k in ("positions", "values", "lsh"):
            d[k] = tuple(d[k])
        d["replica_lsh"] = tuple(tuple(r) for r in d["replica_lsh"])
        return LedgerEntry(**d), sig
    except (ValueError, KeyError, TypeError) as e:
        raise InvalidTraining(f"stored ledger entry is malformed: {e}", TrainingReason.LEDGER_MALFORMED) from e


class LedgerStore:
    """One run's ledger in LevelDB: step/<t:020d> → entry JSON, meta/head → (step, head)."""

    def __init__(self, path: Path, run_id: bytes) -> None:
        try:
            self.db = plyvel.DB(str(path), create_if_missing=True)
        except plyvel.IOError as e:
            raise FatalError(f"ledger {path} is owned by another process", Reason.STORE_LOCKED) from e
        self.run_id = run_id

    def close(self) -> None:
        """Close the database."""
        self.db.close()

    def get_head(self) -> tuple[int, bytes]:
        """Return (last step, its head), or (−1, genesis) for an empty ledger."""
        raw = self.db.get(b"meta/head")
        if raw is None:
            return -1, compute_genesis_head(self.run_id)
        step, head = json.loads(raw)
        return int(step), bytes.fromhex(head)

    def process_entry(self, entry: LedgerEntry, signature: bytes) -> None:
        """Append an entry that chains onto the stored head; refuse anything else and write nothing."""
        last, head = self.get_head()
        verify_entry_link(entry, head, last + 1)
        if entry.run_id != self.run_id:
            raise InvalidTraining("entry of another run", TrainingReason.LEDGER_NOT_CHAINED, entry.step)
        with self.db.write_batch(sync=True) as batch:
            batch.put(b"step/%020d" % entry.step, encode_entry(entry, signature))
            batch.put(b"meta/head", json.dumps([entry.step, entry.head.hex()]).encode())

    def get_entry(self, step: int) -> tuple[LedgerEntry, bytes]:
        """Return (entry, signature) of a step."""
        raw = self.db.get(b"step/%020d" % step)
        if raw is None:
            raise InvalidTraining(f"no ledger entry for step {step}", TrainingReason.LEDGER_STEP_GAP, step)
        return decode_entry(raw)

    def entries(self) -> list[LedgerEntry]:
        """Return every entry in step order."""
        return [decode_entry(v)[0] for _, v in self.db.iterator(prefix=b"step/")]


class NonceBook:
    """The auditor's issued nonces: each may start exactly one run."""

    def __init__(self, db: plyvel.DB) -> None:
        self.db = db

    def process_nonce(self, nonce: bytes, run_id: bytes) -> None:
        """Record a nonce for a run; the same pair again is fine, a nonce reused by another run is refused."""
        key = b"nonce/" + nonce
        seen = self.db.get(key)
        if seen is not None and seen != run_id:
            raise InvalidTraining(f"nonce {nonce.hex()[:16]}… already used by run {seen.hex()[:16]}…",
                                  TrainingReason.NONCE_REPLAYED)
        self.db.put(key, run_id, sync=True)

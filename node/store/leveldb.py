"""One LevelDB per node, owned by one process, namespaced by chain id and contract address.

Layout (every key under ``v1/<chain id>/<contract>/``):
  payload/<commitment>       cached payload bytes, keyed by the on-chain commitment, re-verified on read
  cursor/<name>              JSON [[block, hash], …]: the blocks a stream processed last (reorg detection)
  verdict/<inference id>     JSON of the verdict signed for it (slashing protection)
  tx/<nonce:020d>            JSON of a signed raw transaction and its state (the journal)
  record/<kind>/<id>         JSON facts the node keeps about inferences (e.g. the request, before its commit)
  job/<state>/<id>           JSON of a check in progress, one state at a time: pending → verified (with the
                             verdict record) → submitted; job/done/<id> (empty) once it ended, so that a
                             re-delivered event does not start it again
  vote/<id>/<signer>         JSON of a signed vote known for an inference (ours and gossiped), until it settles
  served/<inference id>      an executer's payload JSON of an inference it served (synced before its commit is sent)
  served-root/<root>         an executer's artifact wire bytes, by artifact root (written with its payload)
  served-moe/<inference id>  an MoE executer's trace of an inference (node.moe.serve), synced before its commit
and ``meta/identity`` = the chain id and contract this database belongs to (another is refused).
LevelDB's own LOCK file makes a second open fail: that is the single-instance lock. Slashing
records and journal entries are written with ``sync=True`` before anything leaves the process.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

import plyvel

from node.errors import FatalError, Reason

log = logging.getLogger(__name__)
IDENTITY_KEY = b"meta/identity"
JOB_STATES = ("pending", "verified", "submitted")
DONE = "done"


class StoreLocked(FatalError):
    """Another process owns this database."""


class StoreClosed(FatalError):
    """The store was closed (the node is shutting down); a late worker thread must not write."""


class StoreMismatch(FatalError):
    """The database belongs to another chain or contract."""


class ConflictingVerdict(FatalError):
    """Signing would contradict a verdict this node already signed for the inference."""


P = ParamSpec("P")
R = TypeVar("R")


def _locked(method: Callable[Concatenate[Store, P], R]) -> Callable[Concatenate[Store, P], R]:
    """Run a store method under the store's lock (no write can race a close)."""

    def wrapper(store: Store, /, *args: P.args, **kwargs: P.kwargs) -> R:
        with store._lock:
            return method(store, *args, **kwargs)

    wrapper.__doc__, wrapper.__name__ = method.__doc__, method.__name__
    return wrapper


@dataclass(frozen=True)
class VerdictRecord:
    """What this node signed (or is about to sign) for one inference."""

    inference_id: int
    artifact_root: str  # 0x-hex
    valid: bool
    reason: int
    scores_digest: str  # 0x-hex
    deadline: int

    def same_decision(self, other: VerdictRecord) -> bool:
        """Check whether two records decide the same (scores and deadline may differ: a re-run on other
        threads or hardware can move the scores in their last digits, never the decision)."""
        return (self.inference_id, self.artifact_root, self.valid, self.reason) == (
            other.inference_id, other.artifact_root, other.valid, other.reason)


@dataclass(frozen=True)
class ExpertVerdictRecord:
    """What this node signed (or is about to sign) for one MoE duty of one inference."""

    inference_id: int
    duty: int  # uint32 duty key (node.protocol.moe.compute_duty_key)
    moe_root: str  # 0x-hex
    valid: bool
    reason: int
    scores_digest: str  # 0x-hex

    def same_decision(self, other: ExpertVerdictRecord) -> bool:
        """Check whether two records decide the same (the scores may differ in their last digits)."""
        return (self.inference_id, self.duty, self.moe_root, self.valid, self.reason) == (
            other.inference_id, other.duty, other.moe_root, other.valid, other.reason)


class Store:
    """The node's database; use as a context manager or close()."""

    def __init__(self, path: Path, chain_id: int, contract: str) -> None:
        path.mkdir(parents=True, exist_ok=True)
        try:
            self._db = plyvel.DB(str(path), create_if_missing=True)
        except plyvel.IOError as exc:
            raise StoreLocked(f"{path} is in use by another process ({exc})", Reason.STORE_LOCKED) from exc
        identity = json.dumps({"chain_id": chain_id, "contract": contract.lower()}).encode()
        existing = self._db.get(IDENTITY_KEY)
        if existing is None:
            self._db.put(IDENTITY_KEY, identity, sync=True)
        elif existing != identity:
            self._db.close()
            raise StoreMismatch(f"{path} belongs to {existing.decode()}, not chain {chain_id} / {contract}",
                                Reason.STORE_MISMATCH)
        self._ns = self._db.prefixed_db(f"v1/{chain_id}/{contract.lower()}/".encode())
        self._lock = threading.RLock()

    @property
    def ns(self) -> Any:
        """Return the namespaced database, or raise StoreClosed (plyvel crashes on a closed handle)."""
        if self._db.closed:
            raise StoreClosed("the store is closed", Reason.STORE_LOCKED)
        return self._ns

    def close(self) -> None:
        """Close the database (releases the lock); waits for an operation in progress."""
        with self._lock:
            if not self._db.closed:
                self._db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- payload cache ---------------------------------------------------------------------

    @_locked
    def put_payload(self, commitment: bytes, payload: bytes) -> None:
        """Cache a payload that was checked against its on-chain commitment."""
        self.ns.put(b"payload/" + commitment, payload)

    @_locked
    def get_payload(self, commitment: bytes, is_valid: Callable[[bytes], bool]) -> bytes | None:
        """Return a cached payload if it still verifies; a corrupted entry is deleted and None returned."""
        raw = self.ns.get(b"payload/" + commitment)
        if raw is None:
            return None
        if not is_valid(raw):
            log.warning("corrupted cache entry dropped", extra={"commitment": commitment.hex()})
            self.ns.delete(b"payload/" + commitment, sync=True)
            return None
        return bytes(raw)

    # ---- an executer's served payloads --------------------------------------------------------

    @_locked
    def put_served(self, inference_id: int, payload: bytes, root: bytes | None = None, wire: bytes | None = None
                   ) -> None:
        """Persist (synced) the payload an executer serves for an inference, and its artifact wire bytes by root."""
        with self.ns.write_batch(sync=True) as batch:
            batch.put(_served_key(b"served/", inference_id), payload)
            if root is not None and wire is not None:
                batch.put(b"served-root/" + root, wire)

    @_locked
    def get_served(self, inference_id: int) -> bytes | None:
        """Return the payload an executer stored for an inference."""
        raw = self.ns.get(_served_key(b"served/", inference_id))
        return None if raw is None else bytes(raw)

    @_locked
    def get_served_wire(self, root: bytes) -> bytes | None:
        """Return the artifact wire bytes an executer stored under an artifact root."""
        raw = self.ns.get(b"served-root/" + root)
        return None if raw is None else bytes(raw)

    @_locked
    def put_served_moe(self, inference_id: int, blob: bytes) -> None:
        """Persist (synced) an MoE executer's trace of an inference."""
        self.ns.put(_served_key(b"served-moe/", inference_id), blob, sync=True)

    @_locked
    def get_served_moe(self, inference_id: int) -> bytes | None:
        """Return an MoE executer's stored trace of an inference."""
        raw = self.ns.get(_served_key(b"served-moe/", inference_id))
        return None if raw is None else bytes(raw)

    # ---- cursors ------------------------------------------------------------------------------

    @_locked
    def get_cursor(self, name: str) -> list[tuple[int, str]]:
        """Return a stream's recently processed blocks [(number, hash), …], oldest first."""
        raw = self.ns.get(b"cursor/" + name.encode())
        return [] if raw is None else [(int(n), str(h)) for n, h in json.loads(raw)]

    @_locked
    def set_cursor(self, name: str, blocks: list[tuple[int, str]]) -> None:
        """Persist a stream's recently processed blocks (synced)."""
        self.ns.put(b"cursor/" + name.encode(), json.dumps(blocks).encode(), sync=True)

    def cursor(self, name: str) -> StoreCursor:
        """Return a chain.events.CursorStore backed by this database."""
        return StoreCursor(self, name)

    # ---- slashing protection -----------------------------------------------------------------

    @_locked
    def get_verdict(self, inference_id: int) -> VerdictRecord | None:
        """Return the verdict recorded for an inference."""
        raw = self.ns.get(_verdict_key(inference_id))
        return None if raw is None else VerdictRecord(**json.loads(raw))

    @_locked
    def record_verdict(self, record: VerdictRecord) -> VerdictRecord:
        """Check and record a verdict before signing it; return the record to sign.

        A first verdict is written (synced); the same decision again returns the stored record
        (re-signing it gives the same signature); a different decision (validity, reason or artifact
        root) raises ConflictingVerdict.
        """
        existing = self.get_verdict(record.inference_id)
        if existing is not None:
            if existing.same_decision(record):
                return existing
            raise ConflictingVerdict(f"inference {record.inference_id}: already signed {existing}, refusing {record}",
                                     Reason.CONFLICTING_VERDICT)
        with self.ns.write_batch(sync=True) as batch:
            batch.put(_verdict_key(record.inference_id), json.dumps(asdict(record)).encode())
        return record

    @_locked
    def verdicts(self) -> list[VerdictRecord]:
        """Return every recorded verdict."""
        return [VerdictRecord(**json.loads(raw)) for _, raw in self.ns.iterator(prefix=b"verdict/")]

    @_locked
    def record_expert_verdict(self, record: ExpertVerdictRecord) -> ExpertVerdictRecord:
        """Check and record an MoE duty verdict before signing it (synced); as `record_verdict`, per duty."""
        key = _expert_verdict_key(record.inference_id, record.duty)
        raw = self.ns.get(key)
        if raw is not None:
            existing = ExpertVerdictRecord(**json.loads(raw))
            if existing.same_decision(record):
                return existing
            raise ConflictingVerdict(f"inference {record.inference_id} duty {record.duty}: already signed {existing}, "
                                     f"refusing {record}", Reason.CONFLICTING_VERDICT)
        self.ns.put(key, json.dumps(asdict(record)).encode(), sync=True)
        return record

    @_locked
    def get_expert_verdict(self, inference_id: int, duty: int) -> ExpertVerdictRecord | None:
        """Return the MoE duty verdict recorded for an inference."""
        raw = self.ns.get(_expert_verdict_key(inference_id, duty))
        return None if raw is None else ExpertVerdictRecord(**json.loads(raw))

    # ---- records ------------------------------------------------------------------------------

    @_locked
    def put_record(self, kind: str, key: int, value: dict[str, Any]) -> None:
        """Persist (synced) a JSON record."""
        self.ns.put(_record_key(kind, key), json.dumps(value).encode(), sync=True)

    @_locked
    def get_record(self, kind: str, key: int) -> dict[str, Any] | None:
        """Return a JSON record."""
        raw = self.ns.get(_record_key(kind, key))
        return None if raw is None else dict(json.loads(raw))

    @_locked
    def records(self, kind: str) -> list[tuple[int, dict[str, Any]]]:
        """Return every JSON record of one kind, by key."""
        prefix = f"record/{kind}/".encode()
        return [(int.from_bytes(key[len(prefix):], "big"), dict(json.loads(raw)))
                for key, raw in self.ns.iterator(prefix=prefix)]

    @_locked
    def delete_record(self, kind: str, key: int) -> None:
        """Delete a JSON record (synced)."""
        self.ns.delete(_record_key(kind, key), sync=True)

    # ---- transaction journal -------------------------------------------------------------------

    @_locked
    def journal_put(self, nonce: int, entry: dict[str, Any]) -> None:
        """Persist (synced) a journal entry for a nonce."""
        self.ns.put(_tx_key(nonce), json.dumps(entry).encode(), sync=True)

    @_locked
    def journal_get(self, nonce: int) -> dict[str, Any] | None:
        """Return the journal entry of a nonce."""
        raw = self.ns.get(_tx_key(nonce))
        return None if raw is None else dict(json.loads(raw))

    @_locked
    def journal_entries(self) -> list[dict[str, Any]]:
        """Return every journal entry, by nonce."""
        return [dict(json.loads(raw)) for _, raw in self.ns.iterator(prefix=b"tx/")]

    # ---- durable jobs and known votes -------------------------------------------------------

    @_locked
    def add_job(self, inference_id: int, job: dict[str, Any]) -> bool:
        """Record a new pending job (synced); return False if this inference has or had a job."""
        if self._find_job(inference_id) is not None or self.ns.get(_job_key(DONE, inference_id)) is not None:
            return False
        self.ns.put(_job_key("pending", inference_id), json.dumps(job).encode(), sync=True)
        return True

    @_locked
    def move_job(self, inference_id: int, state: str, job: dict[str, Any]) -> None:
        """Move a job to `state` with its new content, in one synced batch."""
        if state not in JOB_STATES:
            raise ValueError(f"unknown job state {state!r}")
        with self.ns.write_batch(sync=True) as batch:
            for other in JOB_STATES:
                batch.delete(_job_key(other, inference_id))
            batch.put(_job_key(state, inference_id), json.dumps(job).encode())

    @_locked
    def get_job(self, inference_id: int) -> tuple[str, dict[str, Any]] | None:
        """Return (state, job) of an inference's job in progress."""
        return self._find_job(inference_id)

    def _find_job(self, inference_id: int) -> tuple[str, dict[str, Any]] | None:
        for state in JOB_STATES:
            raw = self.ns.get(_job_key(state, inference_id))
            if raw is not None:
                return state, dict(json.loads(raw))
        return None

    @_locked
    def jobs(self, state: str) -> list[tuple[int, dict[str, Any]]]:
        """Return the jobs in one state, by inference id."""
        prefix = f"job/{state}/".encode()
        return [(int.from_bytes(key[len(prefix):], "big"), dict(json.loads(raw)))
                for key, raw in self.ns.iterator(prefix=prefix)]

    @_locked
    def put_vote(self, inference_id: int, signer: str, vote: dict[str, Any]) -> bool:
        """Persist (synced) a signed vote known for an inference; return False if that signer's was known."""
        key = _vote_key(inference_id, signer)
        if self.ns.get(key) is not None:
            return False
        self.ns.put(key, json.dumps(vote).encode(), sync=True)
        return True

    @_locked
    def votes(self, inference_id: int) -> dict[str, dict[str, Any]]:
        """Return the votes known for an inference, by signer (checksummed address)."""
        prefix = b"vote/" + inference_id.to_bytes(32, "big") + b"/"
        return {_checksum(key[len(prefix):]): dict(json.loads(raw)) for key, raw in self.ns.iterator(prefix=prefix)}

    @_locked
    def voted_inferences(self) -> list[int]:
        """Return the inferences with known votes."""
        return sorted({int.from_bytes(key[5:37], "big") for key in self.ns.iterator(prefix=b"vote/",
                                                                                      include_value=False)})

    @_locked
    def finish_job(self, inference_id: int) -> None:
        """End an inference's job (its vote is on chain), keeping the votes known for it; synced."""
        with self.ns.write_batch(sync=True) as batch:
            for state in JOB_STATES:
                batch.delete(_job_key(state, inference_id))
            batch.put(_job_key(DONE, inference_id), b"")

    @_locked
    def forget_inference(self, inference_id: int) -> None:
        """End an inference's job and drop its votes (settled, out of its window, or not ours), synced."""
        with self.ns.write_batch(sync=True) as batch:
            for state in JOB_STATES:
                batch.delete(_job_key(state, inference_id))
            batch.put(_job_key(DONE, inference_id), b"")
            for key in self.ns.iterator(prefix=b"vote/" + inference_id.to_bytes(32, "big") + b"/",
                                        include_value=False):
                batch.delete(key)


@dataclass(frozen=True)
class StoreCursor:
    """One named stream's cursor in the store (satisfies chain.events.CursorStore)."""

    store: Store
    name: str

    def load(self) -> list[tuple[int, str]]:
        """Return the processed blocks."""
        return self.store.get_cursor(self.name)

    def save(self, blocks: list[tuple[int, str]]) -> None:
        """Persist the processed blocks."""
        self.store.set_cursor(self.name, blocks)


def _verdict_key(inference_id: int) -> bytes:
    return b"verdict/" + inference_id.to_bytes(32, "big")


def _expert_verdict_key(inference_id: int, duty: int) -> bytes:
    return b"expert-verdict/" + inference_id.to_bytes(32, "big") + duty.to_bytes(4, "big")


def _served_key(prefix: bytes, inference_id: int) -> bytes:
    return prefix + inference_id.to_bytes(32, "big")


def _record_key(kind: str, key: int) -> bytes:
    return f"record/{kind}/".encode() + key.to_bytes(32, "big")


def _tx_key(nonce: int) -> bytes:
    return f"tx/{nonce:020d}".encode()


def _job_key(state: str, inference_id: int) -> bytes:
    return f"job/{state}/".encode() + inference_id.to_bytes(32, "big")


def _vote_key(inference_id: int, signer: str) -> bytes:
    address = bytes.fromhex(signer.removeprefix("0x"))
    if len(address) != 20:
        raise ValueError(f"{signer!r} is not an address")
    return b"vote/" + inference_id.to_bytes(32, "big") + b"/" + address


def _checksum(raw: bytes) -> str:
    from eth_utils.address import to_checksum_address

    return str(to_checksum_address(raw))

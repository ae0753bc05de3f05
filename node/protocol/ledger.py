"""The training ledger: a hash chain of per-step entries, batch commitments and their typed rejections.

h(−1) = keccak256("verinfer-training-v2" ‖ run_id), and for each step t ≥ 0
h(t)  = keccak256(h(t−1) ‖ uint64 t ‖ keccak256(positions) ‖ keccak256(values) ‖ keccak256(batch roots)
                  ‖ keccak256(lsh) ‖ keccak256(replica lsh) ‖ keccak256(optionals) ‖ state root)
where positions are uint64 big-endian, values the float32 bit patterns of Z(t)[I(t)] big-endian, batch
roots the replicas' 32-byte Merkle roots in rank order, lsh the int32 quantised sketch of the
all-reduced gradient (big-endian), replica lsh the same of each replica's own gradient, and optionals
three float32 (loss, gradient norm, learning rate; NaN when absent), and the state root the 32-byte
binding of the whole state Z(t) (node.protocol.training_state: params, momentum, step, data cursor).
Hashing every variable-length part first keeps the encoding unambiguous. Step 0 is the initialisation: no
batch, no gradient.

A batch root is the OpenZeppelin-compatible Merkle root over one leaf per sample:
`uint64 sample_id ‖ uint32 n ‖ n × uint32 token id`.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from node.protocol.errors import InvalidInput, Reason
from node.protocol.hashing import keccak256
from node.protocol.merkle import compute_leaf_hash, compute_merkle_root

DOMAIN = b"verinfer-training-v2"  # v2: every entry binds the whole state (its state root)


class TrainingReason(IntEnum):
    """Why a training artifact was rejected (7xx; uint16 in verdicts and on chain)."""

    OK = 0
    LEDGER_NOT_CHAINED = 700
    LEDGER_STEP_GAP = 701
    LEDGER_MALFORMED = 702
    CHECKPOINT_SHAPE = 703
    CHECKPOINT_DTYPE = 704
    CHECKPOINT_NON_FINITE = 705
    CHECKPOINT_POSITIONS = 706  # served weights differ from the ledger at the named positions
    BATCH_ROOT_MISMATCH = 707
    NONCE_REPLAYED = 708
    RECOMPUTE_MISMATCH = 709  # re-executed step outside the calibrated tolerance
    LSH_MISMATCH = 710
    INIT_DISTRIBUTION = 711  # the step-0 weights fail the KS test of the declared strategy
    LATE_RESPONSE = 712
    DATA_UNDECLARED = 713  # a sample id outside the declared data order
    CHECKPOINT_MISSING = 714
    SCHEDULE_MISMATCH = 715  # the ledger's learning rate is not the declared schedule's
    STATE_ROOT_MISMATCH = 716  # a served state is not the one the ledger's state root binds


class InvalidTraining(InvalidInput):
    """A training ledger entry, checkpoint or batch that can never become valid."""

    def __init__(self, message: str, reason: TrainingReason, step: int | None = None) -> None:
        super().__init__(message, Reason(int(reason)), position=step)  # one code space: Reason's 7xx
        self.training_reason = reason
        self.step = step

    def __str__(self) -> str:
        where = "" if self.step is None else f" at step {self.step}"
        return f"{self.training_reason.name}{where}: {self.args[0]}"


@dataclass(frozen=True)
class LedgerEntry:
    """One step's ledger entry; `head` is h(t) and `prev_head` is h(t−1)."""

    run_id: bytes
    step: int
    prev_head: bytes
    positions: tuple[int, ...]
    values: tuple[float, ...]  # float32 values of Z(t)[I(t)]
    batch_roots: tuple[bytes, ...]
    lsh: tuple[int, ...]
    replica_lsh: tuple[tuple[int, ...], ...]
    loss: float = float("nan")
    grad_norm: float = float("nan")
    lr: float = float("nan")
    state_root: bytes = b"\x00" * 32  # compute_state_root of Z(t); all zero binds no state (never matches one)
    head: bytes = b""


def compute_run_id(prover: str, spec_hash: bytes) -> bytes:
    """Return a run's id, keccak256(abi.encode(address prover, bytes32 spec hash)): Training.runIdOf's mirror."""
    if len(spec_hash) != 32:
        raise InvalidTraining(f"spec hash of {len(spec_hash)} bytes", TrainingReason.LEDGER_MALFORMED)
    address = bytes.fromhex(prover.removeprefix("0x"))
    if len(address) != 20:
        raise InvalidTraining(f"prover address of {len(address)} bytes", TrainingReason.LEDGER_MALFORMED)
    return keccak256(b"\x00" * 12 + address + spec_hash)


def compute_genesis_head(run_id: bytes) -> bytes:
    """Return h(−1) of a run."""
    if len(run_id) != 32:
        raise InvalidTraining(f"run id of {len(run_id)} bytes", TrainingReason.LEDGER_MALFORMED)
    return keccak256(DOMAIN + run_id)


def encode_values(values: Sequence[float]) -> bytes:
    """Return float32 big-endian bytes of values (the bit patterns the ledger hashes)."""
    return np.asarray(values, dtype=np.float32).astype(">f4").tobytes()


def encode_int32s(values: Sequence[int]) -> bytes:
    """Return int32 big-endian bytes."""
    return np.asarray(values, dtype=np.int64).astype(">i4").tobytes()


def compute_entry_head(entry: LedgerEntry) -> bytes:
    """Return h(t) of an entry from its fields (its own `head` is ignored)."""
    check_entry_shape(entry)
    parts = (
        keccak256(np.asarray(entry.positions, dtype=">u8").tobytes()),
        keccak256(encode_values(entry.values)),
        keccak256(b"".join(entry.batch_roots)),
        keccak256(encode_int32s(entry.lsh)),
        keccak256(b"".join(encode_int32s(r) for r in entry.replica_lsh)),
        keccak256(encode_values((entry.loss, entry.grad_norm, entry.lr))),
        entry.state_root,
    )
    return keccak256(entry.prev_head + struct.pack(">Q", entry.step) + b"".join(parts))


def check_entry_shape(entry: LedgerEntry) -> None:
    """Raise InvalidTraining if an entry's fields are malformed."""
    problems = []
    if len(entry.run_id) != 32 or len(entry.prev_head) != 32 or len(entry.state_root) != 32:
        problems.append("run id, previous head and state root must be 32 bytes")
    if not 0 <= entry.step < 1 << 64:
        problems.append(f"step {entry.step} outside uint64")
    if len(entry.positions) != len(entry.values):
        problems.append(f"{len(entry.positions)} positions for {len(entry.values)} values")
    if any(len(r) != 32 for r in entry.batch_roots):
        problems.append("batch roots must be 32 bytes each")
    if any(not -(1 << 31) <= v < 1 << 31 for v in (*entry.lsh, *(x for r in entry.replica_lsh for x in r))):
        problems.append("sketch entries outside int32")
    if list(entry.positions) != sorted(set(entry.positions)) or any(p < 0 for p in entry.positions):
        problems.append("positions must be distinct, sorted and non-negative")
    if problems:
        raise InvalidTraining("; ".join(problems), TrainingReason.LEDGER_MALFORMED, entry.step)


def seal_entry(entry: LedgerEntry) -> LedgerEntry:
    """Return the entry with its head filled in."""
    return LedgerEntry(**{**entry.__dict__, "head": compute_entry_head(entry)})


def verify_entry_link(entry: LedgerEntry, prev_head: bytes, expected_step: int) -> None:
    """Raise InvalidTraining unless entry follows prev_head at expected_step and its head is its own hash."""
    if entry.step != expected_step:
        raise InvalidTraining(f"step {entry.step} where {expected_step} was due", TrainingReason.LEDGER_STEP_GAP,
                              entry.step)
    if entry.prev_head != prev_head:
        raise InvalidTraining("previous head does not match", TrainingReason.LEDGER_NOT_CHAINED, entry.step)
    if compute_entry_head(entry) != entry.head:
        raise InvalidTraining("head is not the hash of the entry", TrainingReason.LEDGER_NOT_CHAINED, entry.step)


def verify_chain(entries: Sequence[LedgerEntry], prev_head: bytes, first_step: int) -> bytes:
    """Check that entries chain from prev_head at first_step, one step each; return the last head."""
    head = prev_head
    for i, entry in enumerate(entries):
        verify_entry_link(entry, head, first_step + i)
        head = entry.head
    return head


def encode_sample_leaf(sample_id: int, tokens: Sequence[int]) -> bytes:
    """Return the encoded leaf `uint64 sample_id ‖ uint32 n ‖ n × uint32 token`."""
    if not 0 <= sample_id < 1 << 64:
        raise InvalidTraining(f"sample id {sample_id} outside uint64", TrainingReason.LEDGER_MALFORMED)
    arr = np.asarray(tokens, dtype=np.int64)
    if arr.ndim != 1 or (arr.size and (arr.min() < 0 or arr.max() >= 1 << 32)):
        raise InvalidTraining(f"tokens of sample {sample_id} are not uint32", TrainingReason.LEDGER_MALFORMED)
    return struct.pack(">QI", sample_id, arr.size) + arr.astype(">u4").tobytes()


def compute_batch_root(sample_ids: Sequence[int], tokens: Sequence[Sequence[int]]) -> bytes:
    """Return the Merkle root of one replica's mini-batch (one leaf per sample, in batch order)."""
    if len(sample_ids) != len(tokens):
        raise InvalidTraining(f"{len(sample_ids)} ids for {len(tokens)} samples", TrainingReason.LEDGER_MALFORMED)
    return compute_merkle_root([compute_leaf_hash(encode_sample_leaf(i, t)) for i, t in zip(sample_ids, tokens,
                                                                                            strict=True)])


def verify_batch_root(root: bytes, sample_ids: Sequence[int], tokens: Sequence[Sequence[int]], step: int) -> None:
    """Raise InvalidTraining unless the batch hashes to root."""
    if compute_batch_root(sample_ids, tokens) != root:
        raise InvalidTraining("batch does not match its committed root", TrainingReason.BATCH_ROOT_MISMATCH, step)


def compute_window_index(step: int, anchor_every: int) -> int:
    """Return the anchor window of a step: window 0 holds steps 0..m, window w ≥ 1 steps (w·m + 1)..(w + 1)·m."""
    if step < 0 or anchor_every < 1:
        raise InvalidTraining(f"no window for step {step} at m = {anchor_every}", TrainingReason.LEDGER_MALFORMED, step)
    return 0 if step <= anchor_every else (step - 1) // anchor_every


def compute_audit_draw(randomness: bytes, run_id: bytes, step: int) -> bytes:
    """Return keccak256(randomness ‖ run_id ‖ uint256 step), the draw that decides one step's audit."""
    return keccak256(randomness + run_id + step.to_bytes(32, "big"))

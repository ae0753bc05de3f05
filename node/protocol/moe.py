"""Mixture-of-experts commitments: per-expert leaves, one Merkle tree per expert, expert fingerprints, assignment.

Per MoE layer L and fed position t the executer commits (all integers and floats big-endian):
- a router leaf  `uint16 L ‖ uint32 t ‖ top_k × (uint16 expert ‖ float32 weight) ‖ bytes32 input_hash`;
- for each routed expert e, an expert leaf
  `uint16 L ‖ uint16 e ‖ uint32 t ‖ float32 weight ‖ bytes32 input_hash ‖ bytes32 output_hash ‖
  FP_K × (uint16 index ‖ float32 value)`,
  where input_hash = sha256 of the expert's input row (the post-attention-norm hidden state, float32 BE),
  output_hash = sha256 of the expert's unweighted output row, and the fingerprint is the output's FP_K
  entries of largest |value| (ties: lower index) with their exact float32 values.
Trees are OpenZeppelin-compatible (node.protocol.merkle). Each expert (L, e) has its own root over its
leaves in position order, so one expert's leaves prove alone; a summary leaf
`uint16 L ‖ uint16 e ‖ uint32 count ‖ bytes32 expertRoot` per expert (every expert of every layer, in
order, empty ones with count 0 and root 0) forms expertsRoot; the router leaves, ordered by (L, t), form
routerRoot; `moeRoot = keccak256(routerRoot ‖ expertsRoot)`, and an MoE model's committed fingerprint hash is
`keccak256(fingerprintHash ‖ moeRoot)` (the artifact root stays the dense one, so the hub's fraud proofs hold).
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from node.protocol.errors import InvalidInput, Reason
from node.protocol.hashing import ZERO32, keccak256, sha256
from node.protocol.merkle import (
    compute_leaf_hash,
    compute_merkle_proof,
    compute_merkle_root,
    compute_root_from_proof,
)

FP_K = 16  # fingerprint entries per expert output row
ROUTER = 0xFFFF  # the "expert" index of a layer's router duty in assignments
SHARED = 0xFFFE  # the "expert" index (layer 0) of the shared-layer link duty: attention, norms, routers, head
MAX_LAYERS = 4096
MAX_EXPERTS = 4096
_EXPERT_HEAD = struct.Struct(">HHIf32s32s")
_FP_ENTRY = struct.Struct(">Hf")
_SUMMARY = struct.Struct(">HHI32s")
_ASSIGN_DRAW = struct.Struct(">32sHHI")


class MoeReason(IntEnum):
    """Why an MoE commitment or check was rejected (9xx; uint16 in verdicts and on chain)."""

    OK = 0
    MOE_MALFORMED = 900
    EXPERT_UNKNOWN = 901
    EXPERT_INPUT_HASH_MISMATCH = 902
    EXPERT_FINGERPRINT_MISMATCH = 903
    EXPERT_ROOT_MISMATCH = 904
    ROUTER_MISMATCH = 905
    ROUTING_INCOMPLETE = 906
    EXPERT_OUTPUT_HASH_MISMATCH = 907
    LINK_MISMATCH = 908
    ASSIGNMENT_UNCOVERED = 909
    DUTY_DATA_UNAVAILABLE = 910  # the operator did not serve the rows and leaves an assigned duty needs


class InvalidMoe(InvalidInput):
    """An MoE commitment, payload or assignment that can never become valid."""

    def __init__(self, message: str, reason: MoeReason, position: int | None = None) -> None:
        super().__init__(message, Reason(int(reason)), position=position)  # Reason carries every 9xx code
        self.moe_reason = reason

    def __str__(self) -> str:
        where = "" if self.position is None else f" at position {self.position}"
        return f"{self.moe_reason.name}{where}: {self.args[0]}"


@dataclass(frozen=True, order=True)
class ExpertKey:
    """One expert (layer, expert index), a layer's router duty (ROUTER) or the link duty (SHARED): `layer3.e1`."""

    layer: int
    expert: int

    def __post_init__(self) -> None:
        if not (0 <= self.layer < MAX_LAYERS and (0 <= self.expert < MAX_EXPERTS or self.expert in (ROUTER, SHARED))):
            raise InvalidMoe(f"expert key ({self.layer}, {self.expert}) out of range", MoeReason.EXPERT_UNKNOWN)

    def __str__(self) -> str:
        if self.expert == SHARED:
            return "shared"
        return f"layer{self.layer}.{'router' if self.expert == ROUTER else f'e{self.expert}'}"

    @classmethod
    def parse(cls, text: str) -> ExpertKey:
        """Return the key written as `layer<L>.e<E>` or `layer<L>.router`."""
        if text == "shared":
            return cls(0, SHARED)
        head, _, tail = text.partition(".")
        try:
            if not head.startswith("layer") or not (tail == "router" or tail.startswith("e")):
                raise ValueError(text)
            layer = int(head[5:])
            expert = ROUTER if tail == "router" else int(tail[1:])
        except ValueError:
            raise InvalidMoe(f"expert name {text!r} is not layer<L>.e<E> or layer<L>.router",
                             MoeReason.EXPERT_UNKNOWN) from None
        if str(cls(layer, expert)) != text:  # canonical spelling only: no "layer03", "e+1"
            raise InvalidMoe(f"expert name {text!r} is not canonical", MoeReason.EXPERT_UNKNOWN)
        return cls(layer, expert)


@dataclass(frozen=True)
class ExpertLeaf:
    """What an expert committed for one position it was routed."""

    layer: int
    expert: int
    position: int
    weight: float
    input_hash: bytes
    output_hash: bytes
    fp_index: tuple[int, ...]
    fp_value: tuple[float, ...]

    @property
    def key(self) -> ExpertKey:
        """Return the (layer, expert) this leaf belongs to."""
        return ExpertKey(self.layer, self.expert)


@dataclass(frozen=True)
class RouterLeaf:
    """The router's choice at one (layer, position): top-k experts, their normalised weights, the input hash."""

    layer: int
    position: int
    experts: tuple[int, ...]
    weights: tuple[float, ...]
    input_hash: bytes


@dataclass(frozen=True)
class FingerprintMeasure:
    """A recomputed expert output against one committed fingerprint (numbers only; a decision applies limits)."""

    max_abs_error: float  # max |recomputed − committed| over the committed indices
    rel_error: float  # max_abs_error / max |committed value|
    index_mismatches: int  # committed indices absent from the recomputed top-FP_K


def compute_vector_hash(row: np.ndarray) -> bytes:
    """Return sha256 of a float32 row's big-endian bytes."""
    return sha256(np.ascontiguousarray(row, dtype=">f4").tobytes())


def compute_top_indices(row: np.ndarray, k: int = FP_K) -> np.ndarray:
    """Return the indices of the k largest |value| entries, ties to the lower index."""
    order = np.argsort(-np.abs(row.astype(np.float32)), kind="stable")
    return order[:k].astype(np.int64)


def compute_expert_fingerprint(row: np.ndarray, k: int = FP_K) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """Return (indices, float32 values) of a float32 expert output row's top-k |value| entries."""
    if row.ndim != 1 or row.shape[0] > 0xFFFF or row.shape[0] < k:
        raise InvalidMoe(f"expert output of shape {row.shape} cannot carry {k} uint16 indices",
                         MoeReason.MOE_MALFORMED)
    if not np.all(np.isfinite(row)):
        raise InvalidMoe("non-finite expert output", MoeReason.MOE_MALFORMED)
    idx = compute_top_indices(row, k)
    return tuple(int(i) for i in idx), tuple(float(v) for v in row.astype(np.float32)[idx])


def make_expert_leaf(layer: int, expert: int, position: int, weight: float, x: np.ndarray,
                     y: np.ndarray) -> ExpertLeaf:
    """Return the leaf of expert (layer, expert) on input row x with unweighted output row y."""
    index, value = compute_expert_fingerprint(y)
    return ExpertLeaf(layer, expert, position, float(np.float32(weight)), compute_vector_hash(x),
                      compute_vector_hash(y), index, value)


def encode_expert_leaf(leaf: ExpertLeaf) -> bytes:
    """Return the canonical bytes of an expert leaf."""
    if len(leaf.fp_index) != FP_K or len(leaf.fp_value) != FP_K:
        raise InvalidMoe(f"fingerprint of {len(leaf.fp_index)} entries, expected {FP_K}", MoeReason.MOE_MALFORMED)
    try:
        head = _EXPERT_HEAD.pack(leaf.layer, leaf.expert, leaf.position, leaf.weight, leaf.input_hash,
                                 leaf.output_hash)
        return head + b"".join(_FP_ENTRY.pack(i, v) for i, v in zip(leaf.fp_index, leaf.fp_value, strict=True))
    except struct.error as e:
        raise InvalidMoe(f"expert leaf field out of range: {e}", MoeReason.MOE_MALFORMED, leaf.position) from None


def expert_leaf_size() -> int:
    """Return the encoded size of one expert leaf in bytes."""
    return _EXPERT_HEAD.size + FP_K * _FP_ENTRY.size


def decode_expert_leaf(raw: bytes) -> ExpertLeaf:
    """Return the expert leaf encoded in raw (exact length; typed error otherwise)."""
    if len(raw) != expert_leaf_size():
        raise InvalidMoe(f"expert leaf of {len(raw)} bytes, expected {expert_leaf_size()}", MoeReason.MOE_MALFORMED)
    layer, expert, position, weight, ih, oh = _EXPERT_HEAD.unpack_from(raw)
    entries = [_FP_ENTRY.unpack_from(raw, _EXPERT_HEAD.size + j * _FP_ENTRY.size) for j in range(FP_K)]
    if not all(np.isfinite(v) for _, v in entries) or not np.isfinite(weight):
        raise InvalidMoe("non-finite value in expert leaf", MoeReason.MOE_MALFORMED, position)
    return ExpertLeaf(layer, expert, position, weight, ih, oh, tuple(int(i) for i, _ in entries),
                      tuple(float(v) for _, v in entries))


def encode_router_leaf(leaf: RouterLeaf) -> bytes:
    """Return the canonical bytes of a router leaf."""
    if len(leaf.experts) != len(leaf.weights) or not leaf.experts:
        raise InvalidMoe("router leaf needs as many weights as experts", MoeReason.MOE_MALFORMED, leaf.position)
    try:
        body = b"".join(struct.pack(">Hf", e, w) for e, w in zip(leaf.experts, leaf.weights, strict=True))
        return struct.pack(">HI", leaf.layer, leaf.position) + body + struct.pack(">32s", leaf.input_hash)
    except struct.error as e:
        raise InvalidMoe(f"router leaf field out of range: {e}", MoeReason.MOE_MALFORMED, leaf.position) from None


def router_leaf_size(top_k: int) -> int:
    """Return the encoded size of one router leaf with top_k choices."""
    return 6 + 6 * top_k + 32


def decode_router_leaf(raw: bytes, top_k: int) -> RouterLeaf:
    """Return the router leaf encoded in raw (exact length for top_k; typed error otherwise)."""
    if top_k < 1 or len(raw) != router_leaf_size(top_k):
        raise InvalidMoe(f"router leaf of {len(raw)} bytes, expected {router_leaf_size(max(top_k, 1))}",
                         MoeReason.MOE_MALFORMED)
    layer, position = struct.unpack_from(">HI", raw)
    pairs = [struct.unpack_from(">Hf", raw, 6 + 6 * j) for j in range(top_k)]
    if not all(np.isfinite(w) for _, w in pairs):
        raise InvalidMoe("non-finite router weight", MoeReason.MOE_MALFORMED, position)
    return RouterLeaf(layer, position, tuple(int(e) for e, _ in pairs), tuple(float(w) for _, w in pairs),
                      bytes(raw[6 + 6 * top_k:]))


def compute_expert_root(leaves: Sequence[ExpertLeaf]) -> bytes:
    """Return the Merkle root over one expert's leaves (in the given, position-ascending order)."""
    return compute_merkle_root([compute_leaf_hash(encode_expert_leaf(x)) for x in leaves])


def compute_summary_leaf_hash(key: ExpertKey, count: int, root: bytes) -> bytes:
    """Return the leaf hash that places one expert's root in expertsRoot."""
    return compute_leaf_hash(_SUMMARY.pack(key.layer, key.expert, count, root))


def compute_opened_moe_root(num_layers: int, num_experts: int, router_root: bytes, counts: Sequence[int],
                            roots: Sequence[bytes]) -> bytes:
    """Return the moeRoot an opening rebuilds: keccak256(routerRoot ‖ expertsRoot over the summary leaves)."""
    if len(counts) != num_layers * num_experts or len(roots) != len(counts):
        raise InvalidMoe("an opening has one count and one root per expert of the model", MoeReason.MOE_MALFORMED)
    keys = [ExpertKey(L, e) for L in range(num_layers) for e in range(num_experts)]
    leaves = [compute_summary_leaf_hash(k, c, r) for k, c, r in zip(keys, counts, roots, strict=True)]
    return keccak256(router_root + compute_merkle_root(leaves))


@dataclass(frozen=True, eq=False)
class MoeCommitment:
    """Everything an executer commits for one inference on an MoE model (leaves; roots are computed)."""

    num_layers: int
    num_experts: int
    router: tuple[RouterLeaf, ...]
    experts: Mapping[ExpertKey, tuple[ExpertLeaf, ...]]

    def expert_keys(self) -> list[ExpertKey]:
        """Return every (layer, expert) of the model, in commitment order."""
        return [ExpertKey(L, e) for L in range(self.num_layers) for e in range(self.num_experts)]

    def leaves_of(self, key: ExpertKey) -> tuple[ExpertLeaf, ...]:
        """Return one expert's leaves (empty if it was never routed)."""
        if key.layer >= self.num_layers or key.expert >= self.num_experts:
            raise InvalidMoe(f"{key} is not an expert of this model", MoeReason.EXPERT_UNKNOWN)
        return self.experts.get(key, ())

    def summary_leaf_hashes(self) -> list[bytes]:
        """Return the summary leaf hashes of expertsRoot, one per expert in order."""
        out = []
        for key in self.expert_keys():
            leaves = self.leaves_of(key)
            out.append(compute_summary_leaf_hash(key, len(leaves), compute_expert_root(leaves) if leaves else ZERO32))
        return out

    def router_root(self) -> bytes:
        """Return the Merkle root over the router leaves."""
        return compute_merkle_root([compute_leaf_hash(encode_router_leaf(r)) for r in self.router])

    def root(self) -> bytes:
        """Return moeRoot = keccak256(routerRoot ‖ expertsRoot)."""
        return keccak256(self.router_root() + compute_merkle_root(self.summary_leaf_hashes()))

    def opening(self) -> tuple[bytes, list[int], list[bytes]]:
        """Return (routerRoot, per-expert leaf counts, per-expert roots) in commitment order: what opens moeRoot."""
        counts, roots = [], []
        for key in self.expert_keys():
            leaves = self.leaves_of(key)
            counts.append(len(leaves))
            roots.append(compute_expert_root(leaves) if leaves else ZERO32)
        return self.router_root(), counts, roots

    def expert_proof(self, key: ExpertKey) -> ExpertProof:
        """Return what proves one expert's leaves against moeRoot without the rest."""
        index = self.expert_keys().index(key)
        summaries = self.summary_leaf_hashes()
        return ExpertProof(key, index, tuple(compute_merkle_proof(summaries, index)), self.router_root())


@dataclass(frozen=True)
class ExpertProof:
    """The path from one expert's root to moeRoot: its summary leaf's Merkle proof and the router root."""

    key: ExpertKey
    index: int
    summary_proof: tuple[bytes, ...]
    router_root: bytes


def compute_moe_fingerprint_hash(fingerprint_hash: bytes, moe_root: bytes) -> bytes:
    """Return the fingerprint hash an MoE model commits on chain: keccak256(fingerprintHash ‖ moeRoot).

    The hub never reads the fingerprint hash, so binding moeRoot there leaves the artifact root, and every
    fraud proof the hub recomputes from it, as for a dense model (contracts/src/ExpertDuty.sol opens it).
    """
    if len(fingerprint_hash) != 32 or len(moe_root) != 32:
        raise InvalidMoe("fingerprint hash and moeRoot are 32 bytes each", MoeReason.MOE_MALFORMED)
    return keccak256(fingerprint_hash + moe_root)


def compute_duty_key(key: ExpertKey) -> int:
    """Return a duty's uint32 key on chain: uint16 layer ‖ uint16 expert (ROUTER, SHARED included)."""
    return (key.layer << 16) | key.expert


def parse_duty_key(value: int) -> ExpertKey:
    """Return the ExpertKey of an on-chain uint32 duty key."""
    if not 0 <= value < 2**32:
        raise InvalidMoe(f"duty key {value} is not a uint32", MoeReason.EXPERT_UNKNOWN)
    return ExpertKey(value >> 16, value & 0xFFFF)


def compute_duty_randomness(selection_seed: bytes) -> bytes:
    """Return the randomness of the on-chain expert draw: keccak256(hub selection seed ‖ "experts")."""
    if len(selection_seed) != 32:
        raise InvalidMoe("a selection seed is 32 bytes", MoeReason.MOE_MALFORMED)
    return keccak256(selection_seed + b"experts")


def compute_settled_weight(weight_before: int, weight_now: int) -> int:
    """Return a validator's draw weight at block b: min(weight at b − weightDelay, weight at b) (ExpertDuty.sol).

    Stake bonded or added within the delay before the commit counts for nothing; stake removed counts at once.
    """
    if weight_before < 0 or weight_now < 0:
        raise InvalidMoe("weights are non-negative", MoeReason.MOE_MALFORMED)
    return min(weight_before, weight_now)


def verify_expert_leaves(leaves: Sequence[ExpertLeaf], proof: ExpertProof, moe_root: bytes) -> bool:
    """Check whether one expert's leaves, alone, belong to moeRoot (order, ownership and membership)."""
    if any(x.key != proof.key for x in leaves):
        return False
    if any(a.position >= b.position for a, b in itertools.pairwise(leaves)):
        return False
    root = compute_expert_root(leaves) if leaves else ZERO32
    summary = compute_summary_leaf_hash(proof.key, len(leaves), root)
    experts_root = compute_root_from_proof(summary, proof.summary_proof)
    return keccak256(proof.router_root + experts_root) == moe_root


def measure_expert_fingerprint(leaf: ExpertLeaf, recomputed: np.ndarray) -> FingerprintMeasure:
    """Return how far a recomputed output row lies from a committed fingerprint."""
    idx = np.asarray(leaf.fp_index, dtype=np.int64)
    if recomputed.ndim != 1 or idx.max(initial=0) >= recomputed.shape[0]:
        raise InvalidMoe(f"fingerprint index beyond an output of {recomputed.shape}", MoeReason.MOE_MALFORMED,
                         leaf.position)
    committed = np.asarray(leaf.fp_value, dtype=np.float64)
    err = float(np.max(np.abs(recomputed.astype(np.float64)[idx] - committed)))
    scale = float(np.max(np.abs(committed)))
    mine = set(compute_top_indices(recomputed, len(idx)).tolist())
    return FingerprintMeasure(err, err / scale if scale > 0 else float("inf"),
                              sum(1 for i in idx.tolist() if i not in mine))


def compute_routing(logits: np.ndarray, top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """Return (experts, normalised weights) per row: softmax, top-k (ties: lower index), renormalised."""
    z = logits.astype(np.float64)
    p = np.exp(z - z.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    order = np.argsort(-p, axis=-1, kind="stable")[:, :top_k]
    top = np.take_along_axis(p, order, axis=-1)
    return order, top / top.sum(axis=-1, keepdims=True)


def find_routing_gaps(commitment: MoeCommitment) -> list[tuple[ExpertKey, int]]:
    """Return (expert, position) pairs where router choices and expert leaves disagree (both directions)."""
    routed = {(ExpertKey(r.layer, e), r.position) for r in commitment.router for e in r.experts}
    leaves = {(k, x.position) for k, xs in commitment.experts.items() for x in xs}
    return sorted(routed ^ leaves)


@dataclass(frozen=True)
class Holder:
    """A validator in the draw's stake snapshot: address and settled weight (declared holdings narrow nothing)."""

    address: bytes
    stake: int


def compute_used_experts(commitment: MoeCommitment) -> list[ExpertKey]:
    """Return the duties a check of this inference needs: every routed expert, every layer's router, the link."""
    used = {k for k, xs in commitment.experts.items() if xs}
    used |= {ExpertKey(r.layer, ROUTER) for r in commitment.router}
    used.add(ExpertKey(0, SHARED))
    return sorted(used)


def compute_expert_assignment(randomness: bytes, duties: Iterable[ExpertKey], holders: Sequence[Holder],
                              per_duty: int) -> dict[ExpertKey, tuple[bytes, ...]]:
    """Return, per duty, per_duty distinct validators drawn stake-weighted without replacement from all of them.

    Draw j of duty (L, e): u = uint256(keccak256(randomness ‖ uint16 L ‖ uint16 e ‖ uint32 j)) mod the
    remaining stake, walked over every validator with stake > 0 in ascending address order. randomness must be
    fixed after the commit and stakes be the settled weights at the commit (compute_settled_weight; docs/security.md
    rule 9): no one chooses the duties it judges. Fewer than per_duty validators: no duty is covered
    (ASSIGNMENT_UNCOVERED; on chain the open reverts `Uncoverable`).
    """
    if len(randomness) != 32 or per_duty < 1:
        raise InvalidMoe("assignment needs 32 bytes of randomness and per_duty >= 1", MoeReason.MOE_MALFORMED)
    if len({h.address for h in holders}) != len(holders) or any(h.stake < 0 for h in holders):
        raise InvalidMoe("holders repeat an address or carry negative stake", MoeReason.MOE_MALFORMED)
    eligible = sorted((h for h in holders if h.stake > 0), key=lambda h: h.address)
    if len(eligible) < per_duty:
        raise InvalidMoe(f"{len(eligible)} eligible validators, {per_duty} needed per duty",
                         MoeReason.ASSIGNMENT_UNCOVERED)
    out: dict[ExpertKey, tuple[bytes, ...]] = {}
    for key in sorted(set(duties)):
        pool = list(eligible)
        chosen: list[bytes] = []
        for j in range(per_duty):
            u = int.from_bytes(keccak256(_ASSIGN_DRAW.pack(randomness, key.layer, key.expert, j)), "big")
            u %= sum(h.stake for h in pool)
            for h in pool:
                if u < h.stake:
                    chosen.append(h.address)
                    pool.remove(h)
                    break
                u -= h.stake
        out[key] = tuple(chosen)
    return out

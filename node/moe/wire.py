"""The wire form of what one MoE duty fetches from its operator: a duty slice, bound to moeRoot on its own.

An assigned validator fetches `GET /v1/moe/{inference_id}/{duty}` (duty `layer3.e1`, `layer3.router` or
`shared`) from the operator. Every slice opens moeRoot (the router root and every expert's count and root), so
the validator rebuilds moeRoot from the slice alone and compares it with the module's `opened(id).moeRoot`
before it reads anything else; leaves are trusted only once rebuilt into that root, rows only through the
hashes in those leaves (checked by the duty).

Layout, big-endian:
  "VMOE" ‖ uint8 version 1 ‖ uint32 duty key ‖ uint16 layers ‖ uint16 experts ‖ uint16 top_k ‖ uint16 hidden ‖
  uint32 T (fed positions) ‖ bytes32 routerRoot ‖ layers·experts × (uint32 count ‖ bytes32 expertRoot)
then by duty:
  expert (L, e)  count × expert leaf ‖ count × hidden float32: its input rows, in leaf order
  router L       layers·T router leaves, ordered by (L, t) ‖ T × hidden float32: layer L's input rows
  shared         bytes32 artifactRoot ‖ bytes32 dense fingerprintHash ‖ uint32 P ‖ uint32 N ‖ (P + N) × uint32
                 token ids (prompt, output; T = P + N − 1) ‖ layers·T router leaves ‖ every expert's leaves in
                 commitment order ‖ layers·T × hidden float32 input rows ‖ one hidden float32 output row per
                 expert leaf, in the same order
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from node.moe.trace import ExpertRows, MoeTrace
from node.protocol.hashing import ZERO32
from node.protocol.merkle import compute_leaf_hash, compute_merkle_root
from node.protocol.moe import (
    ROUTER,
    SHARED,
    ExpertKey,
    ExpertLeaf,
    InvalidMoe,
    MoeCommitment,
    MoeReason,
    RouterLeaf,
    compute_duty_key,
    compute_expert_root,
    compute_opened_moe_root,
    decode_expert_leaf,
    decode_router_leaf,
    encode_expert_leaf,
    encode_router_leaf,
    expert_leaf_size,
    router_leaf_size,
)

MAGIC = b"VMOE"
VERSION = 1
MAX_SLICE = 256 * 2**20  # a link slice of a long sequence on a wide model is large; the reader caps what it reads
MAX_POSITIONS = 8192  # fed positions (prompt + output − 1) a slice may carry
_HEAD = struct.Struct(">4sBIHHHHI32s")
_SUMMARY_ENTRY = struct.Struct(">I32s")
_TOKENS_HEAD = struct.Struct(">32s32sII")


@dataclass(frozen=True)
class MoeShape:
    """An MoE model's shape as the validator knows it from its own config (a slice must match it)."""

    layers: int
    experts: int
    top_k: int
    hidden: int


@dataclass(frozen=True, eq=False)
class DutySlice:
    """A decoded slice whose leaves were rebuilt into moeRoot (rows still to be checked against leaf hashes)."""

    key: ExpertKey
    shape: MoeShape
    positions: int
    counts: tuple[int, ...]
    router: tuple[RouterLeaf, ...] = ()  # every router leaf (router and link duties)
    experts: dict[ExpertKey, tuple[ExpertLeaf, ...]] = field(default_factory=dict)
    inputs: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.float32))  # see the module docstring
    outputs: dict[ExpertKey, np.ndarray] = field(default_factory=dict)  # link only: per expert, (count, hidden)
    prompt_ids: tuple[int, ...] = ()
    output_ids: tuple[int, ...] = ()
    artifact_root: bytes = ZERO32
    fingerprint_hash: bytes = ZERO32

    def commitment(self) -> MoeCommitment:
        """Return the leaves as a commitment (complete for the link duty only)."""
        return MoeCommitment(self.shape.layers, self.shape.experts, self.router, self.experts)

    def trace(self) -> MoeTrace:
        """Return the link duty's payload as a trace (inputs, routing and every expert's output rows)."""
        s = self.shape
        experts = np.array([r.experts for r in self.router], dtype=np.int64).reshape(s.layers, self.positions, s.top_k)
        weights = np.array([r.weights for r in self.router], dtype=np.float32).reshape(s.layers, self.positions,
                                                                                     s.top_k)
        outputs = {k: ExpertRows(np.array([x.position for x in leaves], dtype=np.int64), self.outputs[k])
                   for k, leaves in self.experts.items() if leaves}
        return MoeTrace(self.inputs, experts, weights, outputs, np.zeros_like(self.inputs), s.experts)


def compute_max_slice_size(shape: MoeShape, key: ExpertKey, max_positions: int = MAX_POSITIONS) -> int:
    """Return the most bytes duty `key`'s slice of a model of `shape` can take (what a reader should accept)."""
    layers, t, row = shape.layers, max_positions, 4 * shape.hidden
    size = _HEAD.size + layers * shape.experts * _SUMMARY_ENTRY.size
    if key.expert == SHARED:
        leaves = layers * t * shape.top_k
        size += _TOKENS_HEAD.size + 4 * (t + 1) + layers * t * router_leaf_size(shape.top_k) + \
            leaves * (expert_leaf_size() + row) + layers * t * row
    elif key.expert == ROUTER:
        size += layers * t * router_leaf_size(shape.top_k) + t * row
    else:
        size += t * (expert_leaf_size() + row)
    return min(size, MAX_SLICE)


def _rows_bytes(rows: np.ndarray) -> bytes:
    return np.ascontiguousarray(rows, dtype=">f4").tobytes()


def encode_duty_slice(commitment: MoeCommitment, trace: MoeTrace, key: ExpertKey, prompt_ids: Sequence[int] = (),
                      output_ids: Sequence[int] = (), artifact_root: bytes = ZERO32,
                      fingerprint_hash: bytes = ZERO32) -> bytes:
    """Return the slice one duty fetches (the link duty's needs the tokens and the dense commitment fields)."""
    layers, experts = commitment.num_layers, commitment.num_experts
    top_k, positions, hidden = int(trace.experts.shape[2]), int(trace.inputs.shape[1]), int(trace.inputs.shape[2])
    if (key.expert not in (ROUTER, SHARED) and (key.layer >= layers or key.expert >= experts)) or \
            (key.expert == ROUTER and key.layer >= layers):
        raise InvalidMoe(f"{key} is not a duty of this model", MoeReason.EXPERT_UNKNOWN)
    router_root, counts, roots = commitment.opening()
    out = [_HEAD.pack(MAGIC, VERSION, compute_duty_key(key), layers, experts, top_k, hidden, positions, router_root)]
    out += [_SUMMARY_ENTRY.pack(c, r) for c, r in zip(counts, roots, strict=True)]
    if key.expert == SHARED:
        if len(prompt_ids) + len(output_ids) - 1 != positions:
            raise InvalidMoe(f"{len(prompt_ids)} + {len(output_ids)} tokens do not feed {positions} positions",
                             MoeReason.MOE_MALFORMED)
        out.append(_TOKENS_HEAD.pack(artifact_root, fingerprint_hash, len(prompt_ids), len(output_ids)))
        out.append(struct.pack(f">{len(prompt_ids) + len(output_ids)}I", *prompt_ids, *output_ids))
        out += [encode_router_leaf(r) for r in commitment.router]
        keys = commitment.expert_keys()
        out += [encode_expert_leaf(x) for k in keys for x in commitment.leaves_of(k)]
        out.append(_rows_bytes(trace.inputs))
        out += [_rows_bytes(trace.outputs[k].outputs) for k in keys if commitment.leaves_of(k)]
    elif key.expert == ROUTER:
        out += [encode_router_leaf(r) for r in commitment.router]
        out.append(_rows_bytes(trace.inputs[key.layer]))
    else:
        out += [encode_expert_leaf(x) for x in commitment.leaves_of(key)]
        out.append(_rows_bytes(trace.get_expert_inputs(key)))
    return b"".join(out)


class _Reader:
    """Reads a slice front to back; any shortfall is a typed error."""

    def __init__(self, raw: bytes) -> None:
        self.raw = memoryview(raw)
        self.at = 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.at + n > len(self.raw):
            raise InvalidMoe(f"slice truncated: {n} bytes wanted at offset {self.at} of {len(self.raw)}",
                             MoeReason.MOE_MALFORMED)
        chunk = bytes(self.raw[self.at:self.at + n])
        self.at += n
        return chunk

    def rows(self, count: int, hidden: int) -> np.ndarray:
        return np.frombuffer(self.take(4 * count * hidden), dtype=">f4").astype(np.float32).reshape(count, hidden)

    def expert_leaves(self, key: ExpertKey, count: int) -> tuple[ExpertLeaf, ...]:
        size = expert_leaf_size()
        leaves = tuple(decode_expert_leaf(self.take(size)) for _ in range(count))
        if any(x.key != key for x in leaves):
            raise InvalidMoe(f"a leaf in {key}'s section belongs to another expert", MoeReason.EXPERT_ROOT_MISMATCH)
        return leaves


def _check_root(key: ExpertKey, leaves: tuple[ExpertLeaf, ...], root: bytes) -> None:
    if (compute_expert_root(leaves) if leaves else ZERO32) != root:
        raise InvalidMoe(f"{key}'s leaves do not rebuild its committed root", MoeReason.EXPERT_ROOT_MISMATCH)


def decode_duty_slice(raw: bytes, key: ExpertKey, moe_root: bytes, shape: MoeShape) -> DutySlice:
    """Return the slice of duty `key` if it opens `moe_root` for a model of `shape`; typed error otherwise."""
    if len(raw) > MAX_SLICE:
        raise InvalidMoe(f"slice of {len(raw)} bytes exceeds {MAX_SLICE}", MoeReason.MOE_MALFORMED)
    r = _Reader(raw)
    magic, version, duty, layers, experts, top_k, hidden, positions, router_root = _HEAD.unpack(r.take(_HEAD.size))
    if (magic, version, duty) != (MAGIC, VERSION, compute_duty_key(key)):
        raise InvalidMoe(f"not a version-{VERSION} slice of duty {key}", MoeReason.MOE_MALFORMED)
    if MoeShape(layers, experts, top_k, hidden) != shape or positions < 1:
        raise InvalidMoe(f"slice of shape {(layers, experts, top_k, hidden)} × {positions} positions, model {shape}",
                         MoeReason.MOE_MALFORMED)
    entries = [_SUMMARY_ENTRY.unpack(r.take(_SUMMARY_ENTRY.size)) for _ in range(layers * experts)]
    keys = [ExpertKey(L, e) for L in range(layers) for e in range(experts)]
    if compute_opened_moe_root(layers, experts, router_root, [c for c, _ in entries],
                               [root for _, root in entries]) != moe_root:
        raise InvalidMoe("the slice's opening does not rebuild the committed moeRoot", MoeReason.EXPERT_ROOT_MISMATCH)
    counts = tuple(c for c, _ in entries)
    if any(c > positions for c in counts):
        raise InvalidMoe("an expert commits more leaves than positions", MoeReason.MOE_MALFORMED)
    out = DutySlice(key, shape, positions, counts)
    if key.expert == SHARED:
        artifact_root, fp_hash, n_prompt, n_output = _TOKENS_HEAD.unpack(r.take(_TOKENS_HEAD.size))
        if n_prompt < 1 or n_output < 1 or n_prompt + n_output - 1 != positions:
            raise InvalidMoe(f"{n_prompt} + {n_output} tokens do not feed {positions} positions",
                             MoeReason.MOE_MALFORMED)
        ids = struct.unpack(f">{n_prompt + n_output}I", r.take(4 * (n_prompt + n_output)))
        router = _read_router(r, layers * positions, top_k, router_root)
        leaves = {k: r.expert_leaves(k, c) for k, (c, _) in zip(keys, entries, strict=True)}
        for k, (_, root) in zip(keys, entries, strict=True):
            _check_root(k, leaves[k], root)
        inputs = r.rows(layers * positions, hidden).reshape(layers, positions, hidden)
        outputs = {k: r.rows(len(v), hidden) for k, v in leaves.items() if v}
        out = DutySlice(key, shape, positions, counts, router, leaves, inputs, outputs, tuple(ids[:n_prompt]),
                        tuple(ids[n_prompt:]), artifact_root, fp_hash)
    elif key.expert == ROUTER:
        if key.layer >= layers:
            raise InvalidMoe(f"{key} is not a duty of this model", MoeReason.EXPERT_UNKNOWN)
        router = _read_router(r, layers * positions, top_k, router_root)
        out = DutySlice(key, shape, positions, counts, router, inputs=r.rows(positions, hidden))
    else:
        if key.layer >= layers or key.expert >= experts:
            raise InvalidMoe(f"{key} is not a duty of this model", MoeReason.EXPERT_UNKNOWN)
        count, root = entries[keys.index(key)]
        leaves_of = r.expert_leaves(key, count)
        _check_root(key, leaves_of, root)
        out = DutySlice(key, shape, positions, counts, experts={key: leaves_of}, inputs=r.rows(count, hidden))
    if r.at != len(raw):
        raise InvalidMoe(f"{len(raw) - r.at} bytes after the slice", MoeReason.MOE_MALFORMED)
    return out


def _read_router(r: _Reader, count: int, top_k: int, router_root: bytes) -> tuple[RouterLeaf, ...]:
    raws = [r.take(router_leaf_size(top_k)) for _ in range(count)]
    if compute_merkle_root([compute_leaf_hash(x) for x in raws]) != router_root:
        raise InvalidMoe("the router leaves do not rebuild routerRoot", MoeReason.EXPERT_ROOT_MISMATCH)
    return tuple(decode_router_leaf(x, top_k) for x in raws)


__all__ = ["MAX_POSITIONS", "MAX_SLICE", "DutySlice", "MoeShape", "compute_max_slice_size", "decode_duty_slice",
           "encode_duty_slice"]

"""Memory stuffing: nonce-seeded labels stacked in layers, in the spirit of stacked depth-robust graphs (pure).

The stuffing is N blocks of B bytes (W = B/8 uint64 words). It is built in L layers; only the last is kept.
Block i of layer l mixes the seeded key of (l, i), block i−1 of the same layer (a sequential chain, so the
work cannot be parallelised), and block i plus ``parents`` seeded random blocks of layer l−1 (an expander,
so every block depends on most of the layer below). The mix is murmur3's 64-bit finaliser with a
data-dependent rotate-and-xor between two rounds: each step doubles a word's dependencies, so after a dozen
chained steps every word depends on every word of the blocks below and no lane can be recomputed alone.

Why this and not a per-label hash or scrypt: any label that is a fast expansion of a short state (a
sha256/SHAKE squeeze, scrypt's final PBKDF2 step) can be stored as that state and re-expanded on demand, so
the label would cost its prover nothing to drop. Here nothing short determines a block except the seed,
and from the seed a dropped last-layer block needs its cone: the lower layers' chains up to its parents,
which reach across the layer (see ``compute_cone_costs``). The honest prover pays L·N block steps once
(the fill); an attacker who evicted a block pays its cone, Z, which is most of a fill, every time it is
challenged. The same code recomputes the stuffing for the verifier. numpy vectorises each block step.
No security proof is claimed (Filecoin's SDR has one for its graph; this is a simulation's construction).
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

import numpy as np

from node.spotcheck.errors import InvalidSpotParams

DOMAIN = b"verinfer/spotcheck/stuffing/v1"
GOLDEN = np.uint64(0x9E3779B97F4A7C15)
M1 = np.uint64(0xFF51AFD7ED558CCD)
M2 = np.uint64(0xC4CEB9FE1A85EC53)
SHIFT = np.uint64(33)
MAX_BLOCKS = 1 << 22


@dataclass(frozen=True)
class StuffingParams:
    """Shape of one device's stuffing: n_blocks blocks of block_bytes, built in `layers` layers."""

    n_blocks: int
    block_bytes: int = 16384
    layers: int = 8
    parents: int = 2

    def __post_init__(self) -> None:
        if not (64 <= self.block_bytes <= 1 << 22 and self.block_bytes % 64 == 0):
            raise InvalidSpotParams(f"block of {self.block_bytes} bytes; a multiple of 64 in [64, 4 MiB] is needed")
        if not 2 <= self.n_blocks <= MAX_BLOCKS:
            raise InvalidSpotParams(f"{self.n_blocks} blocks outside [2, {MAX_BLOCKS}]")
        if not 1 <= self.layers <= 64 or not 0 <= self.parents <= 8:
            raise InvalidSpotParams(f"{self.layers} layers / {self.parents} parents outside [1, 64] / [0, 8]")

    @property
    def words(self) -> int:
        """Return the uint64 words per block."""
        return self.block_bytes // 8

    @property
    def total_bytes(self) -> int:
        """Return the bytes the kept (last) layer occupies."""
        return self.n_blocks * self.block_bytes


@dataclass(frozen=True)
class LayerPlan:
    """The seeded keys (one per block) and parent indices (n_blocks × parents) of one layer."""

    keys: np.ndarray
    parents: np.ndarray


def compute_layer_plan(seed: bytes, params: StuffingParams, layer: int) -> LayerPlan:
    """Return the keys and parents of one layer, drawn from PCG64 seeded by sha256(domain ‖ seed ‖ layer)."""
    if len(seed) < 16:
        raise InvalidSpotParams(f"stuffing seed of {len(seed)} bytes; at least 16 are needed")
    digest = hashlib.sha256(DOMAIN + seed + struct.pack(">I", layer)).digest()
    bits = np.random.PCG64(int.from_bytes(digest, "big"))
    keys = bits.random_raw(params.n_blocks).astype(np.uint64)
    parents = np.random.Generator(bits).integers(0, params.n_blocks, size=(params.n_blocks, params.parents))
    return LayerPlan(keys=keys, parents=parents.astype(np.int64))


def _fmix(acc: np.ndarray, tmp: np.ndarray) -> None:
    for mult in (M1, M2):
        np.right_shift(acc, SHIFT, out=tmp)
        np.bitwise_xor(acc, tmp, out=acc)
        np.multiply(acc, mult, out=acc)
    np.right_shift(acc, SHIFT, out=tmp)
    np.bitwise_xor(acc, tmp, out=acc)


def compute_block(out: np.ndarray, lane: np.ndarray, key: np.uint64, chain_prev: np.ndarray | None,
                  below: np.ndarray | None, below_index: int, parents: np.ndarray, tmp: np.ndarray) -> None:
    """Write one block: mix(lane ⊕ key ⊕ chain predecessor ⊕ block below ⊕ parents below) into `out`."""
    np.bitwise_xor(lane, key, out=out)
    if chain_prev is not None:
        np.bitwise_xor(out, chain_prev, out=out)
    if below is not None:
        np.bitwise_xor(out, below[below_index], out=out)
        for p in parents:
            np.bitwise_xor(out, below[p], out=out)
    _fmix(out, tmp)
    shift = 1 + int(out[0] % np.uint64(out.size - 1))
    np.bitwise_xor(out, np.roll(out, shift), out=out)
    _fmix(out, tmp)


def get_lane(params: StuffingParams) -> np.ndarray:
    """Return the per-word constant (word index × golden ratio), which keeps words of one block distinct."""
    return np.arange(params.words, dtype=np.uint64) * GOLDEN


def compute_layer(plan: LayerPlan, params: StuffingParams, below: np.ndarray | None, out: np.ndarray,
                  upto: int) -> None:
    """Fill blocks [0, upto) of one layer into `out` (shape n × words) from the layer below (None for layer 0)."""
    lane = get_lane(params)
    tmp = np.empty(params.words, dtype=np.uint64)
    for i in range(upto):
        compute_block(out[i], lane, plan.keys[i], out[i - 1] if i else None, below, i, plan.parents[i], tmp)


def compute_stuffing(seed: bytes, params: StuffingParams, out: np.ndarray) -> None:
    """Write the kept (last) layer of the stuffing into `out` (uint64, n_blocks × words), using one spare layer."""
    if out.shape != (params.n_blocks, params.words) or out.dtype != np.uint64:
        raise InvalidSpotParams(f"stuffing buffer {out.shape} {out.dtype}; ({params.n_blocks}, {params.words}) "
                                "uint64 is needed")
    spare = np.empty_like(out)
    # alternate between `out` and the spare so that the last layer lands in `out`
    buffers = [out, spare] if params.layers % 2 == 1 else [spare, out]
    below: np.ndarray | None = None
    for layer in range(params.layers):
        target = buffers[layer % 2]
        compute_layer(compute_layer_plan(seed, params, layer), params, below, target, params.n_blocks)
        below = target


def compute_cone_costs(seed: bytes, params: StuffingParams) -> np.ndarray:
    """Return, per kept block, the block steps needed to recompute it when its chain predecessor is kept.

    Layer L−2 is needed up to max(i, parents of i); each lower layer up to the largest index (or parent)
    that the prefix above reaches: the lower layers are never stored, so the chain forces whole prefixes.
    """
    plans = [compute_layer_plan(seed, params, layer) for layer in range(params.layers)]
    index = np.arange(params.n_blocks, dtype=np.int64)
    cost = np.ones(params.n_blocks, dtype=np.int64)
    if params.layers == 1:
        return cost
    reach = np.maximum(index, plans[-1].parents.max(axis=1, initial=0))
    for layer in range(params.layers - 2, -1, -1):
        cost += reach + 1
        if layer == 0:
            break
        prefix_max = np.maximum.accumulate(np.maximum(index, plans[layer].parents.max(axis=1, initial=0)))
        reach = prefix_max[reach]
    return cost


def compute_block_on_demand(seed: bytes, params: StuffingParams, index: int, chain_prev: np.ndarray | None
                            ) -> np.ndarray:
    """Recompute kept block `index` from the seed and its kept predecessor (None only for block 0): its cone."""
    if not 0 <= index < params.n_blocks or (index > 0) != (chain_prev is not None):
        raise InvalidSpotParams(f"block {index} of {params.n_blocks} needs exactly its predecessor")
    plans = [compute_layer_plan(seed, params, layer) for layer in range(params.layers)]
    lane = get_lane(params)
    tmp = np.empty(params.words, dtype=np.uint64)
    out = np.empty(params.words, dtype=np.uint64)
    if params.layers == 1:
        compute_block(out, lane, plans[0].keys[index], chain_prev, None, index, plans[0].parents[index], tmp)
        return out
    index_all = np.arange(params.n_blocks, dtype=np.int64)
    needed = [0] * params.layers
    needed[-2] = int(max(index, int(plans[-1].parents[index].max(initial=0)))) + 1
    for layer in range(params.layers - 2, 0, -1):
        top = needed[layer]
        reach = np.maximum(index_all[:top], plans[layer].parents[:top].max(axis=1, initial=0))
        needed[layer - 1] = int(reach.max()) + 1
    below: np.ndarray | None = None
    for layer in range(params.layers - 1):
        # lower layers' prefixes never exceed the layer size, so a full-size buffer holds any prefix
        target = np.empty((params.n_blocks, params.words), dtype=np.uint64)
        compute_layer(plans[layer], params, below, target, needed[layer])
        below = target
    plan = plans[-1]
    compute_block(out, lane, plan.keys[index], chain_prev, below, index, plan.parents[index], tmp)
    return out


def compute_n_blocks(declared_bytes: int, state_bytes: int, block_bytes: int) -> int:
    """Return how many stuffing blocks fill a declared capacity after the identifying state."""
    n = (declared_bytes - state_bytes) // block_bytes
    if n < 2:
        raise InvalidSpotParams(f"{declared_bytes} bytes leave room for {n} blocks of {block_bytes} after the state")
    return n

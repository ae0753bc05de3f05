"""The training-state root: one 32-byte binding of everything the next training step depends on.

Z(t) = parameters ‖ momentum (float32) is cut per segment (0 = parameters, 1 = momentum) into chunks of
CHUNK_ENTRIES entries (the last chunk of a segment may be shorter). Chunk j of segment s is the leaf

    leaf(s, j) = keccak256(uint8 s ‖ uint64 j ‖ uint64 len ‖ BLAKE3-256(the chunk's float32 little-endian bytes))

and the chunk root is the OpenZeppelin-compatible Merkle root (node.protocol.merkle) over the leaves in segment
then chunk order (each leaf names its segment and index, so the sorted-pair tree still binds the order). Then

    state_root = keccak256("verinfer-training-state-v2" ‖ uint64 step ‖ uint64 cursor ‖ uint64 n_params
                           ‖ uint64 n_momentum ‖ uint32 CHUNK_ENTRIES ‖ chunk root)

where step is the optimiser's step counter and cursor the data cursor: samples of the declared order consumed so
far (step × workers × batch per worker). SGD with momentum has no other state (no RNG: no dropout).

v2 (issue 30): the chunk digest is BLAKE3 instead of sha256 (2.9× the throughput on one core here, the cost every
prover step pays), and the chunks are numbered globally (segment 0's, then segment 1's) so that N data-parallel
replicas, which hold the same state, can each hash the chunks j ≡ rank (mod N) (`get_chunk_shard`).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np
from blake3 import blake3

from node.protocol.hashing import keccak256
from node.protocol.ledger import InvalidTraining, TrainingReason
from node.protocol.merkle import compute_merkle_root

STATE_DOMAIN = b"verinfer-training-state-v2"  # v2: BLAKE3 chunk digests
CHUNK_ENTRIES = 1 << 20  # 4 MiB of float32 per leaf
SEGMENTS = ("params", "momentum")


def get_chunk_bounds(size: int, chunk: int = CHUNK_ENTRIES) -> list[tuple[int, int]]:
    """Return the (start, end) entries of each chunk of a segment of `size` entries (none when empty)."""
    return [(i, min(i + chunk, size)) for i in range(0, size, chunk)]


def compute_chunk_digest(values: np.ndarray) -> bytes:
    """Return BLAKE3-256 of a chunk's float32 little-endian bytes (refusing any other dtype)."""
    if values.dtype != np.float32 or values.ndim != 1:
        raise InvalidTraining(f"state chunk of dtype {values.dtype}, shape {values.shape}",
                              TrainingReason.CHECKPOINT_DTYPE)
    data = np.ascontiguousarray(values, dtype="<f4")  # no copy on a little-endian host
    return blake3(data.data.cast("B")).digest()  # the array's own buffer: no bytes copy; one thread


def compute_leaf(segment: int, index: int, length: int, digest: bytes) -> bytes:
    """Return the leaf of chunk `index` of a segment: keccak256(uint8 segment ‖ uint64 index ‖ uint64 len ‖ digest)."""
    return keccak256(struct.pack(">BQQ", segment, index, length) + digest)


def compute_root_from_digests(step: int, cursor: int, sizes: tuple[int, int],
                              digests: Sequence[Sequence[bytes]]) -> bytes:
    """Return the state root from each segment's chunk digests (in chunk order)."""
    leaves = []
    for segment, (size, seg_digests) in enumerate(zip(sizes, digests, strict=True)):
        bounds = get_chunk_bounds(size)
        if len(bounds) != len(seg_digests):
            raise InvalidTraining(f"{len(seg_digests)} digests for {len(bounds)} chunks of {SEGMENTS[segment]}",
                                  TrainingReason.LEDGER_MALFORMED, step)
        pairs = zip(bounds, seg_digests, strict=True)
        leaves += [compute_leaf(segment, j, end - start, d) for j, ((start, end), d) in enumerate(pairs)]
    header = struct.pack(">QQQQI", step, cursor, sizes[0], sizes[1], CHUNK_ENTRIES)
    return keccak256(STATE_DOMAIN + header + compute_merkle_root(leaves))


def compute_segment_digests(values: np.ndarray) -> list[bytes]:
    """Return the chunk digests of one segment."""
    return [compute_chunk_digest(values[start:end]) for start, end in get_chunk_bounds(values.size)]


def get_chunk_shard(sizes: tuple[int, int], rank: int, ranks: int) -> list[tuple[int, int]]:
    """Return the (segment, chunk index) pairs a replica of `ranks` hashes: global chunk order, every ranks-th."""
    if not 0 <= rank < ranks:
        raise InvalidTraining(f"rank {rank} of {ranks}", TrainingReason.LEDGER_MALFORMED)
    chunks = [(s, j) for s, size in enumerate(sizes) for j in range(len(get_chunk_bounds(size)))]
    return chunks[rank::ranks]


def compute_shard_digests(params: np.ndarray, momentum: np.ndarray, rank: int,
                          ranks: int) -> dict[tuple[int, int], bytes]:
    """Return the chunk digests of one replica's shard of Z = params ‖ momentum."""
    segments = (params, momentum)
    shard = get_chunk_shard((params.size, momentum.size), rank, ranks)
    bounds = [get_chunk_bounds(v.size) for v in segments]
    return {(s, j): compute_chunk_digest(segments[s][slice(*bounds[s][j])]) for s, j in shard}


def compute_root_from_shards(step: int, cursor: int, sizes: tuple[int, int],
                             shards: Sequence[dict[tuple[int, int], bytes]]) -> bytes:
    """Return the state root from the replicas' shard digests (every chunk exactly once)."""
    merged: dict[tuple[int, int], bytes] = {}
    for shard in shards:
        if merged.keys() & shard.keys():
            raise InvalidTraining("a chunk digest given twice", TrainingReason.LEDGER_MALFORMED, step)
        merged |= shard
    counts = [len(get_chunk_bounds(size)) for size in sizes]
    if set(merged) != {(s, j) for s, n in enumerate(counts) for j in range(n)}:
        raise InvalidTraining("the shards do not cover the state's chunks", TrainingReason.LEDGER_MALFORMED, step)
    digests = [[merged[(s, j)] for j in range(n)] for s, n in enumerate(counts)]
    return compute_root_from_digests(step, cursor, sizes, digests)


def compute_state_root(params: np.ndarray, momentum: np.ndarray, step: int, cursor: int) -> bytes:
    """Return the state root of Z = params ‖ momentum after `step` steps with `cursor` samples consumed."""
    return compute_root_from_digests(step, cursor, (params.size, momentum.size),
                                     (compute_segment_digests(params), compute_segment_digests(momentum)))


def compute_data_cursor(step: int, global_batch: int) -> int:
    """Return the data cursor after a step: samples of the declared order consumed (step × global batch)."""
    return step * global_batch

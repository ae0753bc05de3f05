"""The training-state root: an independent re-implementation, a golden vector, and that it binds every entry."""

import struct

import numpy as np
import pytest
import sha3
from blake3 import blake3
from hypothesis import given, settings
from hypothesis import strategies as st

from node.protocol.ledger import InvalidTraining, LedgerEntry, compute_entry_head, compute_genesis_head, seal_entry
from node.protocol.training_state import (
    CHUNK_ENTRIES,
    compute_data_cursor,
    compute_root_from_digests,
    compute_root_from_shards,
    compute_segment_digests,
    compute_shard_digests,
    compute_state_root,
    get_chunk_shard,
)


def keccak(b: bytes) -> bytes:
    return sha3.keccak_256(b).digest()


def reference_root(params: np.ndarray, momentum: np.ndarray, step: int, cursor: int, chunk: int) -> bytes:
    """The encoding of docs/training.md, spelled out independently (plain loops, OpenZeppelin sorted pairs)."""
    leaves = []
    for segment, values in enumerate((params, momentum)):
        for j, start in enumerate(range(0, values.size, chunk)):
            part = values[start:start + chunk]
            digest = blake3(part.astype("<f4").tobytes()).digest()
            leaves.append(keccak(bytes([segment]) + j.to_bytes(8, "big") + part.size.to_bytes(8, "big") + digest))
    layer = leaves or [b"\x00" * 32]
    while len(layer) > 1:
        nxt = [keccak(min(a, b) + max(a, b)) for a, b in zip(layer[::2], layer[1::2], strict=False)]
        layer = nxt + ([layer[-1]] if len(layer) % 2 else [])
    header = b"verinfer-training-state-v2" + struct.pack(">QQQQI", step, cursor, params.size, momentum.size, chunk)
    return keccak(header + layer[0])


def test_golden_vector():
    params = (np.arange(5, dtype=np.float32) - 2) / 8
    momentum = np.array([0.0, -0.0, 1e-3, 3.5, -7.25], dtype=np.float32)
    root = compute_state_root(params, momentum, 3, 12)
    assert root == reference_root(params, momentum, 3, 12, CHUNK_ENTRIES)
    assert root.hex() == "8835fd6a11d348a8030fd489a8e8b767258f1c4722f3e2f3de9029221ba2d581"


def test_a_multi_chunk_state_matches_the_reference_and_binds_step_and_cursor():
    rng = np.random.default_rng(0)
    params = rng.standard_normal(2 * CHUNK_ENTRIES + 17).astype(np.float32)
    momentum = rng.standard_normal(CHUNK_ENTRIES).astype(np.float32)
    root = compute_state_root(params, momentum, 7, compute_data_cursor(7, 4))
    assert root == reference_root(params, momentum, 7, 28, CHUNK_ENTRIES)
    assert root != compute_state_root(params, momentum, 8, 28)
    assert root != compute_state_root(params, momentum, 7, 32)
    # where the parameters end is bound: moving one entry from params to momentum changes the root
    assert root != compute_state_root(params[:-1], np.concatenate([params[-1:], momentum]), 7, 28)
    digests = (compute_segment_digests(params), compute_segment_digests(momentum))
    assert compute_root_from_digests(7, 28, (params.size, momentum.size), digests) == root
    with pytest.raises(InvalidTraining):
        compute_root_from_digests(7, 28, (params.size, momentum.size), (digests[0][:-1], digests[1]))


def test_only_float32_is_hashed():
    with pytest.raises(InvalidTraining):
        compute_state_root(np.zeros(3, dtype=np.float64), np.zeros(3, dtype=np.float32), 0, 0)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 300), index=st.integers(0, 10**6), bits=st.integers(0, 31), step=st.integers(0, 2**20))
def test_any_changed_bit_anywhere_changes_the_root(n, index, bits, step):
    rng = np.random.default_rng(n)
    z = rng.standard_normal(2 * n).astype(np.float32)
    root = compute_state_root(z[:n], z[n:], step, step * 4)
    other = z.copy()
    other.view(np.uint32)[index % (2 * n)] ^= np.uint32(1 << bits)
    assert compute_state_root(other[:n], other[n:], step, step * 4) != root


def test_the_ledger_head_binds_the_state_root():
    run = bytes(range(32))
    entry = seal_entry(LedgerEntry(run_id=run, step=0, prev_head=compute_genesis_head(run), positions=(1,),
                                   values=(0.5,), batch_roots=(), lsh=(), replica_lsh=(), state_root=b"\x01" * 32))
    moved = LedgerEntry(**{**entry.__dict__, "state_root": b"\x02" * 32})
    assert compute_entry_head(moved) != entry.head
    with pytest.raises(InvalidTraining):
        compute_entry_head(LedgerEntry(**{**entry.__dict__, "state_root": b"\x02" * 31}))


@pytest.mark.parametrize("ranks", [1, 2, 3, 5])
def test_replicas_hashing_their_shards_give_the_same_root(ranks):
    """Data-parallel replicas hash every ranks-th chunk (global order); the merged digests give the one root."""
    rng = np.random.default_rng(ranks)
    params = rng.standard_normal(2 * CHUNK_ENTRIES + 5).astype(np.float32)
    momentum = rng.standard_normal(CHUNK_ENTRIES + 3).astype(np.float32)
    shards = [compute_shard_digests(params, momentum, r, ranks) for r in range(ranks)]
    sizes = (params.size, momentum.size)
    assert sum(len(get_chunk_shard(sizes, r, ranks)) for r in range(ranks)) == 5
    assert compute_root_from_shards(4, 16, sizes, shards) == compute_state_root(params, momentum, 4, 16)


def test_shards_must_cover_every_chunk_exactly_once():
    params, momentum = np.ones(CHUNK_ENTRIES + 1, np.float32), np.ones(3, np.float32)
    sizes = (params.size, momentum.size)
    a, b = (compute_shard_digests(params, momentum, r, 2) for r in range(2))
    with pytest.raises(InvalidTraining):
        compute_root_from_shards(1, 4, sizes, [a])  # a replica's shard missing
    with pytest.raises(InvalidTraining):
        compute_root_from_shards(1, 4, sizes, [a, b, a])  # given twice
    with pytest.raises(InvalidTraining):
        get_chunk_shard(sizes, 2, 2)

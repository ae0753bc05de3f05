import numpy as np
import pytest

from node.spotcheck.answers import (
    STATE_SKETCH_DIM,
    compute_challenge_indices,
    compute_labels_digest,
    compute_state_answer,
    compute_state_distance,
)
from node.spotcheck.errors import InvalidSpotParams

NONCE = bytes(range(32))


def test_indices_are_distinct_sorted_and_fixed_by_the_nonce():
    a = compute_challenge_indices(NONCE, 1000, 64)
    assert len(set(a.tolist())) == 64 and list(a) == sorted(a) and a.max() < 1000
    assert np.array_equal(a, compute_challenge_indices(NONCE, 1000, 64))
    assert not np.array_equal(a, compute_challenge_indices(bytes(32), 1000, 64))
    assert len(compute_challenge_indices(NONCE, 10, 64)) == 10


def test_indices_cover_the_pool_uniformly():
    hits = np.zeros(100)
    for k in range(400):
        hits[compute_challenge_indices(k.to_bytes(32, "big"), 100, 10)] += 1
    assert hits.min() > 15 and hits.max() < 70  # mean 40


def test_the_labels_digest_changes_with_one_bit_of_one_named_block():
    blocks = np.arange(64 * 8, dtype=np.uint64).reshape(64, 8)
    idx = compute_challenge_indices(NONCE, 64, 4)
    d = compute_labels_digest(NONCE, idx, blocks)
    flipped = blocks.copy()
    flipped[idx[2], 5] ^= np.uint64(1 << 40)
    assert compute_labels_digest(NONCE, idx, flipped) != d
    other = blocks.copy()
    unnamed = next(i for i in range(64) if i not in set(idx.tolist()))
    other[unnamed] = 0
    assert compute_labels_digest(NONCE, idx, other) == d


def test_state_answers_follow_the_state_and_the_nonce():
    state = np.random.default_rng(0).standard_normal((32, 128)).astype(np.float32)
    a = compute_state_answer(state, NONCE)
    assert len(a) == STATE_SKETCH_DIM and compute_state_answer(state, NONCE) == a
    assert compute_state_distance(a, compute_state_answer(state, bytes(32))) > 100
    older = state.copy()
    older[-1] += 0.5
    assert compute_state_distance(a, compute_state_answer(older, NONCE)) > 10
    assert compute_state_distance(a, a[:-1]) == 1 << 31


def test_nonce_must_be_32_bytes():
    with pytest.raises(InvalidSpotParams):
        compute_challenge_indices(b"x" * 31, 10, 1)
    with pytest.raises(InvalidSpotParams):
        compute_state_answer(np.zeros(4, dtype=np.float32), b"")

import pytest
from hypothesis import given
from hypothesis import strategies as st

from node.errors import InvalidParams
from node.protocol.hashing import ZERO32, keccak256
from node.protocol.merkle import (
    compute_leaf_hash,
    compute_merkle_proof,
    compute_merkle_root,
    compute_pair_hash,
    verify_merkle_proof,
)


def h(j: int) -> bytes:
    return keccak256(bytes([j]))


def sorted_pair(a: bytes, b: bytes) -> bytes:
    return keccak256(min(a, b) + max(a, b))


def test_leaf_hash_is_double_keccak():
    assert compute_leaf_hash(b"leaf") == keccak256(keccak256(b"leaf"))


def test_pair_hash_is_commutative_and_sorted():
    a, b = h(1), h(2)
    assert compute_pair_hash(a, b) == compute_pair_hash(b, a) == sorted_pair(a, b)


def test_three_leaf_tree_by_hand():
    a, b, c = h(0), h(1), h(2)
    # Layer 1: (a,b) hashed, c carried up; root = pair(pair(a,b), c).
    assert compute_merkle_root([a, b, c]) == sorted_pair(sorted_pair(a, b), c)
    assert compute_merkle_proof([a, b, c], 2) == [sorted_pair(a, b)]
    assert compute_merkle_proof([a, b, c], 0) == [b, c]


def test_five_leaf_tree_by_hand():
    x = [h(j) for j in range(5)]
    ab, cd = sorted_pair(x[0], x[1]), sorted_pair(x[2], x[3])
    assert compute_merkle_root(x) == sorted_pair(sorted_pair(ab, cd), x[4])
    assert compute_merkle_proof(x, 4) == [sorted_pair(ab, cd)]


def test_edge_sizes():
    assert compute_merkle_root([]) == ZERO32
    assert compute_merkle_root([h(7)]) == h(7)
    assert compute_merkle_proof([h(7)], 0) == []
    with pytest.raises(InvalidParams):
        compute_merkle_proof([h(7)], 1)


@given(st.integers(1, 70), st.data())
def test_every_proof_verifies_and_tampering_fails(n, data):
    leaves = [keccak256(j.to_bytes(4, "big")) for j in range(n)]
    root = compute_merkle_root(leaves)
    i = data.draw(st.integers(0, n - 1))
    proof = compute_merkle_proof(leaves, i)
    assert verify_merkle_proof(leaves[i], proof, root)
    assert not verify_merkle_proof(keccak256(b"other"), proof, root)
    if proof:
        j = data.draw(st.integers(0, len(proof) - 1))
        bad = list(proof)
        bad[j] = keccak256(bad[j])
        assert not verify_merkle_proof(leaves[i], bad, root)

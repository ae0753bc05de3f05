"""Merkle tree compatible with OpenZeppelin's MerkleProof (sorted-pair keccak256, double-hashed leaves).

Layers are built pairwise left to right; an odd node at the end of a layer is carried up
unchanged, so its proof simply has no sibling for that layer. The root of no leaves is 32 zero bytes.
"""

from __future__ import annotations

from collections.abc import Sequence

from node.protocol.errors import InvalidParams, Reason
from node.protocol.hashing import ZERO32, keccak256, keccak256_many


def compute_leaf_hash(encoded_leaf: bytes) -> bytes:
    """Return keccak256(keccak256(encoded_leaf)), OpenZeppelin's leaf convention."""
    return keccak256(keccak256(encoded_leaf))


def compute_pair_hash(a: bytes, b: bytes) -> bytes:
    """Return keccak256 of the sorted pair (a, b), as MerkleProof's commutative hash."""
    return keccak256(a + b) if a <= b else keccak256(b + a)


def compute_next_layer(layer: Sequence[bytes]) -> list[bytes]:
    """Return the parent layer: sorted-pair hashes, an odd last node carried up."""
    left, right = layer[0:len(layer) - 1:2], layer[1::2]
    parents = keccak256_many(a + b if a <= b else b + a for a, b in zip(left, right, strict=True))
    if len(layer) % 2:
        parents.append(layer[-1])
    return parents


def compute_merkle_root(leaf_hashes: Sequence[bytes]) -> bytes:
    """Return the root over leaf hashes (32 zero bytes for none)."""
    if not leaf_hashes:
        return ZERO32
    layer = list(leaf_hashes)
    while len(layer) > 1:
        layer = compute_next_layer(layer)
    return layer[0]


def compute_merkle_proof(leaf_hashes: Sequence[bytes], index: int) -> list[bytes]:
    """Return the sibling hashes from leaf index up to the root."""
    if not 0 <= index < len(leaf_hashes):
        raise InvalidParams(f"leaf index {index} outside [0, {len(leaf_hashes)})", Reason.OUT_OF_RANGE)
    proof: list[bytes] = []
    layer = list(leaf_hashes)
    while len(layer) > 1:
        sibling = index ^ 1
        if sibling < len(layer):
            proof.append(layer[sibling])
        layer = compute_next_layer(layer)
        index //= 2
    return proof


def compute_root_from_proof(leaf_hash: bytes, proof: Sequence[bytes]) -> bytes:
    """Return the root implied by a leaf hash and its proof (MerkleProof.processProof)."""
    node = leaf_hash
    for sibling in proof:
        node = compute_pair_hash(node, sibling)
    return node


def verify_merkle_proof(leaf_hash: bytes, proof: Sequence[bytes], root: bytes) -> bool:
    """Check whether proof links leaf_hash to root (MerkleProof.verify)."""
    return compute_root_from_proof(leaf_hash, proof) == root

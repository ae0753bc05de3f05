"""The stock-sampler commitment (docs/protocol.md §13.1) is pinned."""

from node.protocol.artifact import compute_output_hash
from node.protocol.hashing import keccak256
from node.protocol.stock import STOCK_ARTIFACT_ROOT, compute_stock_commitment, is_stock_commitment


def test_the_stock_artifact_root_is_the_documented_tag():
    assert STOCK_ARTIFACT_ROOT == keccak256(b"verinfer/stock-sampler/v1")
    assert STOCK_ARTIFACT_ROOT.hex() == "35a917e0ed8b8236bbdcf3d394ace08003c07806c92c0ba07fdf95e46d8fd812"


def test_a_stock_commitment_is_the_output_hash_the_tag_and_no_fingerprint():
    output_hash, root, fingerprint_hash = compute_stock_commitment([5, 17, 2])
    assert output_hash == compute_output_hash([5, 17, 2]) and root == STOCK_ARTIFACT_ROOT
    assert fingerprint_hash == bytes(32)
    assert is_stock_commitment(root, fingerprint_hash)
    assert not is_stock_commitment(keccak256(b"a merkle root"), fingerprint_hash)
    assert not is_stock_commitment(root, b"\x01" * 32)

"""Golden vectors: the committed protocol_v1.json is what the code computes, to the bit."""

import importlib.util
import json
from pathlib import Path

import pytest

from node.protocol.artifact import decode_artifact_wire, encode_artifact
from node.protocol.hashing import keccak256
from node.protocol.merkle import verify_merkle_proof

ROOT = Path(__file__).resolve().parent.parent
VECTORS = json.loads((ROOT / "tests" / "vectors" / "protocol_v1.json").read_text())


def load_generator():
    spec = importlib.util.spec_from_file_location("make_vectors", ROOT / "scripts" / "make_vectors.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def strip_wire(vectors):
    return {**vectors, "artifact": [{k: v for k, v in a.items() if k != "wire"} for a in vectors["artifact"]]}


def test_code_reproduces_the_committed_vectors():
    # The wire bytes depend on the zstd library's compressor; they are checked by decoding below.
    assert strip_wire(load_generator().build_vectors()) == strip_wire(VECTORS)


@pytest.mark.parametrize("case", VECTORS["artifact"], ids=lambda c: f"n={len(c['leaves'])}")
def test_committed_wire_decodes_to_committed_encoding(case):
    art = decode_artifact_wire(bytes.fromhex(case["wire"][2:]))
    expected = bytes.fromhex(case["header"][2:]) + b"".join(bytes.fromhex(x[2:]) for x in case["leaves"])
    assert encode_artifact(art) == expected
    assert "0x" + art.root.hex() == case["artifact_root"]


@pytest.mark.parametrize("case", VECTORS["artifact"], ids=lambda c: f"n={len(c['leaves'])}")
def test_committed_proofs_verify_against_positions_root(case):
    root = bytes.fromhex(case["positions_root"][2:])
    for leaf, proof in zip(case["leaves"], case["proofs"], strict=True):
        leaf_hash = keccak256(keccak256(bytes.fromhex(leaf[2:])))
        assert verify_merkle_proof(leaf_hash, [bytes.fromhex(p[2:]) for p in proof], root)

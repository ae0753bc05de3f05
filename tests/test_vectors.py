"""Golden vectors: the committed protocol_v1.json is what the code computes, to the bit."""

import importlib.util
import json
from pathlib import Path

import pytest

from node.protocol.artifact import WIRE_V3, decode_artifact_wire, decode_columns, decode_columns_v3, encode_artifact
from node.protocol.errors import Reason
from node.protocol.hashing import keccak256
from node.protocol.merkle import verify_merkle_proof
from node.protocol.sequence import find_leaf_termination_violation

ROOT = Path(__file__).resolve().parent.parent
VECTORS = json.loads((ROOT / "tests" / "vectors" / "protocol_v1.json").read_text())


def load_generator():
    spec = importlib.util.spec_from_file_location("make_vectors", ROOT / "scripts" / "make_vectors.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def strip_wire(vectors):
    wires = ("wire", "wire_v3")
    return {**vectors, "artifact": [{k: v for k, v in a.items() if k not in wires} for a in vectors["artifact"]]}


def test_code_reproduces_the_committed_vectors():
    # The wire bytes depend on the zstd library's compressor; they are checked by decoding below.
    assert strip_wire(load_generator().build_vectors()) == strip_wire(VECTORS)


@pytest.mark.parametrize("case", VECTORS["artifact"], ids=lambda c: f"n={len(c['leaves'])}")
def test_committed_wire_decodes_to_committed_encoding(case):
    expected = bytes.fromhex(case["header"][2:]) + b"".join(bytes.fromhex(x[2:]) for x in case["leaves"])
    for wire in (case["wire"], case["wire_v3"]):  # v2, v3
        art = decode_artifact_wire(bytes.fromhex(wire[2:]))
        assert encode_artifact(art) == expected
        assert "0x" + art.root.hex() == case["artifact_root"]
    assert case["wire_v3"][2:4] == WIRE_V3.hex()


@pytest.mark.parametrize("case", VECTORS["artifact"], ids=lambda c: f"n={len(c['leaves'])}")
def test_committed_proofs_verify_against_positions_root(case):
    root = bytes.fromhex(case["positions_root"][2:])
    for leaf, proof in zip(case["leaves"], case["proofs"], strict=True):
        leaf_hash = keccak256(keccak256(bytes.fromhex(leaf[2:])))
        assert verify_merkle_proof(leaf_hash, [bytes.fromhex(p[2:]) for p in proof], root)


@pytest.mark.parametrize("case", VECTORS["termination_leaf"], ids=lambda c: c["name"])
def test_termination_cases_are_valid_prove_termination_inputs(case):
    # what proveTermination checks before judging: the leaf (if any) is committed under artifact_root
    header = bytes.fromhex(case["header"][2:])
    positions_root = bytes.fromhex(case["positions_root"][2:])
    assert keccak256(keccak256(header) + positions_root).hex() == case["artifact_root"][2:]
    assert int.from_bytes(header[-4:], "big") == case["output_length"]
    assert int.from_bytes(header[44:48], "big") == case["max_tokens"]
    leaf = bytes.fromhex(case["leaf"][2:])
    if leaf:
        assert verify_merkle_proof(keccak256(keccak256(leaf)), [bytes.fromhex(p[2:]) for p in case["proof"]],
                                   positions_root)
        assert int.from_bytes(leaf[:4], "big") == case["position"]
    else:
        assert case["position"] is None and case["proof"] == []
    judged = find_leaf_termination_violation(leaf, case["k"], case["output_length"], case["max_tokens"],
                                             frozenset(case["stop_token_ids"]))
    assert judged == (case["position"], Reason(case["reason"]))


def test_termination_cases_cover_every_outcome():
    reasons = {(c["position"] is None, c["reason"]) for c in VECTORS["termination_leaf"]}
    assert reasons >= {(False, Reason.OK), (False, Reason.NOT_TERMINATED), (False, Reason.TOKENS_AFTER_STOP),
                       (False, Reason.OUTPUT_TOO_LONG), (True, Reason.NOT_TERMINATED), (True, Reason.OUTPUT_TOO_LONG),
                       (True, Reason.OK)}


@pytest.mark.parametrize("case", VECTORS["artifact"], ids=lambda c: f"n{len(c['leaves'])}")
def test_committed_columns_decode_to_committed_encoding(case):
    art = decode_columns(bytes.fromhex(case["columns"][2:]))
    assert encode_artifact(art).hex() == case["header"][2:] + "".join(leaf[2:] for leaf in case["leaves"])


@pytest.mark.parametrize("case", VECTORS["artifact"], ids=lambda c: f"n{len(c['leaves'])}")
def test_committed_v3_columns_decode_to_committed_encoding(case):
    art = decode_columns_v3(bytes.fromhex(case["columns_v3"][2:]))
    assert encode_artifact(art).hex() == case["header"][2:] + "".join(leaf[2:] for leaf in case["leaves"])

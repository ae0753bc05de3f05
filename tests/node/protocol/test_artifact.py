import struct

import numpy as np
import pytest
import zstandard
from hypothesis import given
from hypothesis import strategies as st

from node.errors import InvalidArtifact, InvalidParams, Reason
from node.executer.synthetic import SyntheticRequest, make_synthetic_artifact
from node.protocol import artifact as A
from node.protocol.hashing import keccak256
from node.protocol.merkle import compute_merkle_root
from node.protocol.sampler import MAX_K, SamplingParams
from tests.node.protocol.strategies import requests


@pytest.fixture
def art():
    req = SyntheticRequest(inference_id=3, user_seed=11, params=SamplingParams(0.7, 0.9, 0, 32), output_length=6,
                           prompt_token_ids=(10, 20, 30, 40))
    return make_synthetic_artifact(req, logits_seed=1)


def test_header_layout_by_hand(art):
    raw = A.encode_header(art.header)
    assert len(raw) == 32 + 5 * 4 + 32 + 4 + 4 * 4 + 4
    assert raw[:32] == art.header.model_id
    assert struct.unpack(">IIIII", raw[32:52]) == (0x3F333333, 0x3F666666, 0, 32, 5)
    assert raw[52:84] == art.header.run_seed
    assert struct.unpack(">I4II", raw[84:]) == (4, 10, 20, 30, 40, 6)


def test_leaf_layout_by_hand(art):
    p = art.positions
    leaf = A.encode_leaf(p, 2)
    assert len(leaf) == A.leaf_size(5) == 68
    assert struct.unpack(">II", leaf[:8]) == (2, p.chosen[2])
    for j in range(5):
        tid, w, lp = struct.unpack(">IIf", leaf[8 + 12 * j:20 + 12 * j])
        assert (tid, w) == (p.token_ids[2, j], p.weights[2, j])
        assert np.float32(lp) == p.raw_logprobs[2, j]


def test_roots_and_output_hash_by_definition(art):
    leaves = A.encode_leaves(art.positions)
    hashes = [keccak256(keccak256(leaves[j:j + 68])) for j in range(0, len(leaves), 68)]
    positions_root = compute_merkle_root(hashes)
    assert art.root == keccak256(keccak256(A.encode_header(art.header)) + positions_root)
    assert A.compute_output_hash(art.positions.chosen) == keccak256(
        b"".join(int(t).to_bytes(4, "big") for t in art.positions.chosen))


@given(requests, st.integers(0, 1000))
def test_wire_round_trip(req, logits_seed):
    art = make_synthetic_artifact(req, logits_seed)
    back = A.decode_artifact_wire(A.encode_artifact_wire(art))
    assert back == art
    assert back.root == art.root
    assert A.encode_artifact(back) == A.encode_artifact(art)


@given(st.binary(max_size=600))
def test_random_bytes_raise_only_invalid_artifact(data):
    for decode in (A.decode_artifact_wire, A.decode_artifact):
        try:
            decode(data)
        except InvalidArtifact:
            pass


@given(st.data())
def test_random_corruption_of_a_valid_wire_raises_only_invalid_artifact(art_data):
    req = SyntheticRequest(inference_id=1, user_seed=2, params=SamplingParams(1.0), output_length=8)
    raw = bytearray(A.encode_artifact(make_synthetic_artifact(req, 0)))
    for _ in range(art_data.draw(st.integers(1, 4))):
        raw[art_data.draw(st.integers(0, len(raw) - 1))] = art_data.draw(st.integers(0, 255))
    for decode, blob in ((A.decode_artifact, bytes(raw)),
                         (A.decode_artifact_wire, zstandard.ZstdCompressor().compress(bytes(raw)))):
        try:
            decode(blob)
        except InvalidArtifact:
            pass


def _raw(art) -> bytearray:
    return bytearray(A.encode_artifact(art))


def _expect(raw: bytes, reason: Reason, position=None):
    with pytest.raises(InvalidArtifact) as err:
        A.decode_artifact(bytes(raw))
    assert err.value.reason is reason
    assert err.value.position == position


def test_truncated_and_trailing(art):
    raw = _raw(art)
    _expect(raw[:-1], Reason.TRUNCATED)
    _expect(raw[:50], Reason.TRUNCATED)
    _expect(raw[:90], Reason.TRUNCATED)  # inside the prompt ids
    _expect(raw + b"\x00", Reason.TRAILING_BYTES)


def test_nan_and_inf_logprobs_are_rejected_with_position(art):
    header_len = len(A.encode_header(art.header))
    for bad in (float("nan"), float("inf"), float("-inf")):
        raw = _raw(art)
        at = header_len + 3 * 68 + 8 + 12 * 1 + 8  # position 3, candidate 1, logprob
        raw[at:at + 4] = struct.pack(">f", bad)
        _expect(raw, Reason.NON_FINITE_LOGPROB, 3)


def test_duplicate_ids_and_bad_index_are_rejected(art):
    header_len = len(A.encode_header(art.header))
    raw = _raw(art)
    first = header_len + 4 * 68 + 8
    raw[first + 12:first + 16] = raw[first:first + 4]  # candidate 1 := candidate 0
    _expect(raw, Reason.DUPLICATE_TOKEN_ID, 4)
    raw = _raw(art)
    raw[header_len + 68:header_len + 72] = struct.pack(">I", 7)
    _expect(raw, Reason.BAD_POSITION_INDEX, 1)


def test_limits_and_non_canonical_header(art):
    raw = _raw(art)
    raw[48:52] = struct.pack(">I", 0)  # K = 0
    _expect(raw, Reason.LIMIT_EXCEEDED)
    raw = _raw(art)
    raw[48:52] = struct.pack(">I", MAX_K + 1)
    _expect(raw, Reason.LIMIT_EXCEEDED)
    raw = _raw(art)
    raw[84:88] = struct.pack(">I", A.MAX_PROMPT_TOKENS + 1)
    _expect(raw, Reason.LIMIT_EXCEEDED)
    raw = _raw(art)
    raw[32:36] = struct.pack(">f", float("nan"))  # temperature
    _expect(raw, Reason.NON_CANONICAL)
    raw = _raw(art)
    raw[36:40] = struct.pack(">f", 1.5)  # top_p
    _expect(raw, Reason.NON_CANONICAL)


def test_wire_rejections(art):
    wire = A.encode_artifact_wire(art)
    with pytest.raises(InvalidArtifact) as err:
        A.decode_artifact_wire(wire + b"\x00")
    assert err.value.reason is Reason.TRAILING_BYTES
    with pytest.raises(InvalidArtifact) as err:
        A.decode_artifact_wire(wire[:-3])
    assert err.value.reason is Reason.WIRE_MALFORMED
    no_size = zstandard.ZstdCompressor(write_content_size=False).compress(A.encode_artifact(art))
    with pytest.raises(InvalidArtifact) as err:
        A.decode_artifact_wire(no_size)
    assert err.value.reason is Reason.WIRE_MALFORMED
    with pytest.raises(InvalidArtifact) as err:
        A.decode_artifact_wire(b"\x00" * (A.MAX_WIRE_BYTES + 1))
    assert err.value.reason is Reason.WIRE_TOO_LARGE


def test_declared_size_over_the_limit_is_refused_before_decompression():
    bomb = zstandard.ZstdCompressor().compress(b"\x00" * (A.MAX_ARTIFACT_BYTES + 1))
    assert len(bomb) < 10_000
    with pytest.raises(InvalidArtifact) as err:
        A.decode_artifact_wire(bomb)
    assert err.value.reason is Reason.ARTIFACT_TOO_LARGE


def test_positions_reject_ragged_or_out_of_range_columns():
    with pytest.raises(InvalidArtifact):
        A.make_positions([1, 2], [[1, 2]], [[1, 1]], [[0.0, 0.0]])
    p = A.make_positions([1], [[1, 2]], [[2**32, 0]], [[0.0, 0.0]])
    with pytest.raises(InvalidArtifact):
        A.encode_leaves(p)


def _with_outside_chosen() -> A.Artifact:
    """Return a synthetic artifact whose position 1 chose a token that is none of its candidates."""
    art = make_synthetic_artifact(SyntheticRequest(inference_id=4, user_seed=5, params=SamplingParams(0.9, 1.0, 0, 16),
                                                   output_length=6, vocab_size=64), 0)
    p = art.positions
    chosen = p.chosen.copy()
    chosen[1] = next(t for t in range(64) if t not in set(p.token_ids[1].tolist()))
    return A.Artifact(art.header, A.make_positions(chosen, p.token_ids, p.weights, p.raw_logprobs))


def test_wire_v2_round_trips_and_v1_stays_accepted(art):
    for case in (art, _with_outside_chosen()):
        v1, v2 = A.encode_artifact_wire(case, version=1), A.encode_artifact_wire(case)
        assert v2[:1] == A.WIRE_V2 and v1[:1] != A.WIRE_V2  # v1 begins with zstd's magic
        assert A.decode_artifact_wire(v1) == case and A.decode_artifact_wire(v2) == case
    slots = A.compute_chosen_slots(_with_outside_chosen().positions)
    assert slots[1] == 5 and (slots[[0, 2, 3, 4, 5]] < 5).all()  # K = 5: the explicit marker
    with pytest.raises(InvalidParams):
        A.encode_artifact_wire(art, version=3)


def test_wire_v2_refuses_a_second_spelling_of_the_chosen_token(art):
    columns = bytearray(A.encode_columns(art))
    at = len(A.encode_header(art.header))
    k = art.header.k
    # the chosen token spelled explicitly although it is a candidate: same artifact, another spelling
    n = art.header.output_length
    explicit = bytes(columns[:at]) + bytes([k]) + bytes(columns[at + 1:at + n]) \
        + int(art.positions.chosen[0]).to_bytes(4, "big") + bytes(columns[at + n:])
    with pytest.raises(InvalidArtifact) as info:
        A.decode_columns(explicit)
    assert info.value.reason is Reason.NON_CANONICAL
    columns[at] = k + 1  # a slot beyond the explicit marker
    with pytest.raises(InvalidArtifact) as info:
        A.decode_columns(bytes(columns))
    assert info.value.reason is Reason.NON_CANONICAL

import struct
from pathlib import Path

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
        v1, v2 = A.encode_artifact_wire(case, version=1), A.encode_artifact_wire(case, version=2)
        assert v2[:1] == A.WIRE_V2 and v1[:1] not in (A.WIRE_V2, A.WIRE_V3)  # v1 begins with zstd's magic
        assert A.decode_artifact_wire(v1) == case and A.decode_artifact_wire(v2) == case
    slots = A.compute_chosen_slots(_with_outside_chosen().positions)
    assert slots[1] == 5 and (slots[[0, 2, 3, 4, 5]] < 5).all()  # K = 5: the explicit marker
    with pytest.raises(InvalidParams):
        A.encode_artifact_wire(art, version=4)


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


# wire v3: the weights predicted from the logprobs

def test_compute_exp_is_pinned_to_the_bit_and_close_to_exp():
    # the decoder must predict the encoder's integers on every platform: the bits are pinned, not just the value
    x = np.array([0.0, -1e-9, -0.5, -1.0, -3.7, -20.0, -699.0, 5.0, 39.9, -800.0, 90.0])
    pinned = [0x3FF0000000000000, 0x3FEFFFFFFF768FA1, 0x3FE368B2FC6F960A, 0x3FD78B56362CEF38, 0x3F99511FC6871044,
              0x3E21B48655F37267, 0xE78694FE9F73CC, 0x40628D389970338F, 0x4387A568B8BE7386]
    got = A.compute_exp(x)
    assert [int(b) for b in got.view(np.uint64)[:9]] == pinned
    assert got[9] == A.compute_exp(np.array([-700.0]))[0] and got[10] == A.compute_exp(np.array([40.0]))[0]
    xs = np.linspace(-700.0, 40.0, 100_001)
    assert np.max(np.abs(A.compute_exp(xs) / np.exp(xs) - 1)) < 1e-15


def test_kept_prefix_counts_leading_non_zero_weights():
    w = np.array([[5, 3, 0, 0], [5, 0, 2, 0], [0, 1, 1, 1], [4, 3, 2, 1]])
    assert A.compute_kept_prefix(w).tolist() == [2, 1, 0, 4]


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.0, 1.5])
def test_weight_predictions_are_close_on_honest_artifacts(temperature):
    req = SyntheticRequest(inference_id=5, user_seed=1, params=SamplingParams(temperature, 0.95, 0, 200),
                           output_length=200, vocab_size=1024, logit_scale=3.0)
    p = make_synthetic_artifact(req, logits_seed=4).positions
    kept = A.compute_kept_prefix(p.weights)
    pred = A.compute_weight_predictions(p.raw_logprobs, kept, p.weights[:, 0], temperature)
    predicted = pred > 0  # every kept weight but the first of a row that keeps more than K
    assert predicted.sum() >= (p.weights > 0).sum() - (kept == p.k).sum()
    assert np.abs(p.weights - pred)[predicted].max() < 2**16  # residuals of ~12 bits instead of 32-bit weights
    assert (pred[p.weights == 0] == 0).all()


def test_wire_v3_is_the_default_smaller_than_v2_and_v1_v2_stay_accepted(art):
    req = SyntheticRequest(inference_id=5, user_seed=1, params=SamplingParams(0.7, 0.95, 0, 256), output_length=256,
                           vocab_size=4096, logit_scale=3.0)
    for case in (art, _with_outside_chosen(), make_synthetic_artifact(req, logits_seed=2)):
        v3 = A.encode_artifact_wire(case)
        assert v3[:1] == A.WIRE_V3 and v3 == A.encode_artifact_wire(case, version=3)
        for wire in (v3, A.encode_artifact_wire(case, version=2), A.encode_artifact_wire(case, version=1)):
            assert A.decode_artifact_wire(wire) == case
    assert len(v3) < 0.9 * len(A.encode_artifact_wire(case, version=2))


def _v3_parts(art):
    """Return v3 columns cut at: header end, kept column start, anchors start."""
    columns = A.encode_columns_v3(art)
    end = len(A.encode_header(art.header))
    n, k = art.header.output_length, art.header.k
    kept_at = end + n + 4 * int((A.compute_chosen_slots(art.positions) == k).sum())
    return columns, end, kept_at, kept_at + n


def test_wire_v3_refuses_every_other_spelling(art):
    columns, end, kept_at, _ = _v3_parts(art)
    n, k = art.header.output_length, art.header.k
    assert A.decode_columns_v3(columns) == art
    kept = A.compute_kept_prefix(art.positions.weights)
    cases = []
    row = next(i for i in range(n) if 0 < kept[i] < k)  # a row whose kept set ends inside the candidates
    wrong = bytearray(columns)
    wrong[kept_at + row] = kept[row] - 1  # another kept prefix: the residuals no longer spell the same weights
    cases.append((bytes(wrong), Reason.NON_CANONICAL))
    wrong = bytearray(columns)
    wrong[kept_at] = k + 1  # a kept prefix beyond K
    cases.append((bytes(wrong), Reason.NON_CANONICAL))
    wrong = bytearray(columns)
    wrong[end] = k + 1  # a chosen slot beyond K
    cases.append((bytes(wrong), Reason.NON_CANONICAL))
    cases += [(columns[:-1], Reason.TRUNCATED), (columns + b"\x00", Reason.TRAILING_BYTES),
              (columns[:kept_at + 2], Reason.TRUNCATED), (columns[:end + 1], Reason.TRUNCATED)]
    for blob, reason in cases:
        with pytest.raises(InvalidArtifact) as info:
            A.decode_columns_v3(blob)
        assert info.value.reason is reason
        with pytest.raises(InvalidArtifact) as info:
            A.decode_artifact_wire(A.WIRE_V3 + zstandard.ZstdCompressor(write_content_size=True).compress(blob))
        assert info.value.reason is reason
    wire = A.encode_artifact_wire(art)
    for blob, reason in ((wire + b"\x00", Reason.TRAILING_BYTES), (wire[:-2], Reason.WIRE_MALFORMED),
                         (A.WIRE_V3, Reason.WIRE_MALFORMED)):
        with pytest.raises(InvalidArtifact) as info:
            A.decode_artifact_wire(blob)
        assert info.value.reason in (reason, Reason.TRUNCATED)


def test_wire_v3_refuses_non_finite_logprobs_with_their_position(art):
    columns, *_ = _v3_parts(art)
    n, k = art.header.output_length, art.header.k
    logprob_plane0 = len(columns) - 4 * n * k - 4 * (n * k - int((A.compute_kept_prefix(art.positions.weights)
                                                                   == k).sum()))
    wrong = bytearray(columns)
    wrong[logprob_plane0 + 3 * k] = 0x7F  # the first logprob of position 3: sign 0, exponent all ones
    wrong[logprob_plane0 + n * k + 3 * k] = 0xC0  # 0x7FC0…: NaN
    with pytest.raises(InvalidArtifact) as info:
        A.decode_columns_v3(bytes(wrong))
    assert info.value.reason is Reason.NON_FINITE_LOGPROB and info.value.position == 3


FLOAT32_FINITE = st.integers(0, 2**32 - 1).filter(lambda b: (b >> 23) & 0xFF != 0xFF)


@given(st.data(), st.integers(1, 6), st.integers(0, 12), st.sampled_from([0.0, 0.001, 0.7, 1.0, 3.0]))
def test_wire_v3_round_trips_any_weights_and_logprobs(data, k, n, temperature):
    # not only honest rows: any uint32 weights (zeros anywhere, maxima, non-monotone) and any finite logprobs
    weights = data.draw(st.lists(st.lists(st.one_of(st.integers(0, 2**32 - 1), st.sampled_from([0, 1, 2**32 - 1])),
                                          min_size=k, max_size=k), min_size=n, max_size=n))
    bits = data.draw(st.lists(st.lists(FLOAT32_FINITE, min_size=k, max_size=k), min_size=n, max_size=n))
    ids = [list(range(7 * i, 7 * i + k)) for i in range(n)]
    chosen = [data.draw(st.integers(0, 50)) for _ in range(n)]
    logprobs = np.array(bits, dtype=np.uint32).reshape(n, k).view(np.float32)
    params = SamplingParams(temperature, 0.9, 0, n)
    header = A.ArtifactHeader(b"\x01" * 32, params.temperature_bits, params.top_p_bits, 0, n, k, b"\x02" * 32, (1,), n)
    case = A.Artifact(header, A.make_positions(chosen, np.array(ids).reshape(n, k),
                                               np.array(weights, dtype=np.int64).reshape(n, k), logprobs))
    wire = A.encode_artifact_wire(case, version=3)
    back = A.decode_artifact_wire(wire)
    assert back == case and A.encode_artifact_wire(back, version=3) == wire


REAL = Path(__file__).resolve().parents[2] / "vectors" / "artifact_smollm2_256.v3"
REAL_ROOT = "11d19c38f0afeebd9db9e341fbee0274488b03143d6c620d9b4187250a0ec3ae"


def test_wire_v3_on_a_real_smollm2_artifact():
    # 256 tokens of SmolLM2-135M-Instruct (T 0.7, top-p 0.95, K 5), the executer's wire v3 as recorded
    wire = REAL.read_bytes()
    art = A.decode_artifact_wire(wire)
    assert len(art.positions) == 256 and art.header.k == 5
    assert art.root.hex() == REAL_ROOT
    assert A.decode_artifact_wire(A.encode_artifact_wire(art, version=2)) == art
    assert A.encode_columns_v3(art) == zstandard.ZstdDecompressor().decompress(wire[1:])
    assert len(A.encode_artifact_wire(art)) < 0.85 * len(A.encode_artifact_wire(art, version=2))

"""Property tests of the decoders a peer's bytes reach (issue 15, finding 4): only typed rejections, bounded work.

Artifact: the zstd wire form and the raw encoding, mutated (flips, truncation, extension, huge lengths,
forged content sizes, non-canonical frames, NaN/inf logprobs). Fingerprint: chunks with bad moduli,
coefficients, lengths and counts, and their base64 JSON form.
"""

import base64
import io
import struct
import time

import numpy as np
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import node.protocol.artifact as A
import node.protocol.fingerprint as F
from node.errors import InvalidArtifact, Reason
from node.executer.synthetic import SyntheticRequest, make_synthetic_artifact
from node.protocol.sampler import SamplingParams
from tests.node.protocol.strategies import json_values

FUZZ = settings(max_examples=150, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
ART = make_synthetic_artifact(SyntheticRequest(inference_id=1, user_seed=2, params=SamplingParams(0.8, 0.9, 0, 64),
                                               output_length=10), 0)
RAW = A.encode_artifact(ART)
WIRE = A.encode_artifact_wire(ART, version=1)
COLUMNS = A.encode_columns(ART)
WIRE2 = A.encode_artifact_wire(ART, version=2)  # v2: 0x02 ‖ zstd(columns)
COLUMNS3 = A.encode_columns_v3(ART)
WIRE3 = A.encode_artifact_wire(ART)  # v3 (the default): 0x03 ‖ zstd(columns, weights predicted)
HEADER_LEN = len(A.encode_header(ART.header))
LEAF = A.leaf_size(ART.header.k)
HIDDEN = np.random.default_rng(3).standard_normal((4 + 40, 160)).astype(np.float32)
CHUNKS = F.build_fingerprint(HIDDEN, 4)  # the prompt chunk, then 32 and 7 fed-back rows


def decode_wire_or_reason(blob: bytes) -> A.Artifact | Reason:
    """Return the decoded artifact, or the reason it was refused; any other exception fails the test."""
    try:
        return A.decode_artifact_wire(blob)
    except InvalidArtifact as exc:
        return exc.reason


def decode_raw_or_reason(blob: bytes) -> A.Artifact | Reason:
    """Return the decoded raw artifact, or the reason it was refused."""
    try:
        return A.decode_artifact(blob)
    except InvalidArtifact as exc:
        return exc.reason


def with_content_size(size: int) -> bytes:
    """Return WIRE with its frame header rewritten to declare `size` (8-byte field, single segment)."""
    assert WIRE[4] == 0x60  # single segment, 2-byte content size: the blocks start at offset 7
    return WIRE[:4] + bytes([0xE0]) + struct.pack("<Q", size) + WIRE[7:]


def test_fixture_wire_is_canonical():
    assert A.decode_artifact_wire(WIRE) == ART and with_content_size(len(RAW)) != WIRE
    assert A.decode_artifact_wire(with_content_size(len(RAW))) == ART


@FUZZ
@given(st.data())
def test_flipped_wire_bytes_decode_or_are_refused(data):
    blob = bytearray(WIRE)
    for _ in range(data.draw(st.integers(1, 6))):
        blob[data.draw(st.integers(0, len(blob) - 1))] ^= data.draw(st.integers(1, 255))
    decode_wire_or_reason(bytes(blob))


@FUZZ
@given(st.integers(0, len(WIRE) - 1), st.binary(max_size=64))
def test_truncated_or_extended_wire_is_refused(cut, tail):
    assert isinstance(decode_wire_or_reason(WIRE[:cut]), Reason)
    if tail:
        assert decode_wire_or_reason(WIRE + tail) is Reason.TRAILING_BYTES


@FUZZ
@given(st.one_of(st.integers(0, 2**64 - 1), st.integers(0, 2 * len(RAW)),
                 st.sampled_from([A.MAX_ARTIFACT_BYTES, A.MAX_ARTIFACT_BYTES + 1, 2**63, 2**64 - 1])))
def test_forged_content_size_is_refused_before_allocating(size):
    started = time.perf_counter()
    got = decode_wire_or_reason(with_content_size(size))
    assert got == ART if size == len(RAW) else isinstance(got, Reason)
    if size > A.MAX_ARTIFACT_BYTES:  # zstd reserves the last two uint64 values for "unknown" and "error"
        assert got is (Reason.ARTIFACT_TOO_LARGE if size < 2**64 - 2 else Reason.WIRE_MALFORMED)
    assert time.perf_counter() - started < 0.5


def frame_v2(columns: bytes) -> bytes:
    """Return a well-formed v2 wire payload around any column content."""
    return A.WIRE_V2 + zstandard.ZstdCompressor(write_content_size=True).compress(columns)


def test_fixture_wire_v2_is_canonical():
    assert WIRE2[:1] == A.WIRE_V2 and A.decode_artifact_wire(WIRE2) == ART
    assert A.decode_artifact_wire(frame_v2(COLUMNS)) == ART  # any zstd spelling of the same content


@FUZZ
@given(st.data())
def test_flipped_column_bytes_decode_to_their_one_spelling_or_are_refused(data):
    blob = bytearray(COLUMNS)
    for _ in range(data.draw(st.integers(1, 6))):
        blob[data.draw(st.integers(0, len(blob) - 1))] ^= data.draw(st.integers(1, 255))
    got = decode_wire_or_reason(frame_v2(bytes(blob)))
    if isinstance(got, A.Artifact):
        assert A.encode_columns(got) == bytes(blob)  # what decodes is the one canonical spelling of its artifact


@FUZZ
@given(st.integers(0, len(COLUMNS) - 1), st.binary(min_size=1, max_size=64))
def test_truncated_or_extended_columns_are_refused(cut, tail):
    assert isinstance(decode_wire_or_reason(frame_v2(COLUMNS[:cut])), Reason)
    assert decode_wire_or_reason(frame_v2(COLUMNS + tail)) is Reason.TRAILING_BYTES
    assert decode_wire_or_reason(WIRE2 + tail) is Reason.TRAILING_BYTES


def frame_v3(columns: bytes) -> bytes:
    """Return a well-formed v3 wire payload around any column content."""
    return A.WIRE_V3 + zstandard.ZstdCompressor(write_content_size=True).compress(columns)


def test_fixture_wire_v3_is_canonical():
    assert WIRE3[:1] == A.WIRE_V3 and A.decode_artifact_wire(WIRE3) == ART
    assert A.decode_artifact_wire(frame_v3(COLUMNS3)) == ART


@FUZZ
@given(st.data())
def test_flipped_v3_column_bytes_decode_to_their_one_spelling_or_are_refused(data):
    blob = bytearray(COLUMNS3)
    for _ in range(data.draw(st.integers(1, 6))):
        blob[data.draw(st.integers(0, len(blob) - 1))] ^= data.draw(st.integers(1, 255))
    got = decode_wire_or_reason(frame_v3(bytes(blob)))
    if isinstance(got, A.Artifact):
        assert A.encode_columns_v3(got) == bytes(blob)


@FUZZ
@given(st.integers(0, len(COLUMNS3) - 1), st.binary(min_size=1, max_size=64))
def test_truncated_or_extended_v3_columns_are_refused(cut, tail):
    assert isinstance(decode_wire_or_reason(frame_v3(COLUMNS3[:cut])), Reason)
    assert decode_wire_or_reason(frame_v3(COLUMNS3 + tail)) is Reason.TRAILING_BYTES
    assert decode_wire_or_reason(WIRE3 + tail) is Reason.TRAILING_BYTES


@FUZZ
@given(st.binary(max_size=64), st.integers(0, 2**32 - 1), st.integers(0, 255))
def test_forged_v3_counts_and_bytes_are_refused_without_large_work(body, output_length, k):
    # a v3 header that declares up to 2^32 − 1 positions and any K over a short body: refused from the lengths
    raw = bytearray(A.encode_header(ART.header))
    raw[48:52] = struct.pack(">I", k)
    raw[-4:] = struct.pack(">I", output_length)
    started = time.perf_counter()
    assert isinstance(decode_wire_or_reason(frame_v3(bytes(raw) + body)), Reason)
    assert time.perf_counter() - started < 0.5


HEADER_FIELDS = {"temperature": 32, "top_p": 36, "top_k": 40, "max_tokens": 44, "k": 48, "prompt_length": 84,
                 "output_length": HEADER_LEN - 4}


@FUZZ
@given(st.sampled_from(sorted(HEADER_FIELDS)),
       st.one_of(st.integers(0, 2**32 - 1), st.sampled_from([0, 1, 2**31, 2**32 - 1, A.MAX_OUTPUT_TOKENS,
                                                             A.MAX_OUTPUT_TOKENS + 1, A.MAX_PROMPT_TOKENS + 1])))
def test_huge_or_wrong_header_fields_are_refused(field, value):
    raw = bytearray(RAW)
    at = HEADER_FIELDS[field]
    raw[at:at + 4] = struct.pack(">I", value)
    for got in (decode_raw_or_reason(bytes(raw)), decode_wire_or_reason(zstandard.ZstdCompressor().compress(raw))):
        if isinstance(got, A.Artifact):
            assert A.encode_artifact(got) == bytes(raw)  # accepted only if it is still canonical
        elif field in ("k", "prompt_length", "output_length") and value > 2**20:
            assert got is Reason.LIMIT_EXCEEDED


def frames(raw: bytes, draw) -> bytes:
    """Return raw compressed some other way than the canonical encoder does."""
    kind = draw(st.sampled_from(["level", "no-size", "stream", "two-frames", "skippable", "dict"]))
    level = draw(st.integers(-5, 19))
    checksum = draw(st.booleans())
    c = zstandard.ZstdCompressor(level=level, write_checksum=checksum)
    if kind == "level":
        return c.compress(raw)
    if kind == "no-size":
        return zstandard.ZstdCompressor(level=level, write_content_size=False).compress(raw)
    if kind == "stream":
        return b"".join(c.read_to_iter(io.BytesIO(raw), read_size=draw(st.integers(1, 512))))
    if kind == "two-frames":
        cut = draw(st.integers(0, len(raw)))
        return c.compress(raw[:cut]) + c.compress(raw[cut:])
    if kind == "skippable":
        skip = struct.pack("<II", 0x184D2A50 + draw(st.integers(0, 15)), 3) + b"abc"
        return skip + c.compress(raw) if draw(st.booleans()) else c.compress(raw) + skip
    shared = zstandard.ZstdCompressionDict(raw[:draw(st.integers(8, 300))], dict_type=zstandard.DICT_TYPE_RAWCONTENT)
    return zstandard.ZstdCompressor(level=level, dict_data=shared).compress(raw)


@FUZZ
@given(st.data())
def test_non_canonical_frames_decode_to_the_same_artifact_or_are_refused(data):
    got = decode_wire_or_reason(frames(RAW, data.draw))
    assert got == ART or isinstance(got, Reason)


NON_FINITE_BITS = st.one_of(st.integers(0x7F800000, 0x7FFFFFFF), st.integers(0xFF800000, 0xFFFFFFFF))


@FUZZ
@given(st.lists(st.tuples(st.integers(0, len(ART.positions) - 1), st.integers(0, ART.header.k - 1), NON_FINITE_BITS),
                min_size=1, max_size=4))
def test_nan_and_inf_logprobs_are_refused_at_the_first_bad_position(bad):
    raw = bytearray(RAW)
    for position, candidate, bits in bad:
        at = HEADER_LEN + position * LEAF + 8 + 12 * candidate + 8
        raw[at:at + 4] = struct.pack(">I", bits)
    first = min(p for p, _, _ in bad)
    for decode, blob in ((A.decode_artifact, bytes(raw)),
                         (A.decode_artifact_wire, zstandard.ZstdCompressor().compress(raw))):
        with pytest.raises(InvalidArtifact) as err:
            decode(blob)
        assert err.value.reason is Reason.NON_FINITE_LOGPROB and err.value.position == first


@pytest.mark.parametrize("value", [None, "bytes as text", 5, [["nested"]], {"a": 1}])
def test_decoders_refuse_what_is_not_bytes(value):
    for decode in (A.decode_artifact_wire, A.decode_artifact):
        with pytest.raises(InvalidArtifact):
            decode(value)
    for decode_chunks in (F.decode_fingerprint, F.decode_fingerprint_base64):
        with pytest.raises(F.InvalidFingerprint):
            decode_chunks(value)


@FUZZ
@given(st.integers(0, len(CHUNKS) - 1), st.integers(0, 2**16 - 1))
def test_any_modulus_decodes_only_inside_its_range(j, modulus):
    chunks = list(CHUNKS)
    chunks[j] = struct.pack(">H", modulus) + chunks[j][2:]
    try:
        moduli, _ = F.decode_fingerprint(chunks)
    except F.InvalidFingerprint as exc:
        assert exc.reason is Reason.FINGERPRINT_MALFORMED and exc.position == j
        assert not F.MODULUS_FLOOR < modulus <= F.PRIME
        return
    assert F.MODULUS_FLOOR < modulus <= F.PRIME and moduli[j] == modulus
    assert len(F.verify_fingerprint(HIDDEN, 4, chunks)) == len(chunks)  # a wrong modulus is measured, not fatal


@FUZZ
@given(st.integers(0, len(CHUNKS) - 1), st.integers(0, F.TOPK - 1), st.integers(F.PRIME, 2**16 - 1))
def test_coefficients_outside_the_field_are_refused(j, i, coeff):
    chunks = list(CHUNKS)
    chunks[j] = chunks[j][:2 + 2 * i] + struct.pack(">H", coeff) + chunks[j][4 + 2 * i:]
    with pytest.raises(F.InvalidFingerprint) as err:
        F.verify_fingerprint(HIDDEN, 4, chunks)
    assert err.value.reason is Reason.FINGERPRINT_MALFORMED and err.value.position == j


@FUZZ
@given(st.lists(st.binary(max_size=2 * F.CHUNK_BYTES), max_size=5))
def test_random_chunks_of_any_length_and_count_are_measured_or_refused(chunks):
    try:
        result = F.verify_fingerprint(HIDDEN, 4, chunks)
    except F.InvalidFingerprint as exc:
        assert exc.reason in (Reason.FINGERPRINT_MALFORMED, Reason.FINGERPRINT_LENGTH_MISMATCH)
        return
    assert len(result) == len(CHUNKS) == len(chunks)


@FUZZ
@given(st.integers(0, len(CHUNKS) - 1), st.integers(0, 2 * F.CHUNK_BYTES).filter(lambda n: n != F.CHUNK_BYTES),
       st.integers(-2, 2))
def test_a_resized_or_dropped_chunk_of_a_valid_proof_is_refused(j, size, extra_chunks):
    chunks = list(CHUNKS)
    chunks[j] = (chunks[j] * 2)[:size]
    with pytest.raises(F.InvalidFingerprint) as err:
        F.verify_fingerprint(HIDDEN, 4, chunks)
    assert err.value.reason is Reason.FINGERPRINT_MALFORMED and err.value.position == j
    count = len(CHUNKS) + extra_chunks
    if count != len(CHUNKS):
        with pytest.raises(F.InvalidFingerprint) as err:
            F.verify_fingerprint(HIDDEN, 4, (CHUNKS * 2)[:count])
        assert err.value.reason is (Reason.FINGERPRINT_MALFORMED if count == 0 else
                                    Reason.FINGERPRINT_LENGTH_MISMATCH)


def test_too_many_chunks_are_refused_before_decoding():
    chunks = [CHUNKS[0]] * (F.MAX_FINGERPRINT_CHUNKS + 1)
    with pytest.raises(F.InvalidFingerprint) as err:
        F.decode_fingerprint(chunks)
    assert err.value.reason is Reason.FINGERPRINT_MALFORMED
    with pytest.raises(F.InvalidFingerprint):
        F.decode_fingerprint_base64(F.encode_fingerprint_base64(chunks))
    assert F.MAX_FINGERPRINT_CHUNKS == len(F.compute_chunk_bounds(1, 1 + A.MAX_OUTPUT_TOKENS - 1))


def test_an_oversized_base64_chunk_is_refused_before_decoding():
    huge = base64.b64encode(b"\0" * 8 * 2**20).decode()
    started = time.perf_counter()
    with pytest.raises(F.InvalidFingerprint) as err:
        F.decode_fingerprint_base64([*F.encode_fingerprint_base64(CHUNKS), huge])
    assert err.value.reason is Reason.FINGERPRINT_MALFORMED and err.value.position == len(CHUNKS)
    assert time.perf_counter() - started < 0.05


@FUZZ
@given(st.one_of(json_values, st.lists(json_values, max_size=4), st.lists(st.text(max_size=400), max_size=4)))
def test_base64_chunks_from_any_json_decode_or_are_refused(value):
    try:
        chunks = F.decode_fingerprint_base64(value)
    except F.InvalidFingerprint as exc:
        assert exc.reason is Reason.FINGERPRINT_MALFORMED
        return
    assert all(isinstance(c, bytes) and len(c) <= F.CHUNK_BYTES for c in chunks)
    F.compute_fingerprint_hash(chunks)

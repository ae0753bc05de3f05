"""Projection fingerprints (protocol v2): golden vectors, round trips, distances and typed bad input."""

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from node.protocol.errors import InvalidParams, Reason
from node.protocol.fingerprint import build_fingerprint
from node.protocol.hashing import keccak256
from node.protocol.projection import (
    KIND_PROJECTION,
    KIND_TOPLOC,
    LAST_HIDDEN,
    InvalidProjectionFingerprint,
    ProjectionSpec,
    build_projection_blob,
    compute_codes,
    compute_fingerprint_kind,
    compute_projection,
    compute_projection_matrix,
    compute_projection_seed,
    compute_source_seed,
    decode_projection_blob,
    pack_codes,
    split_pieces,
    unpack_codes,
    verify_projection_blob,
)

ROOT = Path(__file__).resolve().parents[3]
VECTORS = json.loads((ROOT / "tests" / "vectors" / "projection_v2.json").read_text())
SPEC = ProjectionSpec((LAST_HIDDEN,), 16, 2)
SEED = keccak256(b"seed")


def rows(n: int = 40, hidden: int = 64, shift: float = 0.0) -> np.ndarray:
    rng = np.random.default_rng(1)
    return (rng.standard_normal((n, hidden)) + shift).astype(np.float32)


def test_code_reproduces_the_committed_vectors():
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_projection_vectors",
                                                  ROOT / "scripts" / "make_projection_vectors.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.build_vectors() == VECTORS


@pytest.mark.parametrize("case", VECTORS["seed"], ids=lambda c: c["projection_seed"][:10])
def test_seed_rule_is_keccak_of_domain_run_seed_and_block_hash(case):
    run_seed, block = bytes.fromhex(case["run_seed"][2:]), bytes.fromhex(case["block_hash"][2:])
    assert compute_projection_seed(run_seed, block) == keccak256(b"verinfer/projection/v2" + run_seed + block)
    assert compute_projection_seed(run_seed, block).hex() == case["projection_seed"][2:]


def test_seed_changes_with_the_block_hash_and_rejects_bad_lengths():
    assert compute_projection_seed(b"\1" * 32, b"\2" * 32) != compute_projection_seed(b"\1" * 32, b"\3" * 32)
    with pytest.raises(InvalidParams):
        compute_projection_seed(b"\1" * 31, b"\2" * 32)


def test_matrix_is_signs_over_sqrt_hidden_and_depends_on_the_seed():
    m = compute_projection_matrix(SEED, 8, 100)
    assert set(np.unique(m * 10)) == {-1.0, 1.0}
    assert not np.array_equal(m, compute_projection_matrix(compute_source_seed(SEED, 1), 8, 100))
    assert abs((m > 0).mean() - 0.5) < 0.1


@pytest.mark.parametrize("bits", [1, 2, 4, 8, 16])
def test_codes_pack_and_unpack(bits):
    codes = np.random.default_rng(bits).integers(0, 1 << bits, 77).astype(np.uint16)
    assert np.array_equal(unpack_codes(pack_codes(codes, bits), 77, bits), codes)
    assert len(pack_codes(codes, bits)) == -(-77 * bits // 8)


def test_sixteen_bit_codes_pack_most_significant_byte_first():
    assert pack_codes(np.array([0x1234, 0xABCD], dtype=np.uint16), 16) == bytes.fromhex("1234abcd")
    assert pack_codes(np.array([0x5, 0xA], dtype=np.uint16), 4) == bytes.fromhex("5a")
    assert compute_codes(np.array([-4.0, 0.0, 3.9999999]), 16).tolist() == [0, 32768, 65535]


def test_codes_clip_at_the_range_ends():
    assert compute_codes(np.array([-100.0, -4.0, 0.0, 3.99, 100.0]), 2).tolist() == [0, 0, 2, 3, 3]


def test_projection_is_scale_invariant_per_row():
    x = rows()
    m = compute_projection_matrix(SEED, 16, 64)
    assert np.allclose(compute_projection(x, m), compute_projection(3 * x, m))


def test_honest_rows_measure_zero_and_others_more():
    x = rows()
    blob = build_projection_blob([x], SPEC, SEED)
    assert verify_projection_blob(blob, SPEC, SEED, [x]).distance == 0.0
    near = verify_projection_blob(blob, SPEC, SEED, [x + 0.01 * rows(shift=1)]).distance
    far = verify_projection_blob(blob, SPEC, SEED, [rows(shift=0.0)[::-1].copy()]).distance
    assert near < far
    assert far > 0.1


def test_blob_size_is_header_plus_codes():
    blob = build_projection_blob([rows(64)], SPEC, SEED)
    assert len(blob) == 4 + 1 + 4 + 8 + 64 * 16 * 2 // 8
    assert compute_fingerprint_kind(blob) == KIND_PROJECTION
    assert b"".join(split_pieces(blob)) == blob and all(len(p) <= 258 for p in split_pieces(blob))


def test_toploc_blobs_are_kind_zero():
    chunks = build_fingerprint(rows(40, 576), 8)
    assert compute_fingerprint_kind(b"".join(chunks)) == KIND_TOPLOC
    assert compute_fingerprint_kind(b"\x00" + b"".join(chunks)) == KIND_TOPLOC


def test_wrong_kind_is_typed():
    chunks = b"".join(build_fingerprint(rows(40, 576), 8))
    with pytest.raises(InvalidProjectionFingerprint) as e:
        decode_projection_blob(chunks, SPEC, SEED, 40)
    assert e.value.reason is Reason.FINGERPRINT_KIND_MISMATCH
    with pytest.raises(InvalidProjectionFingerprint) as e:
        compute_fingerprint_kind(b"\x07abc")
    assert e.value.reason is Reason.FINGERPRINT_KIND_MISMATCH


def test_wrong_seed_is_typed():
    blob = build_projection_blob([rows()], SPEC, SEED)
    with pytest.raises(InvalidProjectionFingerprint) as e:
        decode_projection_blob(blob, SPEC, keccak256(b"other"), 40)
    assert e.value.reason is Reason.FINGERPRINT_SEED_MISMATCH


@pytest.mark.parametrize("cut", [1, 5, 20])
def test_wrong_length_is_typed(cut):
    blob = build_projection_blob([rows()], SPEC, SEED)
    with pytest.raises(InvalidProjectionFingerprint) as e:
        decode_projection_blob(blob[:-cut], SPEC, SEED, 40)
    assert e.value.reason in (Reason.FINGERPRINT_LENGTH_MISMATCH, Reason.FINGERPRINT_MALFORMED)
    with pytest.raises(InvalidProjectionFingerprint) as e:
        decode_projection_blob(blob, SPEC, SEED, 41)
    assert e.value.reason is Reason.FINGERPRINT_LENGTH_MISMATCH
    with pytest.raises(InvalidProjectionFingerprint) as e:
        decode_projection_blob(blob + b"\0", SPEC, SEED, 40)
    assert e.value.reason is Reason.FINGERPRINT_LENGTH_MISMATCH


def test_other_shape_than_registered_is_typed():
    blob = build_projection_blob([rows()], ProjectionSpec((LAST_HIDDEN,), 16, 4), SEED)
    with pytest.raises(InvalidProjectionFingerprint) as e:
        decode_projection_blob(blob, SPEC, SEED, 40)
    assert e.value.reason is Reason.FINGERPRINT_MALFORMED


@pytest.mark.parametrize("kwargs", [dict(layers=(LAST_HIDDEN,), k=0, bits=2), dict(layers=(LAST_HIDDEN,), k=8, bits=3),
                                    dict(layers=(), k=8, bits=2), dict(layers=(3, 3), k=8, bits=2)])
def test_bad_specs_are_typed(kwargs):
    with pytest.raises(InvalidParams):
        ProjectionSpec(**kwargs)


def test_non_finite_rows_are_typed():
    x = rows()
    x[3, 3] = np.nan
    with pytest.raises(InvalidParams) as e:
        build_projection_blob([x], SPEC, SEED)
    assert e.value.reason is Reason.NON_FINITE_HIDDEN


SIXTEEN = ProjectionSpec((0, LAST_HIDDEN), 1, 16)
GOOD_16 = build_projection_blob([rows(9), rows(9, shift=1.0)], SIXTEEN, SEED)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=80),
                 st.tuples(st.integers(0, len(GOOD_16) - 1), st.integers(0, 255)).map(
                     lambda p: GOOD_16[:p[0]] + bytes([p[1]]) + GOOD_16[p[0] + 1:]),
                 st.integers(0, len(GOOD_16)).map(lambda n: GOOD_16[:n]),
                 st.binary(min_size=1, max_size=8).map(lambda extra: GOOD_16 + extra)))
def test_any_bytes_decode_to_the_registered_shape_or_a_typed_refusal(blob):
    try:
        codes = decode_projection_blob(blob, SIXTEEN, SEED, 9)
    except InvalidProjectionFingerprint:
        return
    assert [c.shape for c in codes] == [(9, 1), (9, 1)] and all(c.dtype == np.uint16 for c in codes)

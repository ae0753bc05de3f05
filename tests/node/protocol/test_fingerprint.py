import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from node.errors import InvalidParams, Reason
from node.protocol.fingerprint import (
    CHUNK_BYTES,
    PRIME,
    InvalidFingerprint,
    build_fingerprint,
    compute_bf16_bits,
    compute_chunk_bounds,
    compute_fingerprint_hash,
    compute_interpolation,
    compute_polynomial_values,
    compute_topk_indices,
    decode_fingerprint,
    decode_fingerprint_base64,
    encode_fingerprint_base64,
    find_injective_modulus,
    verify_fingerprint,
)
from node.protocol.hashing import keccak256


def hidden(rows: int, seed: int = 0, width: int = 192) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, width)).astype(np.float32)


def test_bf16_rounding_is_round_to_nearest_even_like_torch():
    specials = np.array([1.0, -2.5, 1.00390625, 1.01171875, 3.4e38, 1e-40, -0.0, 0.0], dtype=np.float32)
    values = np.concatenate([specials, hidden(50, 1).ravel() * 100])
    expected = torch.from_numpy(values).to(torch.bfloat16).view(torch.uint16).numpy()
    assert (compute_bf16_bits(values) == expected).all()
    # 1 + 2^-8 is exactly halfway between two bf16 values: ties to the even mantissa (1.0).
    assert compute_bf16_bits(np.array([1.00390625], dtype=np.float32))[0] == 0x3F80
    with pytest.raises(InvalidParams) as err:
        compute_bf16_bits(np.array([np.nan], dtype=np.float32))
    assert err.value.reason is Reason.NON_FINITE_HIDDEN


def test_chunk_bounds_by_hand():
    assert compute_chunk_bounds(10, 10) == [(0, 10)]
    assert compute_chunk_bounds(10, 43) == [(0, 10), (10, 42), (42, 43)]
    assert compute_chunk_bounds(3, 3 + 64) == [(0, 3), (3, 35), (35, 67)]
    with pytest.raises(InvalidParams):
        compute_chunk_bounds(0, 5)


def test_topk_ties_go_to_the_lower_index():
    bits = compute_bf16_bits(np.array([1.0] * 200 + [-3.0, 2.0], dtype=np.float32))
    idx = compute_topk_indices(bits, 128)
    assert idx.tolist() == [*range(126), 200, 201]


def test_injective_modulus_steps_down_on_collision():
    assert find_injective_modulus(np.array([0, 1, 2])) == 65497
    assert find_injective_modulus(np.array([0, 65497])) == 65496  # 65497 ≡ 0 mod 65497
    assert find_injective_modulus(np.array([0, 65497, 65496])) == 65495


def test_interpolation_of_a_known_polynomial():
    x = np.arange(1, 129)[None, :]
    y = ((5 + 3 * x + 7 * x**2) % PRIME)[:, :]
    coeffs = compute_interpolation(x, y)
    assert coeffs[0, :3].tolist() == [5, 3, 7] and not coeffs[0, 3:].any()
    assert (compute_polynomial_values(coeffs, x) == y).all()


@given(st.lists(st.integers(0, PRIME - 1), min_size=128, max_size=128, unique=True),
       st.lists(st.integers(0, 65535), min_size=128, max_size=128))
def test_interpolation_passes_through_every_point(xs, ys):
    x, y = np.array([xs]), np.array([ys])
    assert (compute_polynomial_values(compute_interpolation(x, y), x) == y % PRIME).all()


def test_build_then_verify_same_activations_is_exact():
    h = hidden(7 + 40 - 1, 2)
    chunks = build_fingerprint(h, 7)
    assert len(chunks) == 3 and all(len(c) == CHUNK_BYTES for c in chunks)
    for m in verify_fingerprint(h, 7, chunks):
        assert (m.exponent_mismatches, m.sign_mismatches, m.mantissa_error_mean, m.mantissa_compared) == (0, 0, 0, 128)
    assert verify_fingerprint(compute_bf16_bits(h), 7, chunks) == verify_fingerprint(h, 7, chunks)


def test_other_activations_are_measured_far():
    chunks = build_fingerprint(hidden(20, 3), 4)
    far = verify_fingerprint(hidden(20, 4), 4, chunks)
    assert all(m.exponent_mismatches > 100 for m in far)
    negated = verify_fingerprint(-hidden(20, 3), 4, chunks)
    assert all(m.sign_mismatches == 128 and m.exponent_mismatches == 0 for m in negated)


def test_wire_is_big_endian_modulus_then_coefficients():
    chunk = build_fingerprint(hidden(3, 5), 3)[0]
    moduli, coeffs = decode_fingerprint([chunk])
    assert int.from_bytes(chunk[:2], "big") == moduli[0]
    assert int.from_bytes(chunk[2:4], "big") == coeffs[0, 0]
    assert compute_fingerprint_hash([chunk, chunk]) == keccak256(chunk + chunk)
    assert decode_fingerprint_base64(encode_fingerprint_base64([chunk])) == [chunk]


def test_malformed_proofs_raise_typed_errors():
    h = hidden(10, 6)
    good = build_fingerprint(h, 10)[0]
    bad_modulus = (100).to_bytes(2, "big") + good[2:]
    bad_coeff = good[:2] + (65535).to_bytes(2, "big") + good[4:]
    for proofs, reason in (([], Reason.FINGERPRINT_MALFORMED), ([good[:-1]], Reason.FINGERPRINT_MALFORMED),
                           ([bad_modulus], Reason.FINGERPRINT_MALFORMED), ([bad_coeff], Reason.FINGERPRINT_MALFORMED),
                           ([good, good], Reason.FINGERPRINT_LENGTH_MISMATCH)):
        with pytest.raises(InvalidFingerprint) as err:
            verify_fingerprint(h, 10, proofs)
        assert err.value.reason is reason
    with pytest.raises(InvalidFingerprint):
        decode_fingerprint_base64(["not base64!"])


@given(st.lists(st.binary(min_size=CHUNK_BYTES, max_size=CHUNK_BYTES), min_size=2, max_size=2))
def test_random_chunks_give_measurements_or_a_typed_error(chunks):
    try:
        result = verify_fingerprint(hidden(12, 7), 10, chunks)
    except InvalidFingerprint:
        return
    assert len(result) == 2 and all(0 <= m.exponent_mismatches <= 128 for m in result)

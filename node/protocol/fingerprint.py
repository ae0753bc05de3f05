"""Activation fingerprints in TOPLOC's wire format (docs/protocol.md), built and measured with numpy.

Source: the last hidden state after the final norm, cast to bf16 (round to nearest even). Rows
``[0, P)`` (the prompt) form chunk 0; rows ``[P, P+N-1)`` (generated tokens fed back) form chunks of
32 rows. Per chunk: the 128 entries of largest |value| (ties: lower flat index), ``x = index mod m``
for the first m in 65497, 65496, … that keeps the x distinct, ``y`` = the bf16 bit pattern; the
polynomial through the points over GF(65497), monomial coefficients ascending.
Wire: ``uint16 m ‖ 128 × uint16 coeff`` (big-endian) = 258 bytes per chunk.

Verification never raises on well-formed proofs that disagree: it returns measurements. Malformed
proofs (wrong size, modulus or coefficient out of range, wrong chunk count) raise InvalidFingerprint.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from node.protocol.artifact import MAX_OUTPUT_TOKENS
from node.protocol.errors import InvalidInput, InvalidParams, Reason
from node.protocol.hashing import keccak256

PRIME = 65497
TOPK = 128
DECODE_CHUNK_ROWS = 32
MODULUS_FLOOR = 2**15  # exclusive: moduli tried are 65497 … 32769
CHUNK_BYTES = 2 + 2 * TOPK
CHUNK_BASE64_CHARS = 4 * -(-CHUNK_BYTES // 3)
# The prompt chunk, then at most MAX_OUTPUT_TOKENS − 1 fed-back rows in groups of 32: no valid proof is longer,
# so a decoder refuses more before it allocates for them.
MAX_FINGERPRINT_CHUNKS = 1 + -(-(MAX_OUTPUT_TOKENS - 1) // DECODE_CHUNK_ROWS)


class InvalidFingerprint(InvalidInput):
    """A fingerprint proof that cannot be decoded (never raised for proofs that merely disagree)."""


@dataclass(frozen=True)
class ChunkMeasurement:
    """How far the prover's chunk is from the validator's own activations."""

    exponent_mismatches: int
    sign_mismatches: int
    mantissa_error_mean: float
    mantissa_error_median: float
    mantissa_compared: int


def compute_bf16_bits(values: np.ndarray) -> np.ndarray:
    """Return the bf16 bit patterns (uint16) of float32 values, rounding to nearest even."""
    f = np.ascontiguousarray(values, dtype=np.float32)
    if not np.isfinite(f).all():
        raise InvalidParams("hidden states contain NaN or inf", Reason.NON_FINITE_HIDDEN)
    bits = f.view(np.uint32)
    # finite bits are at most 0xFF7FFFFF, so adding at most 0x8000 cannot wrap a uint32
    rounded = (bits >> 16) & 1
    rounded += bits
    rounded += np.uint32(0x7FFF)
    rounded >>= 16
    return rounded.astype(np.uint16)


def compute_chunk_bounds(prompt_rows: int, total_rows: int) -> list[tuple[int, int]]:
    """Return [start, end) row ranges: the prompt, then generated rows in groups of 32."""
    if not 0 < prompt_rows <= total_rows:
        raise InvalidParams(f"need 0 < prompt rows ({prompt_rows}) <= rows ({total_rows})", Reason.OUT_OF_RANGE)
    bounds = [(0, prompt_rows)]
    bounds += [(s, min(s + DECODE_CHUNK_ROWS, total_rows)) for s in range(prompt_rows, total_rows, DECODE_CHUNK_ROWS)]
    return bounds


def compute_topk_indices(bits: np.ndarray, k: int = TOPK) -> np.ndarray:
    """Return the flat indices of the k largest |bf16| entries, ties by lower index, ascending."""
    magnitude = (bits & 0x7FFF).astype(np.int32)  # |x| order of finite bf16 = order of these integers
    if magnitude.size < k:
        raise InvalidParams(f"a chunk needs at least {k} values, got {magnitude.size}", Reason.OUT_OF_RANGE)
    kth = np.partition(magnitude, magnitude.size - k)[magnitude.size - k]
    above = np.flatnonzero(magnitude > kth)
    tied = np.flatnonzero(magnitude == kth)[: k - above.size]
    return np.sort(np.concatenate([above, tied]))


def find_injective_modulus(indices: np.ndarray) -> int:
    """Return the first m in 65497, 65496, … (> 2^15) with indices mod m distinct."""
    for m in range(PRIME, MODULUS_FLOOR, -1):
        if np.unique(indices % m).size == indices.size:
            return m
    raise InvalidParams("no injective modulus", Reason.OUT_OF_RANGE)  # needs > 32768 colliding indices


@lru_cache(maxsize=1)
def compute_inverse_table() -> np.ndarray:
    """Return a[i] = i^-1 mod 65497 for every i (a[0] = 0, never used: the x are distinct)."""
    a = np.arange(PRIME, dtype=np.int64)
    result, base, e = np.ones_like(a), a.copy(), PRIME - 2
    while e:
        if e & 1:
            result = result * base % PRIME
        base = base * base % PRIME
        e >>= 1
    return result  # result[0] = 0, never used: x are distinct


def compute_interpolation(xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """Return ascending coefficients of the polynomial through (x, y) over GF(65497), row-wise."""
    x = xs.astype(np.int64) % PRIME
    dd = ys.astype(np.int64) % PRIME
    inv = compute_inverse_table()
    n = x.shape[1]
    for k in range(1, n):
        dd[:, k:] = (dd[:, k:] - dd[:, k - 1:-1]) % PRIME * inv[(x[:, k:] - x[:, :-k]) % PRIME] % PRIME
    coeffs = np.zeros_like(dd)
    factor = np.zeros_like(dd)
    factor[:, 0] = 1
    for i in range(n):
        coeffs = (coeffs + dd[:, i:i + 1] * factor) % PRIME
        shifted = np.zeros_like(factor)
        shifted[:, 1:] = factor[:, :-1]
        factor = (shifted - x[:, i:i + 1] * factor) % PRIME
    return coeffs


def compute_polynomial_values(coeffs: np.ndarray, xs: np.ndarray) -> np.ndarray:
    """Return each row's polynomial evaluated at that row's xs (Horner, mod 65497)."""
    x = xs.astype(np.int64) % PRIME
    acc = np.zeros_like(x)
    for j in range(coeffs.shape[1] - 1, -1, -1):
        acc = (acc * x + coeffs[:, j:j + 1]) % PRIME
    return acc


def _chunk_bits(hidden: np.ndarray, prompt_rows: int) -> list[np.ndarray]:
    rows = np.asarray(hidden)
    if rows.ndim != 2:
        raise InvalidParams(f"hidden states must be (rows, hidden), got {rows.shape}", Reason.OUT_OF_RANGE)
    bits = rows if rows.dtype == np.uint16 else compute_bf16_bits(rows)
    return [bits[s:e].reshape(-1) for s, e in compute_chunk_bounds(prompt_rows, rows.shape[0])]


Interpolate = Callable[[np.ndarray, np.ndarray], np.ndarray]


def build_fingerprint(hidden: np.ndarray, prompt_rows: int,
                      interpolate: Interpolate = compute_interpolation) -> list[bytes]:
    """Return the 258-byte proof chunks for hidden states (float32 values or bf16 bits, rows × hidden).

    ``interpolate`` is ``compute_interpolation`` or an equal (an executer's compiled one, tested so).
    """
    chunks = _chunk_bits(hidden, prompt_rows)
    xs, ys, moduli = [], [], []
    for bits in chunks:
        idx = compute_topk_indices(bits)
        m = find_injective_modulus(idx)
        xs.append(idx % m)
        ys.append(bits[idx])
        moduli.append(m)
    coeffs = interpolate(np.array(xs), np.array(ys))
    return [np.concatenate([[m], c]).astype(">u2").tobytes() for m, c in zip(moduli, coeffs, strict=True)]


def decode_fingerprint(chunks: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """Return (moduli, coefficients) of proof chunks, or raise InvalidFingerprint."""
    if not isinstance(chunks, (list, tuple)) or not chunks:
        raise InvalidFingerprint("fingerprint chunks must be a non-empty list", Reason.FINGERPRINT_MALFORMED)
    if len(chunks) > MAX_FINGERPRINT_CHUNKS:
        raise InvalidFingerprint(f"{len(chunks)} chunks exceed {MAX_FINGERPRINT_CHUNKS}", Reason.FINGERPRINT_MALFORMED)
    for j, chunk in enumerate(chunks):
        if not isinstance(chunk, bytes) or len(chunk) != CHUNK_BYTES:
            raise InvalidFingerprint(f"chunk {j} is not {CHUNK_BYTES} bytes", Reason.FINGERPRINT_MALFORMED, j)
    words = np.frombuffer(b"".join(chunks), dtype=">u2").reshape(len(chunks), 1 + TOPK).astype(np.int64)
    moduli, coeffs = words[:, 0], words[:, 1:]
    bad = np.flatnonzero((moduli <= MODULUS_FLOOR) | (moduli > PRIME) | (coeffs >= PRIME).any(axis=1))
    if bad.size:
        raise InvalidFingerprint("modulus or coefficient out of range", Reason.FINGERPRINT_MALFORMED, int(bad[0]))
    return moduli, coeffs


def verify_fingerprint(hidden: np.ndarray, prompt_rows: int, chunks: Sequence[bytes]) -> list[ChunkMeasurement]:
    """Return per-chunk measurements of the proof against the validator's own hidden states."""
    moduli, coeffs = decode_fingerprint(chunks)
    own = _chunk_bits(hidden, prompt_rows)
    if len(own) != len(chunks):
        raise InvalidFingerprint(f"{len(chunks)} chunks for {len(own)} expected", Reason.FINGERPRINT_LENGTH_MISMATCH)
    idx = [compute_topk_indices(bits) for bits in own]
    claimed = compute_polynomial_values(coeffs, np.array([i % m for i, m in zip(idx, moduli, strict=True)]))
    return [measure_chunk(bits[i], c) for bits, i, c in zip(own, idx, claimed, strict=True)]


def measure_chunk(own_bits: np.ndarray, claimed_bits: np.ndarray) -> ChunkMeasurement:
    """Return exponent, sign and mantissa disagreement between two bf16 bit vectors."""
    own = own_bits.astype(np.int64)
    claimed = claimed_bits.astype(np.int64)  # values >= 2^16 cannot occur: coefficients < PRIME < 2^16
    exp_match = ((own >> 7) & 0xFF) == ((claimed >> 7) & 0xFF)
    mant_err = np.abs((own & 0x7F) - (claimed & 0x7F))[exp_match]
    return ChunkMeasurement(
        exponent_mismatches=int((~exp_match).sum()),
        sign_mismatches=int(((own >> 15) != (claimed >> 15)).sum()),
        mantissa_error_mean=float(mant_err.mean()) if mant_err.size else float("inf"),
        mantissa_error_median=float(np.median(mant_err)) if mant_err.size else float("inf"),
        mantissa_compared=int(mant_err.size),
    )


def compute_fingerprint_hash(chunks: Sequence[bytes]) -> bytes:
    """Return fingerprintHash = keccak256(concatenated chunks)."""
    return keccak256(b"".join(chunks))


def encode_fingerprint_base64(chunks: Sequence[bytes]) -> list[str]:
    """Return the chunks as base64 strings, the JSON form (verification_proofs)."""
    return [base64.b64encode(c).decode("ascii") for c in chunks]


def decode_fingerprint_base64(items: Sequence[str]) -> list[bytes]:
    """Return chunks from their base64 strings, or raise InvalidFingerprint."""
    if not isinstance(items, (list, tuple)):
        raise InvalidFingerprint("fingerprint chunks must be a list of base64 strings", Reason.FINGERPRINT_MALFORMED)
    if len(items) > MAX_FINGERPRINT_CHUNKS:
        raise InvalidFingerprint(f"{len(items)} chunks exceed {MAX_FINGERPRINT_CHUNKS}", Reason.FINGERPRINT_MALFORMED)
    out = []
    for j, s in enumerate(items):
        # Bounded before decoding: a peer must not make us decode (and hash) megabytes per chunk.
        if not isinstance(s, (str, bytes)) or len(s) > CHUNK_BASE64_CHARS:
            raise InvalidFingerprint(f"chunk {j} is not base64 of at most {CHUNK_BYTES} bytes",
                                     Reason.FINGERPRINT_MALFORMED, j)
        try:
            out.append(base64.b64decode(s, validate=True))
        except (binascii.Error, ValueError) as exc:
            raise InvalidFingerprint(f"fingerprint chunk {j} is not base64: {exc}", Reason.FINGERPRINT_MALFORMED,
                                     j) from exc
    return out

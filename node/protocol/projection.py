"""Projection fingerprints (protocol v2, fingerprint kind 1): quantised random projections of hidden states.

The projection is unknown until the request exists: its seed is keccak256 of a domain tag, the run
seed and the hash of the block after the request's block (randomness the operator cannot choose;
docs/protocol.md, protocol v2). Per source (the last hidden state, or a decoder layer's output) the
seed of source j is keccak256(seed ‖ uint8 j) and its matrix is k × hidden signs ±1/√hidden read from
SHAKE-256(seed of source j), bit 1 → +1, most significant bit first, row-major. Each row x is scaled
to unit RMS, projected, and quantised to `bits` bits over [−4, 4) (codes 0 … 2^bits − 1; values
outside clip to the end codes). The validator measures how far its own projection lies outside the
claimed bins (0 inside): a distance, decided on by a calibrated threshold (node.checks.projection).

Blob (its keccak256 is the commitment's fingerprintHash, so the commitment carries the kind):
``uint8 kind = 1 ‖ uint8 bits ‖ uint8 k ‖ uint8 sources ‖ sources × uint8 layer (255: last hidden state)
‖ uint32 rows ‖ 8 bytes seed tag (the seed's first 8 bytes) ‖ per source: rows × k codes of `bits` bits,
most significant bit first, padded with zero bits to a byte``. A TOPLOC v1 blob (kind 0) is its chunks
concatenated (the first byte is a modulus' high byte, ≥ 0x80), or ``0x00 ‖ chunks``.
On the wire a blob travels as pieces of at most 258 bytes (the v1 chunk size), concatenated in order.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from node.protocol.errors import InvalidInput, InvalidParams, Reason
from node.protocol.hashing import keccak256

KIND_TOPLOC = 0
KIND_PROJECTION = 1
DOMAIN = b"verinfer/projection/v2"
LAST_HIDDEN = 255  # the source id of the last hidden state (after the final norm)
RANGE = 4.0
BITS = (1, 2, 4, 8, 16)
MAX_K = 64
MAX_SOURCES = 4
SEED_TAG_BYTES = 8
PIECE_BYTES = 258
MAX_ROWS = 1 << 20


class InvalidProjectionFingerprint(InvalidInput):
    """A projection fingerprint of the wrong kind, shape or seed, or one that cannot be decoded."""


@dataclass(frozen=True)
class ProjectionSpec:
    """What a model's registration fixes for kind 1: the sources, dims per source and bits per dim."""

    layers: tuple[int, ...]  # LAST_HIDDEN or a decoder layer index, in blob order
    k: int
    bits: int

    def __post_init__(self) -> None:
        layers_ok = 0 < len(self.layers) <= MAX_SOURCES and len(set(self.layers)) == len(self.layers) \
            and all(0 <= layer <= LAST_HIDDEN for layer in self.layers)
        if self.bits not in BITS or not 0 < self.k <= MAX_K or not layers_ok:
            raise InvalidParams(f"projection spec out of range: {self}", Reason.OUT_OF_RANGE)

    @property
    def bytes_per_row(self) -> float:
        """Return the code bytes per hidden-state row (per token)."""
        return len(self.layers) * self.k * self.bits / 8


@dataclass(frozen=True)
class ProjectionMeasurement:
    """How far the validator's own projections lie outside the claimed bins, per source and overall."""

    rows: int
    source_distances: tuple[float, ...]
    distance: float
    layers: tuple[int, ...]  # the sources of source_distances, in blob order (LAST_HIDDEN or a layer)


def compute_projection_seed(run_seed: bytes, block_hash: bytes) -> bytes:
    """Return keccak256(DOMAIN ‖ run_seed ‖ block_hash): the request's projection seed."""
    if len(run_seed) != 32 or len(block_hash) != 32:
        raise InvalidParams("run seed and block hash must be 32 bytes each", Reason.OUT_OF_RANGE)
    return keccak256(DOMAIN + run_seed + block_hash)


def compute_source_seed(seed: bytes, source: int) -> bytes:
    """Return the seed of source number `source` (its place in the blob): keccak256(seed ‖ uint8 source)."""
    return keccak256(seed + bytes([source]))


def compute_projection_matrix(seed: bytes, k: int, hidden: int) -> np.ndarray:
    """Return the k × hidden matrix of signs ±1/√hidden read from SHAKE-256(seed), float64."""
    if not 0 < k <= MAX_K or hidden <= 0:
        raise InvalidParams(f"projection shape {k} × {hidden} out of range", Reason.OUT_OF_RANGE)
    bits = np.unpackbits(np.frombuffer(hashlib.shake_256(seed).digest(-(-k * hidden // 8)), dtype=np.uint8))
    signs = bits[: k * hidden].astype(np.float64) * 2 - 1
    return np.asarray(signs.reshape(k, hidden) / np.sqrt(hidden))


def compute_projection(rows: np.ndarray, matrix: np.ndarray) -> np.ndarray:
    """Return each row scaled to unit RMS and projected: (rows, k) float64."""
    x = np.asarray(rows, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] != matrix.shape[1]:
        raise InvalidParams(f"rows {x.shape} do not fit a {matrix.shape} projection", Reason.OUT_OF_RANGE)
    if not np.isfinite(x).all():
        raise InvalidParams("hidden states contain NaN or inf", Reason.NON_FINITE_HIDDEN)
    rms = np.sqrt(np.mean(x * x, axis=1, keepdims=True))
    return np.asarray((x / np.maximum(rms, 1e-12)) @ matrix.T)


def compute_codes(values: np.ndarray, bits: int) -> np.ndarray:
    """Return the quantised codes (uint16, 0 … 2^bits − 1) of projected values over [−4, 4)."""
    step = 2 * RANGE / (1 << bits)
    return np.clip(np.floor((values + RANGE) / step), 0, (1 << bits) - 1).astype(np.uint16)


def pack_codes(codes: np.ndarray, bits: int) -> bytes:
    """Return codes packed `bits` bits each, most significant bit first, zero-padded to a byte."""
    wide = codes.reshape(-1, 1).astype(">u2").view(np.uint8)  # each code as two big-endian bytes
    planes = np.unpackbits(wide, axis=1)[:, 16 - bits:]
    return np.packbits(planes.reshape(-1)).tobytes()


def unpack_codes(data: bytes, count: int, bits: int) -> np.ndarray:
    """Return `count` codes of `bits` bits from packed bytes (the inverse of pack_codes), uint16."""
    flat = np.unpackbits(np.frombuffer(data, dtype=np.uint8))[: count * bits].reshape(count, bits)
    weights = np.left_shift(np.uint32(1), np.arange(bits - 1, -1, -1, dtype=np.uint32))
    return np.asarray((flat.astype(np.uint32) * weights).sum(axis=1).astype(np.uint16))


def compute_projected_fingerprint(rows: np.ndarray, matrix: np.ndarray, bits: int) -> bytes:
    """Return one source's packed codes for hidden rows (the blob body of that source)."""
    return pack_codes(compute_codes(compute_projection(rows, matrix), bits), bits)


def decode_projected_fingerprint(body: bytes, rows: int, k: int, bits: int) -> np.ndarray:
    """Return one source's (rows, k) codes from its packed body, or raise if its size is wrong."""
    if len(body) != -(-rows * k * bits // 8):
        raise InvalidProjectionFingerprint(f"source body of {len(body)} bytes for {rows} rows",
                                           Reason.FINGERPRINT_LENGTH_MISMATCH)
    return unpack_codes(body, rows * k, bits).reshape(rows, k)


def compute_row_distances(codes: np.ndarray, own_rows: np.ndarray, matrix: np.ndarray, bits: int) -> np.ndarray:
    """Return per row the mean over dims of how far the own projection lies outside the claimed bin."""
    own = compute_projection(own_rows, matrix)
    if own.shape != codes.shape:
        raise InvalidProjectionFingerprint(f"{codes.shape} codes for {own.shape} own values",
                                           Reason.FINGERPRINT_LENGTH_MISMATCH)
    step = 2 * RANGE / (1 << bits)
    c = codes.astype(np.float64)
    low = np.where(codes == 0, -np.inf, -RANGE + c * step)
    high = np.where(codes == (1 << bits) - 1, np.inf, -RANGE + (c + 1) * step)
    outside = np.maximum(np.maximum(low - own, own - high), 0.0)
    return np.asarray(outside.mean(axis=1))


def compute_projection_distance(codes: np.ndarray, own_rows: np.ndarray, matrix: np.ndarray, bits: int) -> float:
    """Return the mean out-of-bin distance of the own projection from the claimed codes over all rows."""
    return float(compute_row_distances(codes, own_rows, matrix, bits).mean())


def _header(spec: ProjectionSpec, rows: int, seed: bytes) -> bytes:
    return bytes([KIND_PROJECTION, spec.bits, spec.k, len(spec.layers), *spec.layers]) + struct.pack(">I", rows) + \
        seed[:SEED_TAG_BYTES]


def build_projection_blob(sources: Sequence[np.ndarray], spec: ProjectionSpec, seed: bytes) -> bytes:
    """Return the kind-1 blob for hidden rows of each source in spec.layers order (each rows × hidden)."""
    if len(sources) != len(spec.layers) or len({s.shape[0] for s in sources}) != 1:
        raise InvalidParams("one equal-length row block per source is needed", Reason.OUT_OF_RANGE)
    rows = int(sources[0].shape[0])
    body = b"".join(compute_projected_fingerprint(s, compute_projection_matrix(compute_source_seed(seed, j), spec.k,
                                                                               s.shape[1]), spec.bits)
                    for j, s in enumerate(sources))
    return _header(spec, rows, seed) + body


def compute_fingerprint_kind(blob: bytes) -> int:
    """Return the kind of a fingerprint blob: 0 for TOPLOC (legacy v1 or 0x00-framed), 1 for projection."""
    if not blob:
        raise InvalidProjectionFingerprint("empty fingerprint", Reason.FINGERPRINT_MALFORMED)
    if blob[0] == KIND_PROJECTION:
        return KIND_PROJECTION
    if blob[0] == KIND_TOPLOC or blob[0] >= 0x80:
        return KIND_TOPLOC
    raise InvalidProjectionFingerprint(f"unknown fingerprint kind {blob[0]}", Reason.FINGERPRINT_KIND_MISMATCH)


def decode_projection_blob(blob: bytes, spec: ProjectionSpec, seed: bytes, rows: int) -> list[np.ndarray]:
    """Return per source the (rows, k) codes of a kind-1 blob, checked against the expected spec, seed and rows."""
    kind = compute_fingerprint_kind(blob)
    if kind != KIND_PROJECTION:
        raise InvalidProjectionFingerprint(f"fingerprint kind {kind}, expected {KIND_PROJECTION}",
                                           Reason.FINGERPRINT_KIND_MISMATCH)
    head = 4 + len(spec.layers) + 4 + SEED_TAG_BYTES
    if len(blob) < head or blob[1:4 + len(spec.layers)] != bytes([spec.bits, spec.k, len(spec.layers), *spec.layers]):
        raise InvalidProjectionFingerprint("projection shape differs from the model's registration",
                                           Reason.FINGERPRINT_MALFORMED)
    claimed_rows = struct.unpack(">I", blob[4 + len(spec.layers): 8 + len(spec.layers)])[0]
    if claimed_rows != rows:
        raise InvalidProjectionFingerprint(f"{claimed_rows} rows for {rows} expected",
                                           Reason.FINGERPRINT_LENGTH_MISMATCH)
    if blob[8 + len(spec.layers): head] != seed[:SEED_TAG_BYTES]:
        raise InvalidProjectionFingerprint("projection seed differs from the request's",
                                           Reason.FINGERPRINT_SEED_MISMATCH)
    size = -(-rows * spec.k * spec.bits // 8)
    if len(blob) != head + size * len(spec.layers):
        raise InvalidProjectionFingerprint(f"{len(blob)} bytes for {rows} rows", Reason.FINGERPRINT_LENGTH_MISMATCH)
    return [decode_projected_fingerprint(blob[head + j * size: head + (j + 1) * size], rows, spec.k, spec.bits)
            for j in range(len(spec.layers))]


def verify_projection_blob(blob: bytes, spec: ProjectionSpec, seed: bytes,
                           own_sources: Sequence[np.ndarray]) -> ProjectionMeasurement:
    """Return the distance of the validator's own rows (per source, spec order) from a kind-1 blob's codes."""
    rows = int(own_sources[0].shape[0])
    codes = decode_projection_blob(blob, spec, seed, rows)
    distances = tuple(compute_projection_distance(c, own, compute_projection_matrix(compute_source_seed(seed, j),
                                                                                     spec.k, own.shape[1]), spec.bits)
                      for j, (c, own) in enumerate(zip(codes, own_sources, strict=True)))
    return ProjectionMeasurement(rows, distances, float(np.mean(distances)), spec.layers)


def split_pieces(blob: bytes) -> list[bytes]:
    """Return a blob as wire pieces of at most PIECE_BYTES bytes (their concatenation is the blob)."""
    return [blob[i:i + PIECE_BYTES] for i in range(0, len(blob), PIECE_BYTES)]


def split_toploc_blob(blob: bytes, chunk_bytes: int = PIECE_BYTES) -> list[bytes]:
    """Return the TOPLOC chunks of a kind-0 blob: legacy (the chunks themselves) or framed (0x00 ‖ chunks)."""
    body = blob[1:] if blob[:1] == bytes([KIND_TOPLOC]) else blob
    if not body or len(body) % chunk_bytes:
        raise InvalidProjectionFingerprint(f"a TOPLOC blob of {len(body)} bytes is not whole chunks",
                                           Reason.FINGERPRINT_MALFORMED)
    return [body[i:i + chunk_bytes] for i in range(0, len(body), chunk_bytes)]

"""The artifact (docs/protocol.md): header, per-position leaves, roots, and its canonical wire form.

Binary layout (all big-endian):

header = bytes32 model_id ‖ uint32 temperature_bits ‖ uint32 top_p_bits ‖ uint32 top_k
         ‖ uint32 max_tokens ‖ uint32 K ‖ bytes32 run_seed ‖ uint32 P ‖ P × uint32 prompt_id
         ‖ uint32 output_length
leaf_i = uint32 i ‖ uint32 chosen ‖ K × (uint32 token_id ‖ uint32 weight ‖ float32 raw_logprob)
wire v1 = one zstd frame, content size declared, of header ‖ leaf_0 ‖ … ‖ leaf_{N-1}
wire v2 = 0x02 ‖ one zstd frame (level 19, content size declared) of the same fields by column:
          header ‖ N × uint8 chosen_slot ‖ E × uint32 chosen (the E positions whose slot is K)
          ‖ planes(token_ids) ‖ planes(weights) ‖ planes(raw_logprobs)
          chosen_slot = the candidate column holding the chosen token, K when it is no candidate;
          planes(x) = the N·K big-endian 4-byte values split into 4 byte planes (first bytes, then
          second bytes, …). 17 % smaller than v1 on real SmolLM2 artifacts (issue 21); a v1 frame starts
          with zstd's magic 0x28, so the version byte is unambiguous and v1 stays accepted.
wire v3 = 0x03 ‖ one zstd frame (level 19, content size declared) of
          header ‖ N × uint8 chosen_slot ‖ E × uint32 chosen ‖ N × uint8 kept
          ‖ A × uint32 weight_0 (the A positions whose kept is K) ‖ planes(token_ids)
          ‖ planes(logprob deltas) ‖ planes(weight residuals)
          kept = the number of leading non-zero weights; logprob deltas = per row the float32 bits of the
          first raw logprob, then each one's bits minus its left neighbour's (mod 2^32); weight residuals =
          zigzag((w − predicted w) mod 2^32 as int32), predicted from the logprobs by
          compute_weight_predictions, in the order: column 0 of the N − A positions whose kept is below K,
          then columns 1 … K−1 each over all N positions. The weights and the logprobs carry the same
          ratios (w_j / w_0 ≈ exp((lp_j − lp_0) / T)): 20 % smaller than v2 on real SmolLM2 artifacts
          at 256 tokens. The version bytes 0x02 and 0x03 are neither zstd's magic nor each other.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import zstandard

from node.protocol.errors import InvalidArtifact, InvalidParams, Reason
from node.protocol.hashing import double_keccak256_many, keccak256
from node.protocol.merkle import compute_merkle_proof, compute_merkle_root
from node.protocol.sampler import MAX_K, WEIGHT_MAX, WEIGHT_ONE, PositionSample, SamplingParams

MAX_PROMPT_TOKENS = 131_072
MAX_OUTPUT_TOKENS = 32_768
MAX_ARTIFACT_BYTES = 32 * 2**20
MAX_WIRE_BYTES = 32 * 2**20
ZSTD_LEVEL = 3  # wire v1
ZSTD_LEVEL_V2 = 19  # 8 ms for a 256-token artifact: 0.04 % of generating it, for 2 % fewer bytes than level 3
WIRE_V2 = b"\x02"
WIRE_V3 = b"\x03"
WIRE_VERSION = 3  # the executer's default: the smallest at 64, 256 and 4096 tokens (scripts/bench_payload.py)

_HEAD = struct.Struct(">32sIIIII32sI")  # up to and including the prompt length
_U32 = struct.Struct(">I")


@dataclass(frozen=True)
class ArtifactHeader:
    """What the executer commits to about the whole inference."""

    model_id: bytes
    temperature_bits: int
    top_p_bits: int
    top_k: int
    max_tokens: int
    k: int
    run_seed: bytes
    prompt_token_ids: tuple[int, ...]
    output_length: int

    @property
    def params(self) -> SamplingParams:
        """Return the sampling params the header declares (raises InvalidParams if out of domain)."""
        return SamplingParams.from_bits(self.temperature_bits, self.top_p_bits, self.top_k, self.max_tokens)


@dataclass(frozen=True, eq=False)
class Positions:
    """All leaves of an artifact, column-wise: chosen (N,), token_ids/weights/raw_logprobs (N, K)."""

    chosen: np.ndarray
    token_ids: np.ndarray
    weights: np.ndarray
    raw_logprobs: np.ndarray

    def __post_init__(self) -> None:
        n = self.chosen.shape[0] if self.chosen.ndim == 1 else -1
        shapes = {self.token_ids.shape, self.weights.shape, self.raw_logprobs.shape}
        if n < 0 or len(shapes) != 1 or len(next(iter(shapes))) != 2 or next(iter(shapes))[0] != n:
            raise InvalidArtifact("positions columns have inconsistent shapes", Reason.NON_CANONICAL)
        for arr in (self.chosen, self.token_ids, self.weights, self.raw_logprobs):
            arr.flags.writeable = False

    def __len__(self) -> int:
        return int(self.chosen.shape[0])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Positions) and encode_leaves(self) == encode_leaves(other)

    __hash__ = None  # type: ignore[assignment]

    @property
    def k(self) -> int:
        """Return K, the number of candidates per position."""
        return int(self.token_ids.shape[1])


@dataclass(frozen=True, eq=False)
class Artifact:
    """Header plus positions; the unit that is committed, stored and transported."""

    header: ArtifactHeader
    positions: Positions

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Artifact) and self.header == other.header and self.positions == other.positions

    __hash__ = None  # type: ignore[assignment]

    @cached_property
    def leaf_hashes(self) -> list[bytes]:
        """Return the Merkle leaf hash of every position."""
        return compute_leaf_hashes(self.positions)

    @cached_property
    def root(self) -> bytes:
        """Return artifactRoot."""
        return compute_artifact_root_from_leaf_hashes(self.header, self.leaf_hashes)


def make_positions(chosen: Sequence[int] | np.ndarray, token_ids: np.ndarray | Sequence[Sequence[int]],
                   weights: np.ndarray | Sequence[Sequence[int]],
                   raw_logprobs: np.ndarray | Sequence[Sequence[float]]) -> Positions:
    """Return Positions from column data (copied into canonical dtypes)."""
    try:
        return Positions(
            chosen=np.array(chosen, dtype=np.int64).reshape(-1),
            token_ids=np.array(token_ids, dtype=np.int64),
            weights=np.array(weights, dtype=np.int64),
            raw_logprobs=np.array(raw_logprobs, dtype=np.float32),
        )
    except (ValueError, TypeError, OverflowError) as exc:
        raise InvalidArtifact(f"positions are not rectangular numeric data: {exc}", Reason.NON_CANONICAL) from exc


def positions_from_samples(samples: Sequence[PositionSample], k: int) -> Positions:
    """Return Positions built from the sampler's per-step records."""
    if not samples:
        return make_positions(np.zeros(0), np.zeros((0, k)), np.zeros((0, k)), np.zeros((0, k)))
    return make_positions(
        [s.chosen for s in samples],
        [s.token_ids for s in samples],
        [s.weights for s in samples],
        [s.raw_logprobs for s in samples],
    )


def _leaf_dtype(k: int) -> np.dtype:
    candidate = np.dtype([("id", ">u4"), ("weight", ">u4"), ("logprob", ">f4")])
    return np.dtype([("i", ">u4"), ("chosen", ">u4"), ("cand", candidate, (k,))])


def leaf_size(k: int) -> int:
    """Return the encoded size of one leaf in bytes."""
    return 8 + 12 * k


def _require_u32_columns(positions: Positions) -> None:
    for name in ("chosen", "token_ids", "weights"):
        col = getattr(positions, name)
        if col.size and (col.min() < 0 or col.max() > 0xFFFFFFFF):
            raise InvalidArtifact(f"{name} has values outside uint32", Reason.NON_CANONICAL)


def encode_leaves(positions: Positions) -> bytes:
    """Return every leaf's canonical encoding, concatenated in position order."""
    _require_u32_columns(positions)
    rows = np.zeros(len(positions), dtype=_leaf_dtype(positions.k))
    rows["i"] = np.arange(len(positions), dtype=np.uint32)
    rows["chosen"] = positions.chosen
    rows["cand"]["id"] = positions.token_ids
    rows["cand"]["weight"] = positions.weights
    rows["cand"]["logprob"] = positions.raw_logprobs
    return rows.tobytes()


def encode_leaf(positions: Positions, i: int) -> bytes:
    """Return the canonical encoding of leaf i."""
    size = leaf_size(positions.k)
    return encode_leaves(positions)[i * size:(i + 1) * size]


def encode_header(header: ArtifactHeader) -> bytes:
    """Return the canonical big-endian encoding of the header."""
    if len(header.model_id) != 32 or len(header.run_seed) != 32:
        raise InvalidArtifact("model_id and run_seed must be 32 bytes", Reason.NON_CANONICAL)
    try:
        head = _HEAD.pack(header.model_id, header.temperature_bits, header.top_p_bits, header.top_k,
                          header.max_tokens, header.k, header.run_seed, len(header.prompt_token_ids))
        prompt = struct.pack(f">{len(header.prompt_token_ids)}I", *header.prompt_token_ids)
        return head + prompt + _U32.pack(header.output_length)
    except struct.error as exc:
        raise InvalidArtifact(f"header field outside uint32: {exc}", Reason.NON_CANONICAL) from exc


def encode_artifact(artifact: Artifact) -> bytes:
    """Return header ‖ leaves, the uncompressed canonical form."""
    return encode_header(artifact.header) + encode_leaves(artifact.positions)


def compute_leaf_hashes(positions: Positions) -> list[bytes]:
    """Return keccak256(keccak256(leaf)) for every position."""
    blob = encode_leaves(positions)
    size = leaf_size(positions.k)
    return double_keccak256_many(blob[j:j + size] for j in range(0, len(blob), size))


def compute_positions_root(positions: Positions) -> bytes:
    """Return positionsRoot, the Merkle root over the leaves."""
    return compute_merkle_root(compute_leaf_hashes(positions))


def compute_artifact_root_from_leaf_hashes(header: ArtifactHeader, leaf_hashes: Sequence[bytes]) -> bytes:
    """Return artifactRoot = keccak256(keccak256(header) ‖ positionsRoot)."""
    return keccak256(keccak256(encode_header(header)) + compute_merkle_root(leaf_hashes))


def compute_artifact_root(header: ArtifactHeader, positions: Positions) -> bytes:
    """Return artifactRoot for a header and its positions."""
    return compute_artifact_root_from_leaf_hashes(header, compute_leaf_hashes(positions))


def compute_leaf_proof(artifact: Artifact, i: int) -> list[bytes]:
    """Return the Merkle proof of leaf i against positionsRoot (for an on-chain fraud proof)."""
    return compute_merkle_proof(artifact.leaf_hashes, i)


def compute_output_hash(output_ids: Sequence[int] | np.ndarray) -> bytes:
    """Return outputHash = keccak256(uint32 token ids, packed big-endian)."""
    ids = np.asarray(output_ids, dtype=np.int64)
    if ids.size and (ids.min() < 0 or ids.max() > 0xFFFFFFFF):
        raise InvalidParams("output token ids must be uint32", Reason.OUT_OF_RANGE)
    return keccak256(ids.astype(">u4").tobytes())


def encode_artifact_wire(artifact: Artifact, version: int = WIRE_VERSION) -> bytes:
    """Return the wire form: v3 (predicted weights), v2 (columns) or v1 (the canonical encoding's frame)."""
    if version == 1:
        return zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True).compress(encode_artifact(artifact))
    if version not in (2, 3):
        raise InvalidParams(f"no wire version {version}", Reason.OUT_OF_RANGE)
    prefix, columns = (WIRE_V2, encode_columns(artifact)) if version == 2 else (WIRE_V3, encode_columns_v3(artifact))
    return prefix + zstandard.ZstdCompressor(level=ZSTD_LEVEL_V2, write_content_size=True).compress(columns)


def compute_chosen_slots(positions: Positions) -> np.ndarray:
    """Return per position the candidate column that holds the chosen token, K where none does."""
    hit = positions.token_ids == positions.chosen[:, None]
    slots = np.where(hit.any(axis=1), hit.argmax(axis=1), positions.k)
    return slots.astype(np.uint8)


def encode_chosen(positions: Positions) -> tuple[np.ndarray, bytes]:
    """Return the chosen slots and the explicit (uint32) chosen ids of the positions whose slot is K."""
    slots = compute_chosen_slots(positions)
    return slots, positions.chosen[slots == positions.k].astype(">u4").tobytes()


def decode_chosen(slots: np.ndarray, ids: np.ndarray, explicit: np.ndarray) -> np.ndarray:
    """Return the chosen ids: the candidate at each slot below K, else the next explicit id."""
    chosen = np.empty(slots.size, dtype=np.int64)
    inside = slots < ids.shape[1]
    chosen[inside] = ids[inside, slots[inside].astype(np.int64)]
    chosen[~inside] = explicit
    return chosen


def _planes(values: np.ndarray, dtype: str) -> bytes:
    flat = np.ascontiguousarray(values, dtype=dtype).reshape(-1)
    return flat.view(np.uint8).reshape(-1, 4).T.tobytes()


def _from_planes(blob: bytes, count: int, dtype: str) -> np.ndarray:
    planes = np.frombuffer(blob, dtype=np.uint8).reshape(4, count)
    return np.ascontiguousarray(planes.T).view(dtype).reshape(-1)


def encode_columns(artifact: Artifact) -> bytes:
    """Return wire v2's uncompressed content: the header, then the leaves' fields column by column."""
    p = artifact.positions
    _require_u32_columns(p)
    slots, explicit = encode_chosen(p)
    return (encode_header(artifact.header) + slots.tobytes() + explicit
            + _planes(p.token_ids, ">u4") + _planes(p.weights, ">u4") + _planes(p.raw_logprobs, ">f4"))


def decode_columns(raw: bytes) -> Artifact:
    """Return the artifact in wire v2's content, or raise InvalidArtifact (one spelling per artifact)."""
    header, end = decode_header(raw)
    n, k = header.output_length, header.k
    slots = np.frombuffer(raw, dtype=np.uint8, count=n, offset=end) if len(raw) >= end + n else None
    if slots is None:
        raise InvalidArtifact("chosen slots truncated", Reason.TRUNCATED)
    bad = _first(slots > k)
    if bad is not None:
        raise InvalidArtifact(f"chosen slot above K={k}", Reason.NON_CANONICAL, bad)
    outside = int((slots == k).sum())
    expected = end + n + 4 * outside + 3 * 4 * n * k
    if len(raw) != expected:
        reason = Reason.TRUNCATED if len(raw) < expected else Reason.TRAILING_BYTES
        raise InvalidArtifact(f"columns hold {len(raw)} bytes, {expected} expected", reason)
    at = end + n
    explicit = np.frombuffer(raw, dtype=">u4", count=outside, offset=at).astype(np.int64)
    at += 4 * outside
    block = 4 * n * k
    ids = _from_planes(raw[at:at + block], n * k, ">u4").reshape(n, k).astype(np.int64)
    weights = _from_planes(raw[at + block:at + 2 * block], n * k, ">u4").reshape(n, k).astype(np.int64)
    logprobs = _from_planes(raw[at + 2 * block:], n * k, ">f4").reshape(n, k).astype(np.float32)
    chosen = decode_chosen(slots, ids, explicit)
    artifact = Artifact(header, make_positions(chosen, ids, weights, logprobs))
    if encode_columns(artifact) != raw:  # a slot not at the chosen token's first column, or an explicit candidate
        raise InvalidArtifact("non-canonical chosen slot", Reason.NON_CANONICAL)
    return decode_artifact(encode_artifact(artifact))  # the canonical checks of every leaf


def _decompress_frame(data: bytes) -> bytes:
    """Return the content of exactly one zstd frame that declares its size, within the limits."""
    if len(data) > MAX_WIRE_BYTES:
        raise InvalidArtifact(f"wire payload of {len(data)} bytes exceeds {MAX_WIRE_BYTES}", Reason.WIRE_TOO_LARGE)
    try:
        size = zstandard.frame_content_size(data)
    except zstandard.ZstdError as exc:
        raise InvalidArtifact(f"not a zstd frame: {exc}", Reason.WIRE_MALFORMED) from exc
    if size < 0:
        raise InvalidArtifact("zstd frame does not declare its content size", Reason.WIRE_MALFORMED)
    if size > MAX_ARTIFACT_BYTES:
        raise InvalidArtifact(f"declared size {size} exceeds {MAX_ARTIFACT_BYTES}", Reason.ARTIFACT_TOO_LARGE)
    try:
        raw = zstandard.ZstdDecompressor().decompress(data)  # bounded by the declared size
        rest = zstandard.ZstdDecompressor().decompressobj()
        rest.decompress(data)
    except zstandard.ZstdError as exc:
        raise InvalidArtifact(f"corrupt zstd frame: {exc}", Reason.WIRE_MALFORMED) from exc
    if len(raw) != size or rest.unused_data:
        raise InvalidArtifact("bytes after the zstd frame or size mismatch", Reason.TRAILING_BYTES)
    return bytes(raw)


def decode_artifact_wire(data: bytes) -> Artifact:
    """Return the artifact in a wire payload (v1, v2 or v3), or raise InvalidArtifact for anything non-canonical."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise InvalidArtifact("wire payload must be bytes", Reason.WIRE_MALFORMED)
    data = bytes(data)
    if data[:1] == WIRE_V2:
        return decode_columns(_decompress_frame(data[1:]))
    if data[:1] == WIRE_V3:
        return decode_columns_v3(_decompress_frame(data[1:]))
    return decode_artifact(_decompress_frame(data))


def decode_header(raw: bytes) -> tuple[ArtifactHeader, int]:
    """Return the header at the start of raw and its encoded length."""
    if len(raw) < _HEAD.size:
        raise InvalidArtifact("header truncated", Reason.TRUNCATED)
    model_id, t_bits, p_bits, top_k, max_tokens, k, seed, prompt_len = _HEAD.unpack_from(raw)
    if prompt_len > MAX_PROMPT_TOKENS:
        raise InvalidArtifact(f"prompt of {prompt_len} tokens exceeds {MAX_PROMPT_TOKENS}", Reason.LIMIT_EXCEEDED)
    if not 1 <= k <= MAX_K:
        raise InvalidArtifact(f"K={k} outside [1, {MAX_K}]", Reason.LIMIT_EXCEEDED)
    end = _HEAD.size + 4 * prompt_len + 4
    if len(raw) < end:
        raise InvalidArtifact("header truncated in prompt ids", Reason.TRUNCATED)
    prompt = struct.unpack_from(f">{prompt_len}I", raw, _HEAD.size)
    (output_length,) = _U32.unpack_from(raw, end - 4)
    if output_length > MAX_OUTPUT_TOKENS:
        raise InvalidArtifact(f"output of {output_length} tokens exceeds {MAX_OUTPUT_TOKENS}", Reason.LIMIT_EXCEEDED)
    header = ArtifactHeader(model_id, t_bits, p_bits, top_k, max_tokens, k, seed, prompt, output_length)
    try:
        _ = header.params  # validates the float32 params' domain
    except InvalidParams as exc:
        raise InvalidArtifact(f"sampling params out of domain: {exc}", Reason.NON_CANONICAL) from exc
    return header, end


def decode_positions(blob: bytes, k: int, count: int) -> Positions:
    """Return count leaves of K candidates from blob, which must hold exactly them."""
    expected = count * leaf_size(k)
    if len(blob) < expected:
        raise InvalidArtifact(f"leaves truncated: {len(blob)} of {expected} bytes", Reason.TRUNCATED)
    if len(blob) > expected:
        raise InvalidArtifact(f"{len(blob) - expected} bytes after the last leaf", Reason.TRAILING_BYTES)
    rows = np.frombuffer(blob, dtype=_leaf_dtype(k), count=count)
    _require_canonical_rows(rows)
    return make_positions(rows["chosen"], rows["cand"]["id"], rows["cand"]["weight"], rows["cand"]["logprob"])


def _first(mask: np.ndarray) -> int | None:
    hits = np.flatnonzero(mask)
    return int(hits[0]) if hits.size else None


def _require_canonical_rows(rows: np.ndarray) -> None:
    bad_index = _first(rows["i"] != np.arange(rows.shape[0], dtype=np.uint32))
    if bad_index is not None:
        raise InvalidArtifact("leaf index differs from its position", Reason.BAD_POSITION_INDEX, bad_index)
    bad_lp = _first(~np.isfinite(rows["cand"]["logprob"]).all(axis=1))
    if bad_lp is not None:
        raise InvalidArtifact("NaN or inf raw logprob", Reason.NON_FINITE_LOGPROB, bad_lp)
    ids = np.sort(rows["cand"]["id"].astype(np.int64), axis=1)
    dup = _first((ids[:, 1:] == ids[:, :-1]).any(axis=1))
    if dup is not None:
        raise InvalidArtifact("duplicate candidate token id", Reason.DUPLICATE_TOKEN_ID, dup)


def decode_artifact(raw: bytes) -> Artifact:
    """Return the artifact in its uncompressed canonical encoding, or raise InvalidArtifact."""
    if not isinstance(raw, (bytes, bytearray, memoryview)):
        raise InvalidArtifact("artifact must be bytes", Reason.WIRE_MALFORMED)
    raw = bytes(raw)
    if len(raw) > MAX_ARTIFACT_BYTES:
        raise InvalidArtifact(f"artifact of {len(raw)} bytes exceeds {MAX_ARTIFACT_BYTES}", Reason.ARTIFACT_TOO_LARGE)
    header, end = decode_header(raw)
    return Artifact(header, decode_positions(raw[end:], header.k, header.output_length))


# wire v3: the weights predicted from the logprobs (only IEEE-754 +, −, ×, ÷, floor and ldexp in float64, each
# correctly rounded, so every platform predicts the same integers), the residuals coded
_EXP_FLOOR = -700.0  # exp(-700) is still a normal float64: no subnormal (flush-to-zero) dependence
_EXP_CEIL = 40.0
_LN2_HI = 6.93147180369123816490e-01  # fdlibm's split of ln 2: k × _LN2_HI is exact for |k| < 2^11
_LN2_LO = 1.90821492927058770002e-10
_INV_LN2 = 1.44269504088896338700e00
_EXP_TAYLOR = tuple(1.0 / float(np.prod(np.arange(1, j + 1, dtype=np.float64))) for j in range(14))


def compute_exp(x: np.ndarray) -> np.ndarray:
    """Return exp(x) for float64 x clipped to [-700, 40], bit-identical on every IEEE-754 platform (≈1e-15)."""
    x = np.clip(x, _EXP_FLOOR, _EXP_CEIL)
    k = np.rint(x * _INV_LN2)
    r = (x - k * _LN2_HI) - k * _LN2_LO  # |r| <= 0.35
    acc = np.full_like(r, _EXP_TAYLOR[-1])
    for c in _EXP_TAYLOR[-2::-1]:
        acc = acc * r + c
    out: np.ndarray = np.ldexp(acc, k.astype(np.int32))
    return out


def compute_kept_prefix(weights: np.ndarray) -> np.ndarray:
    """Return per row the number of leading non-zero weights (the top-p/top-k kept set when it is within K)."""
    nonzero = np.concatenate([weights != 0, np.zeros((weights.shape[0], 1), dtype=bool)], axis=1)
    kept: np.ndarray = np.argmin(nonzero, axis=1).astype(np.uint8)
    return kept


def compute_weight_predictions(raw_logprobs: np.ndarray, kept: np.ndarray, first_weights: np.ndarray,
                               temperature: float) -> np.ndarray:
    """Return wire v3's predicted weights (N, K) from the logprobs, the kept prefixes and the first weights."""
    # q_j = exp((lp_j − lp_0) / T) ∝ the tempered probability. A row whose kept prefix c < K holds its whole
    # kept set: ŵ_j = ⌊2^32 q_j / Σ_{i<c} q_i⌋ for j < c. A row with c = K may keep tokens beyond K (the mass
    # outside is unknown): w_0 is sent as is, ŵ_j = ⌊w_0 q_j⌋. Beyond c the prediction is 0.
    n, k = raw_logprobs.shape
    lp = raw_logprobs.astype(np.float64)
    x = np.full((n, k), _EXP_FLOOR)
    if temperature > 0.0:
        with np.errstate(invalid="ignore", over="ignore"):
            diff = (lp - lp[:, :1]) / temperature
        x = np.where(np.isfinite(diff), diff, _EXP_FLOOR)
    x[:, 0] = 0.0
    q = compute_exp(x)  # q[:, 0] = 1 exactly
    inside = np.arange(k)[None, :] < kept[:, None].astype(np.int64)
    q_kept = np.where(inside, q, 0.0)
    total = q_kept[:, 0]
    for j in range(1, k):  # sequential sums: the same rounding everywhere
        total = total + q_kept[:, j]
    total = np.maximum(total, 1.0)  # >= q_0 = 1 wherever something is kept; 1 (unused) where nothing is
    whole = np.floor(q_kept * float(WEIGHT_ONE) / total[:, None])
    ratio = np.floor(q * first_weights.astype(np.float64)[:, None])
    ratio[:, 0] = 0.0
    pred = np.where((kept == k)[:, None], ratio, whole)
    pred = np.where(inside, np.minimum(pred, float(WEIGHT_MAX)), 0.0)
    out: np.ndarray = pred.astype(np.int64)
    return out


def _zigzag(residual: np.ndarray) -> np.ndarray:
    signed = (residual % 2**32).astype(np.uint32).view(np.int32).astype(np.int64)
    return np.where(signed >= 0, 2 * signed, -2 * signed - 1).astype(np.uint32)


def _unzigzag(coded: np.ndarray) -> np.ndarray:
    c = coded.astype(np.int64)
    return np.where(c & 1, -(c >> 1) - 1, c >> 1)


def _logprob_deltas(raw_logprobs: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(raw_logprobs, dtype=np.float32).view(np.uint32).astype(np.int64)
    return np.concatenate([bits[:, :1], (bits[:, 1:] - bits[:, :-1]) % 2**32], axis=1)


def _logprobs_from_deltas(deltas: np.ndarray) -> np.ndarray:
    bits = np.cumsum(deltas, axis=1) % 2**32
    return bits.astype(np.uint32).view(np.float32)


def _residual_stream(residuals: np.ndarray, anchored: np.ndarray) -> np.ndarray:
    return np.concatenate([residuals[~anchored, 0], residuals[:, 1:].T.reshape(-1)])


def encode_columns_v3(artifact: Artifact) -> bytes:
    """Return wire v3's uncompressed content: v2's columns with the weights predicted from the logprobs."""
    p = artifact.positions
    _require_u32_columns(p)
    slots, explicit = encode_chosen(p)
    kept = compute_kept_prefix(p.weights)
    anchored = kept == p.k
    pred = compute_weight_predictions(p.raw_logprobs, kept, p.weights[:, 0], artifact.header.params.temperature)
    residuals = _zigzag(p.weights - pred)
    anchors: bytes = p.weights[anchored, 0].astype(">u4").tobytes()
    return (encode_header(artifact.header) + slots.tobytes() + explicit + kept.tobytes() + anchors
            + _planes(p.token_ids, ">u4") + _planes(_logprob_deltas(p.raw_logprobs), ">u4")
            + _planes(_residual_stream(residuals, anchored), ">u4"))


def _read_counts(raw: bytes, at: int, n: int, k: int, what: str) -> np.ndarray:
    if len(raw) < at + n:
        raise InvalidArtifact(f"{what} truncated", Reason.TRUNCATED)
    values = np.frombuffer(raw, dtype=np.uint8, count=n, offset=at)
    bad = _first(values > k)
    if bad is not None:
        raise InvalidArtifact(f"{what} above K={k}", Reason.NON_CANONICAL, bad)
    return values


def decode_columns_v3(raw: bytes) -> Artifact:
    """Return the artifact in wire v3's content, or raise InvalidArtifact (one spelling per artifact)."""
    header, end = decode_header(raw)
    n, k = header.output_length, header.k
    slots = _read_counts(raw, end, n, k, "chosen slots")
    outside = int((slots == k).sum())
    at = end + n + 4 * outside
    kept = _read_counts(raw, at, n, k, "kept prefixes")
    anchored = kept == k
    anchors = int(anchored.sum())
    expected = at + n + 3 * 4 * n * k  # the anchors stand in for as many residuals
    if len(raw) != expected:
        reason = Reason.TRUNCATED if len(raw) < expected else Reason.TRAILING_BYTES
        raise InvalidArtifact(f"v3 columns hold {len(raw)} bytes, {expected} expected", reason)
    explicit = np.frombuffer(raw, dtype=">u4", count=outside, offset=end + n).astype(np.int64)
    at += n
    first = np.zeros(n, dtype=np.int64)
    first[anchored] = np.frombuffer(raw, dtype=">u4", count=anchors, offset=at)
    at += 4 * anchors
    block = 4 * n * k
    ids = _from_planes(raw[at:at + block], n * k, ">u4").reshape(n, k).astype(np.int64)
    deltas = _from_planes(raw[at + block:at + 2 * block], n * k, ">u4").reshape(n, k).astype(np.int64)
    stream = _unzigzag(_from_planes(raw[at + 2 * block:], n * k - anchors, ">u4"))
    logprobs = _logprobs_from_deltas(deltas)
    residuals = np.zeros((n, k), dtype=np.int64)
    residuals[~anchored, 0] = stream[:n - anchors]
    residuals[:, 1:] = stream[n - anchors:].reshape(k - 1, n).T
    residuals[anchored, 0] = first[anchored]
    pred = compute_weight_predictions(logprobs, kept, first, header.params.temperature)
    weights = (pred + residuals) % 2**32
    chosen = decode_chosen(slots, ids, explicit)
    artifact = Artifact(header, make_positions(chosen, ids, weights, logprobs))
    if encode_columns_v3(artifact) != raw:  # a slot, kept prefix or residual that is not the canonical one
        raise InvalidArtifact("non-canonical v3 columns", Reason.NON_CANONICAL)
    return decode_artifact(encode_artifact(artifact))  # the canonical checks of every leaf

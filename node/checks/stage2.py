"""Stage 2, the distribution check (docs/protocol.md): measurements from one prefill, no decisions.

Input: the artifact, the validator's own logits for every generated position (one teacher-forced
pass over prompt + output on the claimed model and dtype) and its hidden states. Output: a frozen
``Stage2Measurements`` of numbers; ``node.checks.decision`` applies a profile's thresholds.

Per position i, with the validator's raw (temperature-1) log-probabilities and its own canonical
sampling distribution under the *declared* params:
- logprob distance: Σ_j |raw_logprob_art[i,j] − raw_logprob_val[cand_j]| over the K candidates;
- candidate mismatch: the artifact's candidate set differs from the validator's own top K;
- weight error: max_j |w_art[i,j] − w_val[cand_j]| / 2^32;
- sampler margin (Token-DiFR idea): 0 when v_i falls inside the chosen token's interval of the
  validator's own CDF, else the probability mass between v_i and that interval;
- surprisal: −log p_val(chosen) under the sampling distribution, against its expectation (the
  entropy) and variance, summed into a z-score; the prefill attack (text from elsewhere, scored
  afterwards) shows as surprisal far above entropy. Perplexity of the raw distribution too.
``distance2`` is the mean per-position logprob distance plus the candidate-mismatch rate (the "+1"
per mismatching position); its raw sum is reported separately.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from node.protocol.artifact import ArtifactHeader, Positions
from node.protocol.errors import InvalidParams, Reason
from node.protocol.fingerprint import ChunkMeasurement
from node.protocol.sampler import (
    WEIGHT_MAX,
    WEIGHT_ONE,
    SamplingParams,
    compute_descending_order,
    compute_integer_weights,
    compute_kept_count,
    compute_raw_logprobs,
    compute_sampling_distribution,
    compute_tempered_probs,
    to_float32_array,
)
from node.protocol.seed import compute_sampler_uniforms

SURPRISAL_FLOOR = 1e-30  # p = 0 under the validator (a masked token was chosen): surprisal capped, not inf


@dataclass(frozen=True)
class PositionMeasurement:
    """Stage-2 numbers for one generated position."""

    logprob_distance: float
    candidates_differ: bool
    weight_error: float
    sampler_margin: float
    surprisal: float
    entropy: float
    surprisal_variance: float
    raw_nll: float


@dataclass(frozen=True)
class Stage2Measurements:
    """Every stage-2 signal for one artifact, as numbers."""

    positions: int
    distance2: float
    logprob_distance_sum: float
    logprob_distance_max: float
    candidate_mismatch_rate: float
    weight_error_max: float
    weight_error_mean: float
    sampler_margin_max: float
    sampler_mismatches: int
    surprisal_z: float
    surprisal_mean: float
    entropy_mean: float
    perplexity: float
    fingerprint: tuple[ChunkMeasurement, ...]
    temperature_deviation: float = 0.0  # |T̂/T − 1|, pooled over positions (compute_temperature_deviation)
    temperature_t: float = 0.0  # |T̂⁻¹ − T⁻¹| over its standard error (compute_temperature_t)
    kept_mass_shift: float = 0.0  # |mean mass kept against the declared top-k/top-p| (compute_kept_mass_shift)
    kept_mass_score: float = 0.0  # kept_mass_shift · √positions: one honest scale at every length
    kept_mass_t: float = 0.0  # the per-position shifts' mean over its standard error (compute_kept_mass_t)

    def as_dict(self) -> dict[str, float | int]:
        """Return the scalar signals (fingerprint summarised by its worst chunk)."""
        worst = max(self.fingerprint, key=lambda m: m.exponent_mismatches, default=None)
        out: dict[str, float | int] = {k: v for k, v in self.__dict__.items() if k != "fingerprint"}
        out["fingerprint_exponent_mismatches_max"] = worst.exponent_mismatches if worst else 0
        out["fingerprint_mantissa_mean_max"] = max((m.mantissa_error_mean for m in self.fingerprint), default=0.0)
        out["fingerprint_mantissa_median_max"] = max((m.mantissa_error_median for m in self.fingerprint), default=0.0)
        out["fingerprint_sign_mismatches_max"] = max((m.sign_mismatches for m in self.fingerprint), default=0)
        return out


def compute_sampler_margin(v: int, cumulative: np.ndarray, index: int) -> float:
    """Return 0 if v lies in [W_{index-1}, W_index), else the mass between v and that interval."""
    low = int(cumulative[index - 1]) if index > 0 else 0
    high = int(cumulative[index])
    if low <= v < high:
        return 0.0
    return (low - v if v < low else v - high + 1) / WEIGHT_ONE


def measure_position(logits: np.ndarray, params: SamplingParams, v: int, chosen: int, token_ids: np.ndarray,
                     weights: np.ndarray, raw_logprobs: np.ndarray) -> PositionMeasurement:
    """Return the stage-2 numbers of one position against the validator's logits row."""
    dist = compute_sampling_distribution(logits, params)
    k = token_ids.size
    own_lp = dist.raw_logprobs
    rank = np.empty(dist.order.size, dtype=np.int64)
    rank[dist.order] = np.arange(dist.order.size)
    own_w = np.zeros(dist.order.size, dtype=np.int64)
    own_w[dist.order] = dist.weights.astype(np.int64)
    cumulative = np.cumsum(dist.weights.astype(np.int64))
    p = own_w.astype(np.float64) / WEIGHT_ONE
    p_chosen = max(float(p[chosen]), SURPRISAL_FLOOR)
    nz = p[p > 0]
    log_nz = np.log(nz)
    entropy = float(-(nz * log_nz).sum())
    variance = float((nz * log_nz**2).sum() - entropy**2)
    return PositionMeasurement(
        logprob_distance=float(np.abs(raw_logprobs.astype(np.float64) - own_lp[token_ids]).sum()),
        candidates_differ=set(token_ids.tolist()) != set(dist.order[:k].tolist()),
        weight_error=float(np.abs(weights.astype(np.int64) - own_w[token_ids]).max() / WEIGHT_ONE),
        sampler_margin=compute_sampler_margin(v, cumulative, int(rank[chosen])),
        surprisal=-math.log(p_chosen),
        entropy=entropy,
        surprisal_variance=max(variance, 0.0),
        raw_nll=float(-own_lp[chosen]),
    )


def compute_top_order(values: np.ndarray, m: int) -> np.ndarray:
    """Return the first ≥ m ids of the canonical descending order (every id tied with the m-th included)."""
    if m >= values.size:
        return compute_descending_order(values)
    kth = np.partition(values, values.size - m)[values.size - m]
    ids = np.flatnonzero(values >= kth)
    ordered: np.ndarray = ids[compute_descending_order(values[ids])]
    return ordered


def compute_own_weights(probs: np.ndarray, params: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """Return (integer weight per token id, the kept ids in canonical order) without a full-vocabulary sort.

    The kept prefix is found by sorting growing top-m slices until top_k and top_p are settled; when
    nothing is masked every token keeps its weight and no order is needed beyond the top K. Equal to
    ``compute_sampling_distribution`` up to the last bit of the normaliser Z (numpy's float64 sum here, the
    exact sum there: at most one weight unit, 2^-32; tested).
    """
    v = probs.size
    limit = v if params.top_k == 0 else min(params.top_k, v)
    weights = np.zeros(v, dtype=np.int64)
    if limit == v and params.top_p >= 1.0:
        p = probs.astype(np.float64)
        weights[:] = np.minimum(np.floor(p * float(WEIGHT_ONE) / p.sum()), float(WEIGHT_MAX)).astype(np.int64)
        return weights, np.zeros(0, dtype=np.int64)
    m = min(limit, 256) if params.top_p >= 1.0 else 256
    while True:
        top = compute_top_order(probs, m)
        keep = compute_kept_count(probs[top], params.top_k, params.top_p)
        if keep < top.size or top.size >= v or (params.top_p >= 1.0 and top.size >= limit):
            break
        m *= 8
    kept = top[:keep]
    weights[kept] = compute_integer_weights(probs[kept]).astype(np.int64)
    return weights, kept


def measure_position_fast(logits: np.ndarray, params: SamplingParams, v: int, chosen: int, token_ids: np.ndarray,
                          weights: np.ndarray, raw_logprobs: np.ndarray) -> PositionMeasurement:
    """Return ``measure_position``'s numbers in O(vocab) time: no full sort (the validator's hot path)."""
    x = to_float32_array(logits)
    k = token_ids.size
    own_lp = compute_raw_logprobs(x)
    if params.temperature == 0.0:
        key = x + np.float32(0.0)
        own_w = np.zeros(x.size, dtype=np.int64)
        top = compute_top_order(key, k)
        own_w[top[0]] = WEIGHT_MAX
    else:
        key = compute_tempered_probs(x, params.temperature) + np.float32(0.0)
        own_w, _ = compute_own_weights(key, params)
        top = compute_top_order(key, k)
    ids = np.arange(x.size)
    before = (key > key[chosen]) | ((key == key[chosen]) & (ids < chosen))  # canonical order precedes chosen
    low = int(own_w[before].sum())
    p = own_w.astype(np.float64) / WEIGHT_ONE
    nz = p[p > 0]
    log_nz = np.log(nz)
    entropy = float(-(nz * log_nz).sum())
    variance = float((nz * log_nz**2).sum() - entropy**2)
    margin_cumulative = np.array([low, low + int(own_w[chosen])], dtype=np.int64)
    return PositionMeasurement(
        logprob_distance=float(np.abs(raw_logprobs.astype(np.float64) - own_lp[token_ids]).sum()),
        candidates_differ=set(token_ids.tolist()) != set(top[:k].tolist()),
        weight_error=float(np.abs(weights.astype(np.int64) - own_w[token_ids]).max() / WEIGHT_ONE),
        sampler_margin=compute_sampler_margin(v, margin_cumulative, 1),
        surprisal=-math.log(max(float(p[chosen]), SURPRISAL_FLOOR)),
        entropy=entropy,
        surprisal_variance=max(variance, 0.0),
        raw_nll=float(-own_lp[chosen]),
    )


def compute_own_candidate_weights(params: SamplingParams, positions: Positions, logits: np.ndarray) -> np.ndarray:
    """Return the validator's integer weights of every position's committed candidates (vectorised where unmasked).

    Equal to ``compute_sampling_distribution``'s weights up to the last bit of the normaliser (numpy's
    float64 sum, not the exact one: one weight unit); masked params (top-k, top-p) fall back to the
    per-row partial sorts.
    """
    n = len(positions)
    x = np.asarray(logits[:n], dtype=np.float32)
    if x.shape[0] != n:
        raise ValueError(f"{x.shape[0]} logits rows for {n} positions")
    if n == 0:
        empty: np.ndarray = positions.weights.astype(np.int64)
        return empty
    if params.temperature != 0.0 and params.top_k == 0 and params.top_p >= 1.0:  # each block checks its rows
        unmasked = np.empty(positions.token_ids.shape, dtype=np.int64)
        scratch = np.empty((min(n, _BLOCK_ROWS), x.shape[1]), dtype=np.float32)
        for start in range(0, n, _BLOCK_ROWS):  # blocks of rows that stay in cache through the six passes
            block = slice(start, min(start + _BLOCK_ROWS, n))
            unmasked[block] = _compute_unmasked_weights(x[block], positions.token_ids[block], params.temperature,
                                                        scratch[: block.stop - block.start])
        return unmasked
    if not np.isfinite(x).all():
        raise InvalidParams("logits contain NaN or inf", Reason.NON_FINITE_LOGITS)
    if params.temperature == 0.0:
        top = np.argmax(x + np.float32(0.0), axis=1)  # first maximum: ties go to the lower id
        own: np.ndarray = np.where(positions.token_ids == top[:, None], WEIGHT_MAX, 0).astype(np.int64)
        return own
    return np.stack([compute_own_weights(compute_tempered_probs(x[i], params.temperature) + np.float32(0.0),
                                         params)[0][positions.token_ids[i]] for i in range(n)]).astype(np.int64)


_BLOCK_ROWS = 16  # 16 rows of a 49,152-token vocabulary: 3 MB


def _compute_unmasked_weights(x: np.ndarray, token_ids: np.ndarray, temperature: float,
                              z: np.ndarray) -> np.ndarray:
    """Return the integer weights of token_ids in rows x, nothing masked; z is scratch of x's shape."""
    tempered = x if temperature == 1.0 else np.divide(x, np.float32(temperature), out=z)  # as compute_tempered_probs
    top = tempered.max(axis=1, keepdims=True)
    if not (np.isfinite(top).all() and np.isfinite(tempered.min())):  # NaN propagates through both
        if np.isfinite(x).all():
            raise InvalidParams(f"logits / {temperature} overflow float32", Reason.NON_FINITE_LOGITS)
        raise InvalidParams("logits contain NaN or inf", Reason.NON_FINITE_LOGITS)
    np.subtract(tempered, top, out=z)
    np.exp(z, out=z)
    np.divide(z, z.sum(axis=1, dtype=np.float32, keepdims=True), out=z)
    total = z.sum(axis=1, dtype=np.float64, keepdims=True)
    p = np.take_along_axis(z, token_ids, axis=1).astype(np.float64)
    weights: np.ndarray = np.minimum(np.floor(p * float(WEIGHT_ONE) / total), float(WEIGHT_MAX)).astype(np.int64)
    return weights


def compute_weight_errors(positions: Positions, own: np.ndarray) -> np.ndarray:
    """Return every position's largest |committed − validator| weight, as a share of 2^32."""
    if not len(positions):
        return np.zeros(0)
    errors: np.ndarray = np.abs(positions.weights.astype(np.int64) - own).max(axis=1) / WEIGHT_ONE
    return errors


def measure_stage2_decision(header: ArtifactHeader, positions: Positions, logits: np.ndarray,
                            fingerprint: tuple[ChunkMeasurement, ...] = ()) -> Stage2Measurements:
    """Return only what the hot path decides on: weight error and the sampler fits (the rest NaN)."""
    params = header.params
    own = compute_own_candidate_weights(params, positions, logits)
    errors = compute_weight_errors(positions, own)
    nan = math.nan
    return Stage2Measurements(
        positions=len(positions), distance2=nan, logprob_distance_sum=nan, logprob_distance_max=nan,
        candidate_mismatch_rate=nan, weight_error_max=float(errors.max()) if errors.size else 0.0,
        weight_error_mean=float(errors.mean()) if errors.size else 0.0, sampler_margin_max=nan,
        sampler_mismatches=0, surprisal_z=nan, surprisal_mean=nan, entropy_mean=nan, perplexity=nan,
        fingerprint=fingerprint, **measure_sampler_fits(params, positions, logits, own).fields())


def measure_stage2(header: ArtifactHeader, positions: Positions, logits: np.ndarray,
                   fingerprint: tuple[ChunkMeasurement, ...] = ()) -> Stage2Measurements:
    """Return every stage-2 signal of an artifact against the validator's prefill logits."""
    n = len(positions)
    if logits.shape[0] != n:
        raise ValueError(f"{logits.shape[0]} logits rows for {n} positions")
    params = header.params
    v = compute_sampler_uniforms(header.run_seed, n)
    rows = [measure_position_fast(logits[i], params, int(v[i]), int(positions.chosen[i]), positions.token_ids[i],
                             positions.weights[i], positions.raw_logprobs[i]) for i in range(n)]
    own = compute_own_candidate_weights(params, positions, logits)
    return replace(summarise(rows, fingerprint), **measure_sampler_fits(params, positions, logits, own).fields())


@dataclass(frozen=True)
class SamplerFits:
    """The pooled signals of the declared sampling params."""

    temperature_deviation: float
    temperature_t: float
    kept_mass_shift: float
    kept_mass_score: float
    kept_mass_t: float

    def fields(self) -> dict[str, Any]:
        """Return the fits as Stage2Measurements field values."""
        return asdict(self)


def measure_sampler_fits(params: SamplingParams, positions: Positions, logits: np.ndarray,
                         own: np.ndarray) -> SamplerFits:
    """Return the temperature fit and the kept-mass shift of the leaves against the declared params."""
    shifts = compute_kept_mass_shifts(params, positions, logits, own)
    shift = compute_kept_mass_shift(shifts)
    pairs = compute_temperature_pairs(positions, logits)  # shared by both temperature fits
    return SamplerFits(temperature_deviation=compute_temperature_deviation(params.temperature, positions, logits,
                                                                           pairs),
                       temperature_t=compute_temperature_t(params.temperature, positions, logits, pairs),
                       kept_mass_shift=shift, kept_mass_score=compute_kept_mass_score(shift, len(positions)),
                       kept_mass_t=compute_kept_mass_t(shifts))


def compute_kept_mass_score(shift: float, positions: int) -> float:
    """Return the kept-mass shift times √positions: honest flips are a zero-mean sum, a top_p lie grows with √n."""
    return shift * math.sqrt(positions)


TEMPERATURE_FIT_MIN_WEIGHT = 2**16  # pairs whose weights are this large: the floor's error is < 2e-5 in the log


@dataclass(frozen=True)
class TemperaturePairs:
    """Logit gaps x = z_0 − z_j and committed log-weight ratios y = ln(w_0/w_j) of the usable pairs."""

    x: np.ndarray  # (n, K−1)
    y: np.ndarray  # (n, K−1); only meaningful where usable
    usable: np.ndarray  # (n, K−1) bool: both weights ≥ TEMPERATURE_FIT_MIN_WEIGHT


def compute_temperature_pairs(positions: Positions, logits: np.ndarray) -> TemperaturePairs:
    """Return every candidate pair (top candidate, j) with its logit gap and committed log-weight ratio."""
    n = len(positions)
    w = positions.weights.astype(np.float64)
    z = np.take_along_axis(np.asarray(logits[:n]), positions.token_ids.astype(np.int64), axis=1).astype(np.float64)
    usable = (w[:, :1] >= TEMPERATURE_FIT_MIN_WEIGHT) & (w[:, 1:] >= TEMPERATURE_FIT_MIN_WEIGHT)
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.where(usable, np.log(np.maximum(w[:, :1], 1.0)) - np.log(np.maximum(w[:, 1:], 1.0)), 0.0)
    return TemperaturePairs(x=np.where(usable, z[:, :1] - z[:, 1:], 0.0), y=y, usable=usable)


def is_exactly_greedy(positions: Positions) -> bool:
    """Check whether every committed leaf carries the canonical greedy weights (all on the top candidate)."""
    return bool(((positions.weights[:, 0] == WEIGHT_MAX) & (positions.weights[:, 1:] == 0).all(axis=1)).all())


def compute_unfittable_temperature(temperature: float, positions: Positions) -> float | None:
    """Return a temperature fit's value where there is no slope to fit (no positions, greedy), else None.

    Greedy decoding has no noise to average: its canonical weights are exactly one-hot, so any other
    leaf is infinitely far (inf).
    """
    if len(positions) == 0:
        return 0.0
    if temperature == 0.0:
        return 0.0 if is_exactly_greedy(positions) else math.inf
    return None


def compute_temperature_deviation(temperature: float, positions: Positions, logits: np.ndarray,
                                  pairs: TemperaturePairs | None = None) -> float:
    """Return |T̂/T − 1|, where 1/T̂ is the pooled slope of the committed log-weight ratios on the logit gaps.

    Honest sampling at T puts ln(w_0/w_j) = (z_0 − z_j)/T for every pair of kept candidates, whatever
    top-k/top-p keep; per-position noise (bf16 execution) averages out over the pairs, a temperature lie
    does not. Greedy: see compute_unfittable_temperature; 0 where nothing can be measured (fewer than
    two weighted candidates). ``pairs``: already computed from the same positions and logits.
    """
    unfittable = compute_unfittable_temperature(temperature, positions)
    if unfittable is not None:
        return unfittable
    pairs = pairs or compute_temperature_pairs(positions, logits)
    sxx = float((pairs.x * pairs.x).sum())
    sxy = float((pairs.x * pairs.y).sum())
    if sxx <= 1e-12 or sxy <= 0.0:
        return math.inf if sxx > 1e-12 else 0.0
    return abs(sxx / (sxy * temperature) - 1.0)


def compute_temperature_t(temperature: float, positions: Positions, logits: np.ndarray,
                          pairs: TemperaturePairs | None = None) -> float:
    """Return |1/T̂ − 1/T| in standard errors of the pooled slope, clustered by position.

    The deviation's noise shrinks with the number of pairs, so one threshold on it is set by the shortest
    responses; this statistic is on one scale at every length while a real lie grows with √positions.
    Pairs of one position share its top candidate's noise, so the error is the cluster-robust one
    (sandwich over positions, G/(G−1) corrected); 0 with fewer than two positions to cluster.
    """
    unfittable = compute_unfittable_temperature(temperature, positions)
    if unfittable is not None:
        return unfittable
    pairs = pairs or compute_temperature_pairs(positions, logits)
    sxx = float((pairs.x * pairs.x).sum())
    clusters = int(pairs.usable.any(axis=1).sum())
    if sxx <= 1e-12 or clusters < 2:
        return 0.0
    slope = float((pairs.x * pairs.y).sum()) / sxx
    scores = (pairs.x * (pairs.y - slope * pairs.x)).sum(axis=1)
    variance = clusters / (clusters - 1) * float((scores * scores).sum()) / sxx**2
    gap = abs(slope - 1.0 / temperature)
    if variance <= 0.0:
        return 0.0 if gap == 0.0 else math.inf
    return gap / math.sqrt(variance)


def compute_kept_mass_shifts(params: SamplingParams, positions: Positions, logits: np.ndarray,
                             own: np.ndarray) -> np.ndarray:
    """Return per position how far the leaf's kept candidates miss the declared top-k/top-p cut (signed).

    Per position, with C(c) the validator's untruncated tempered mass of the first c committed
    candidates: 0 where leaf and validator keep as many; where the leaf keeps fewer, +the mass it
    dropped, but at most top_p − C(kept) (how far short of the nucleus it stopped); where it keeps
    more, −the mass it added, but at most C(kept − 1) − top_p (how far past the nucleus it went).
    Honest noise flips a candidate at the cut in either direction and only by the noise in C; a
    top_p lie misses the cut in one direction at every truncated position. A top-k cut counts the
    whole mass. 0 under greedy decoding, where the weight error and the temperature checks decide.
    """
    n = len(positions)
    shifts: np.ndarray = np.zeros(n)
    all_leaf = (positions.weights > 0).sum(axis=1)
    all_validator = (own > 0).sum(axis=1)
    moved = np.nonzero(all_leaf != all_validator)[0]  # only these rows need the normaliser (the costly part)
    if n == 0 or params.temperature == 0.0 or moved.size == 0:
        return shifts
    leaf, validator = all_leaf[moved], all_validator[moved]
    z = np.asarray(logits[moved], dtype=np.float64) / params.temperature
    log_norm = z.max(axis=1, keepdims=True)
    log_norm = log_norm + np.log(np.exp(z - log_norm).sum(axis=1, keepdims=True))
    p = np.exp(np.take_along_axis(z, positions.token_ids[moved].astype(np.int64), axis=1) - log_norm)
    cumulative = np.concatenate([np.zeros((moved.size, 1)), np.cumsum(p, axis=1)], axis=1)  # C(0..K)
    rows = np.arange(moved.size)
    between = np.abs(cumulative[rows, leaf] - cumulative[rows, validator])
    nucleus_cut = (params.top_p < 1.0) & (validator != params.top_k)
    short = np.clip(params.top_p - cumulative[rows, leaf], 0.0, None)
    past = np.clip(cumulative[rows, np.maximum(leaf - 1, 0)] - params.top_p, 0.0, None)
    fewer = np.where(nucleus_cut, np.minimum(between, short), between)
    more = np.where(nucleus_cut, np.minimum(between, past), between)
    shifts[moved] = np.where(leaf < validator, fewer, -more)
    return shifts


def compute_kept_mass_shift(shifts: np.ndarray) -> float:
    """Return |mean| of the per-position kept-mass shifts (0 without positions)."""
    return abs(float(shifts.mean())) if shifts.size else 0.0


def compute_kept_mass_t(shifts: np.ndarray) -> float:
    """Return |mean| of the per-position kept-mass shifts over its standard error (a one-sample t-value).

    One honest position can move the cut by a lot (bf16 shifted a logit gap by ~0.6 in one measured
    run: 0.105 of mass), which a mean carries into the run's score; a t-value is 1 for any single
    spike, whatever its size, while a lie shifts many positions the same way. 0 when nothing moved.
    """
    n = shifts.size
    if n < 2 or not shifts.any():
        return 0.0
    mean = float(shifts.mean())
    sd = float(shifts.std(ddof=1))
    return abs(mean) / (sd / math.sqrt(n)) if sd > 0.0 else math.inf


def compute_surprisal_z(surprisal: float, entropy: float, variance: float) -> float:
    """Return (Σ surprisal − Σ entropy) / √(Σ variance); without variance 0 if not above the entropy, else inf."""
    if variance > 1e-12:
        return (surprisal - entropy) / math.sqrt(variance)
    return 0.0 if surprisal <= entropy + 1e-9 else math.inf


def summarise(rows: list[PositionMeasurement], fingerprint: tuple[ChunkMeasurement, ...]) -> Stage2Measurements:
    """Return the artifact-level signals from per-position measurements."""
    n = max(len(rows), 1)
    dist = np.array([r.logprob_distance for r in rows] or [0.0])
    mismatch = sum(r.candidates_differ for r in rows) / n
    weight = np.array([r.weight_error for r in rows] or [0.0])
    margin = np.array([r.sampler_margin for r in rows] or [0.0])
    surprisal = sum(r.surprisal for r in rows)
    entropy = sum(r.entropy for r in rows)
    variance = sum(r.surprisal_variance for r in rows)
    z = compute_surprisal_z(surprisal, entropy, variance)
    return Stage2Measurements(
        positions=len(rows), distance2=float(dist.mean()) + mismatch, logprob_distance_sum=float(dist.sum()),
        logprob_distance_max=float(dist.max()), candidate_mismatch_rate=mismatch,
        weight_error_max=float(weight.max()), weight_error_mean=float(weight.mean()),
        sampler_margin_max=float(margin.max()), sampler_mismatches=int((margin > 0).sum()),
        surprisal_z=z, surprisal_mean=surprisal / n, entropy_mean=entropy / n,
        perplexity=math.exp(sum(r.raw_nll for r in rows) / n), fingerprint=fingerprint,
    )


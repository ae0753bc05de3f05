"""The stock-sampler check (issue 19, part 2): measurements from one prefill, no decisions.

For an operator that runs a stock engine's sampler, there are no leaves to replay: the validator
has the prompt, the output tokens, the declared params and (for vLLM's seeded sampler) the request
seed, and its own logits from one teacher-forced pass over prompt + output. Per position i, with ℓ
the validator's vLLM sampling logits (÷ T, top-k/top-p masked: node.protocol.vllm_sampler) and g the
reproduced Gumbel noise of that step:

- Token-DiFR: max_j (ℓ_j + g_j) − (ℓ_c + g_c) for the chosen token c, ≥ 0 and 0 exactly when the
  validator's own noisy argmax is the operator's token. Honest numerics only move near-ties, so the
  margins stay small; another model, weights, temperature or noise leave a margin at most positions.
  A token the validator's top-k/top-p masks is scored with its unmasked tempered logit (finite; the
  count of such positions is reported apart). Greedy (T < 1e-5): max_j z_j − z_c on the raw logits.
- Surprisal (for engines whose noise cannot be reproduced; STAMP's sampler check): −log p(c) under
  softmax(ℓ) against its expectation (the entropy) and variance, pooled into a z-score (signed: a
  temperature lie up shows above 0, sharpening below). Greedy positions carry no randomness: left out.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from node.checks.stage2 import SURPRISAL_FLOOR, compute_surprisal_z
from node.protocol.errors import InvalidParams, Reason
from node.protocol.sampler import SamplingParams
from node.protocol.vllm_sampler import compute_gumbel_noise, compute_processed_logits, compute_step_seeds, is_greedy


@dataclass(frozen=True, eq=False)
class StockPositions:
    """Per-position stock-sampler numbers of one response (arrays of equal length)."""

    difr: np.ndarray  # float64 Token-DiFR margins; NaN where the noise is unknown
    mismatch: np.ndarray  # bool: the validator's noisy argmax is another token
    masked: np.ndarray  # bool: the validator's top-k/top-p masks the chosen token
    surprisal: np.ndarray  # float64 −log p(chosen)
    entropy: np.ndarray  # float64 expectation of the surprisal
    variance: np.ndarray  # float64 variance of the surprisal

    def __len__(self) -> int:
        return int(self.difr.size)


@dataclass(frozen=True)
class StockMeasurements:
    """The stock-sampler signals of one response, as numbers."""

    positions: int
    difr_mean: float
    difr_max: float
    difr_q90: float
    difr_mismatch_rate: float
    masked_choices: int
    surprisal_z: float
    surprisal_mean: float
    entropy_mean: float

    @property
    def surprisal_z_abs(self) -> float:
        """Return |surprisal z| (the two-sided statistic the decision uses)."""
        return abs(self.surprisal_z)

    def as_dict(self) -> dict[str, float | int]:
        """Return every signal by name (with the two-sided surprisal)."""
        return {**asdict(self), "surprisal_z_abs": self.surprisal_z_abs}


def _require_inputs(logits: np.ndarray, output_ids: tuple[int, ...] | list[int]) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(logits)
    ids = np.asarray(output_ids, dtype=np.int64).reshape(-1)
    if x.ndim != 2 or x.shape[0] != ids.size:
        raise InvalidParams(f"{x.shape} logits for {ids.size} output tokens: one row per token needed",
                            Reason.OUT_OF_RANGE)
    if ids.size and (ids.min() < 0 or ids.max() >= x.shape[1]):
        raise InvalidParams(f"output token id outside [0, {x.shape[1]})", Reason.OUT_OF_RANGE)
    return x.astype(np.float32, copy=False), ids


def measure_stock_positions(logits: np.ndarray, output_ids: tuple[int, ...] | list[int], params: SamplingParams,
                            request_seed: int | None) -> StockPositions:
    """Return the per-position Token-DiFR margins (if the seed is known) and surprisals of a response."""
    x, ids = _require_inputs(logits, output_ids)
    n = ids.size
    rows = np.arange(n)
    processed = compute_processed_logits(x, params) if n else np.zeros((0, x.shape[1]), dtype=np.float32)
    if is_greedy(params):
        top = processed.max(axis=1) if n else np.zeros(0)
        difr = (top.astype(np.float64) - processed[rows, ids].astype(np.float64))
        zero = np.zeros(n)
        return StockPositions(difr, np.argmax(processed, axis=1) != ids if n else np.zeros(0, dtype=bool),
                              np.zeros(n, dtype=bool), zero, zero, zero)
    finite = np.isfinite(processed)
    masked = ~finite[rows, ids]
    if request_seed is None:
        difr, mismatch = np.full(n, math.nan), np.zeros(n, dtype=bool)
    else:
        noise = compute_gumbel_noise(compute_step_seeds(request_seed, n), x.shape[1])
        noisy = processed.astype(np.float64) + noise
        best = np.argmax(noisy, axis=1)
        tempered = (x[rows, ids] / np.float32(params.temperature)).astype(np.float64)  # unmasked, as vLLM divides
        difr = np.maximum(noisy[rows, best] - (tempered + noise[rows, ids]), 0.0)
        mismatch = best != ids
    surprisal, entropy, variance = compute_surprisals(processed, finite, ids)
    return StockPositions(difr, mismatch, masked, surprisal, entropy, variance)


def compute_surprisals(processed: np.ndarray, finite: np.ndarray,
                       ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return per row −log p(chosen), the entropy and the surprisal variance of softmax(processed)."""
    z = np.where(finite, processed.astype(np.float64), -np.inf)
    z -= z.max(axis=1, keepdims=True)
    log_norm = np.log(np.exp(z).sum(axis=1, keepdims=True))
    logp = np.where(finite, z - log_norm, 0.0)
    p = np.where(finite, np.exp(logp), 0.0)
    entropy = -(p * logp).sum(axis=1)
    variance = np.maximum((p * logp**2).sum(axis=1) - entropy**2, 0.0)
    chosen = p[np.arange(ids.size), ids]
    surprisal = -np.log(np.maximum(chosen, SURPRISAL_FLOOR))
    return surprisal, entropy, variance


def summarise_stock(positions: StockPositions, n: int | None = None) -> StockMeasurements:
    """Return the response-level signals of the first n positions (all by default)."""
    n = len(positions) if n is None else n
    if not 0 <= n <= len(positions):
        raise InvalidParams(f"prefix {n} outside [0, {len(positions)}]", Reason.OUT_OF_RANGE)
    difr = positions.difr[:n]
    known = n > 0 and not np.isnan(difr).any()
    return StockMeasurements(
        positions=n,
        difr_mean=float(difr.mean()) if known else (0.0 if n == 0 else math.nan),
        difr_max=float(difr.max()) if known else (0.0 if n == 0 else math.nan),
        difr_q90=float(np.quantile(difr, 0.9)) if known else (0.0 if n == 0 else math.nan),
        difr_mismatch_rate=float(positions.mismatch[:n].mean()) if known else (0.0 if n == 0 else math.nan),
        masked_choices=int(positions.masked[:n].sum()),
        surprisal_z=compute_surprisal_z(float(positions.surprisal[:n].sum()), float(positions.entropy[:n].sum()),
                                        float(positions.variance[:n].sum())),
        surprisal_mean=float(positions.surprisal[:n].mean()) if n else 0.0,
        entropy_mean=float(positions.entropy[:n].mean()) if n else 0.0,
    )


def measure_stock_sampler(logits: np.ndarray, output_ids: tuple[int, ...] | list[int], params: SamplingParams,
                          request_seed: int | None) -> StockMeasurements:
    """Return the stock-sampler signals of a response against the validator's prefill logits."""
    return summarise_stock(measure_stock_positions(logits, output_ids, params, request_seed))

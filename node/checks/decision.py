"""Stage-2 decision: thresholds from a calibrated profile applied to measurements, a typed reason out.

Signals are checked in a fixed order (the most specific evidence first); the first one over its
threshold names the reason. ``scores_digest`` binds the exact numbers the decision saw, for the
signed verdict.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from node.checks.fingerprint import FingerprintThresholds, decide_fingerprint
from node.checks.stage2 import Stage2Measurements
from node.errors import Reason
from node.protocol.hashing import keccak256
from node.protocol.prompt import canonical_json


@dataclass(frozen=True)
class Stage2Thresholds:
    """Upper bounds per signal, from the model profile (inf disables a signal)."""

    max_weight_error: float
    max_sampler_margin: float
    max_logprob_distance: float
    max_candidate_mismatch_rate: float
    max_surprisal_z: float
    max_distance2: float
    fingerprint: FingerprintThresholds
    max_temperature_deviation: float = math.inf
    max_temperature_t: float = math.inf
    max_kept_mass_shift: float = math.inf
    max_kept_mass_score: float = math.inf
    max_kept_mass_t: float = math.inf
    by_length: tuple[tuple[int, tuple[tuple[str, float], ...]], ...] = ()  # (min positions, (field, threshold)…)


@dataclass(frozen=True)
class Stage2Decision:
    """Valid or not, why, and the digest of the scores behind it."""

    reason: Reason
    scores_digest: bytes

    @property
    def valid(self) -> bool:
        """Check whether every signal was within its threshold."""
        return self.reason is Reason.OK


def compute_scores_digest(m: Stage2Measurements) -> bytes:
    """Return keccak256 of the canonical JSON of the scalar scores (non-finite values as strings)."""
    scores = {k: (v if not isinstance(v, float) or math.isfinite(v) else repr(v)) for k, v in m.as_dict().items()}
    return keccak256(canonical_json(scores))


def is_weight_error_only(t: Stage2Thresholds) -> bool:
    """Check whether a profile decides stage 2 on what the hot path measures: weight error, temperature fit."""
    return all(math.isinf(x) for x in (t.max_sampler_margin, t.max_logprob_distance, t.max_candidate_mismatch_rate,
                                       t.max_distance2, t.max_surprisal_z))


def select_length_bucket(lengths: Iterable[int], positions: int) -> int | None:
    """Return the longest calibrated length not above the positions (None: shorter than every one)."""
    return max((n for n in lengths if n <= positions), default=None)


T_VALUES = ("max_temperature_t", "max_kept_mass_t")


def compute_beyond_calibration_scale(positions: int, longest: int) -> float:
    """Return how much a t-value threshold grows for a response longer than the longest calibrated length.

    A t-value of a mean with any honest bias grows like √positions (bf16 executers keep slightly
    fewer top_p candidates than an fp32 validator computes: over 1,579 honest runs at 64 tokens the
    mean kept-mass shift is 4.5e-5, 18 standard errors above 0), so beyond the calibrated lengths
    the threshold grows the same way. A lie's t-value grows like √positions too, so detection stays
    what it was at the longest calibrated length.
    """
    return math.sqrt(positions / longest) if positions > longest > 0 else 1.0


def select_thresholds_for_length(t: Stage2Thresholds, positions: int) -> Stage2Thresholds:
    """Return the thresholds for this many positions: the longest length bucket not above it overrides.

    Only signals the profile decides on (a finite flat threshold) take a bucket's value; shorter than
    every bucket, the flat thresholds (the largest) apply; longer than every bucket, t-values scale
    by compute_beyond_calibration_scale.
    """
    bucket = select_length_bucket((n for n, _ in t.by_length), positions)
    if bucket is None:
        return t
    values = dict(t.by_length)[bucket]
    scale = compute_beyond_calibration_scale(positions, max(n for n, _ in t.by_length))
    overrides: dict[str, Any] = {name: value * scale if name in T_VALUES else value
                                 for name, value in values if math.isfinite(getattr(t, name))}
    return replace(t, **overrides)


def find_stage2_violation(m: Stage2Measurements, t: Stage2Thresholds) -> Reason:
    """Return the first signal over its threshold, or Reason.OK (a decided signal left unmeasured raises)."""
    t = select_thresholds_for_length(t, m.positions)
    checks = (
        (m.weight_error_max, t.max_weight_error, Reason.WEIGHT_ERROR),
        (m.temperature_deviation, t.max_temperature_deviation, Reason.TEMPERATURE_FIT),
        (m.temperature_t, t.max_temperature_t, Reason.TEMPERATURE_FIT),
        (m.kept_mass_t, t.max_kept_mass_t, Reason.TOP_P_FIT),
        (m.kept_mass_score, t.max_kept_mass_score, Reason.TOP_P_FIT),
        (m.kept_mass_shift, t.max_kept_mass_shift, Reason.TOP_P_FIT),
        (m.sampler_margin_max, t.max_sampler_margin, Reason.SAMPLER_MARGIN),
        (m.logprob_distance_max, t.max_logprob_distance, Reason.LOGPROB_DISTANCE),
        (m.candidate_mismatch_rate, t.max_candidate_mismatch_rate, Reason.CANDIDATE_MISMATCH),
        (m.distance2, t.max_distance2, Reason.DISTANCE2),
        (m.surprisal_z, t.max_surprisal_z, Reason.SURPRISAL),
    )
    for value, threshold, reason in checks:
        if math.isnan(value) and not math.isinf(threshold):
            raise ValueError(f"{reason.name}: the profile decides on a signal that was not measured")
        if value > threshold:
            return reason
    return decide_fingerprint(m.fingerprint, t.fingerprint).reason


def decide_stage2(m: Stage2Measurements, t: Stage2Thresholds) -> Stage2Decision:
    """Return the stage-2 decision for measurements under a profile's thresholds."""
    return Stage2Decision(find_stage2_violation(m, t), compute_scores_digest(m))

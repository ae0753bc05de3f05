"""Detection and feasibility maths over (X, Y, Z) (pure).

X: the latency bound on an answer. Y: the proximal memory of a device (from a trusted hardware catalog,
not from the prover). Z: the least time to recompute one evicted stuffing block (its cone). The scheme is
sound on a machine when honest answers fit in X even under load, Z exceeds X (an evicted block cannot be
recomputed in time), the next tier's latency exceeds X (state moved there answers late), and what the
stuffing leaves free of Y is smaller than any useful undeclared workload.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from node.spotcheck.answers import compute_challenge_indices
from node.spotcheck.errors import InvalidSpotParams


def compute_labels_hit_probability(n_blocks: int, evicted: int, count: int) -> float:
    """Return P(a labels challenge naming `count` distinct blocks names at least one of `evicted`) exactly."""
    if not (0 <= evicted <= n_blocks and 1 <= count and n_blocks >= 1):
        raise InvalidSpotParams(f"{evicted} evicted, {count} named of {n_blocks} blocks")
    count = min(count, n_blocks)
    if evicted == 0:
        return 0.0
    if n_blocks - evicted < count:
        return 1.0
    # C(N−E, k) / C(N, k) in logs: the chance that every named block was kept
    log_miss = (math.lgamma(n_blocks - evicted + 1) - math.lgamma(n_blocks - evicted - count + 1)
                - math.lgamma(n_blocks + 1) + math.lgamma(n_blocks - count + 1))
    return 1.0 - math.exp(log_miss)


def compute_detection_probability(rate_hz: float, window_s: float, share: float, per_challenge: float) -> float:
    """Return 1 − exp(−rate·window·share·p): Poisson challenges, a `share` of them of the kind that can catch."""
    if rate_hz < 0 or window_s < 0 or not 0 <= share <= 1 or not 0 <= per_challenge <= 1:
        raise InvalidSpotParams("rate, window, share and per-challenge probability must be non-negative (≤ 1)")
    return 1.0 - math.exp(-rate_hz * window_s * share * per_challenge)


def compute_false_alarm_probability(n_challenges: int, p_late: float, max_late: int) -> float:
    """Return P(more than max_late of n honest answers are late) for an honest late rate p (binomial tail)."""
    if n_challenges < 0 or not 0 <= p_late <= 1 or max_late < 0:
        raise InvalidSpotParams("challenges and tolerance must be non-negative, the late rate in [0, 1]")
    within = sum(math.comb(n_challenges, j) * p_late**j * (1 - p_late) ** (n_challenges - j)
                 for j in range(min(max_late, n_challenges) + 1))
    return max(0.0, 1.0 - within)


def compute_max_late(n_challenges: int, p_late: float, target: float) -> int:
    """Return the least tolerance m (late answers a window may hold) whose false-alarm probability ≤ target."""
    if not 0 < target < 1:
        raise InvalidSpotParams(f"false-alarm target {target} outside (0, 1)")
    m = 0
    while m < n_challenges and compute_false_alarm_probability(n_challenges, p_late, m) > target:
        m += 1
    return m


@dataclass(frozen=True)
class FeasibilityInputs:
    """The measured quantities (seconds and bytes) that decide whether (X, Y, Z) is sound on a machine."""

    x_s: float
    y_bytes: int
    z_min_s: float
    honest_latency_max_s: float
    far_extra_s: float
    free_bytes: int
    min_undeclared_bytes: int


@dataclass(frozen=True)
class FeasibilityMargins:
    """The margins (ratios > 1 mean the condition holds) of each soundness condition."""

    x_over_honest: float
    z_over_x: float
    far_over_x: float
    undeclared_over_free: float


def compute_feasibility_margins(inputs: FeasibilityInputs) -> FeasibilityMargins:
    """Return the soundness margins: X/honest, Z/X, (honest+far)/X and undeclared/free (measurement only)."""
    if inputs.x_s <= 0:
        raise InvalidSpotParams(f"latency bound X = {inputs.x_s} s must be positive")
    honest = max(inputs.honest_latency_max_s, 1e-9)
    return FeasibilityMargins(
        x_over_honest=inputs.x_s / honest,
        z_over_x=inputs.z_min_s / inputs.x_s,
        far_over_x=(inputs.far_extra_s + honest) / inputs.x_s,
        undeclared_over_free=inputs.min_undeclared_bytes / max(inputs.free_bytes, 1),
    )


def is_sound(margins: FeasibilityMargins, safety: float = 1.5) -> bool:
    """Check whether every condition holds with the given safety factor (X and Z) or at all (far, free)."""
    return (margins.x_over_honest >= safety and margins.z_over_x >= safety and margins.far_over_x > 1.0
            and margins.undeclared_over_free > 1.0)


def estimate_detection(rng: np.random.Generator, n_blocks: int, evicted_fraction: float, count: int,
                       rate_hz: float, window_s: float, share: float, trials: int) -> float:
    """Return the fraction of simulated windows in which a labels challenge names an evicted block.

    Monte Carlo over the real index derivation: Poisson challenges per window, a `share` of them labels
    challenges with fresh random nonces, against a random evicted set of the given fraction.
    """
    evicted = np.zeros(n_blocks, dtype=bool)
    evicted[rng.choice(n_blocks, round(evicted_fraction * n_blocks), replace=False)] = True
    caught = 0
    for _ in range(trials):
        labels = rng.binomial(rng.poisson(rate_hz * window_s), share)
        named = (compute_challenge_indices(rng.bytes(32), n_blocks, count) for _ in range(labels))
        caught += any(evicted[idx].any() for idx in named)
    return caught / trials

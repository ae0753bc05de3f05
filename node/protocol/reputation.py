"""Bayesian spoofer probability (docs/protocol.md): float reference and the contract's 1e18 fixed point.

α is the model's calibrated false-positive rate, β = P(valid verdict | spoofer).
invalid: P' = P(1−β) / (P(1−β) + (1−P)α);  valid: P' = Pβ / (Pβ + (1−P)(1−α)).

Fixed point, exactly as the contract computes it (all uint256, floor division, no overflow since
every product is below 1e54):
    num = P·(WAD−β)          den = num + (WAD−P)·α           (invalid)
    num = P·β                den = num + (WAD−P)·(WAD−α)     (valid)
    P'  = num·WAD / den      (P unchanged if den = 0), then clamped to [P_MIN, P_MAX].
"""

from __future__ import annotations

from node.protocol.errors import InvalidParams, Reason

WAD = 10**18
P_MIN_WAD = 10**12  # 1e-6
P_MAX_WAD = WAD - 10**6  # 1 − 1e-12
PRIOR_WAD = 10**16  # 1 %
P_MIN = 1e-6
P_MAX = 1 - 1e-12
PRIOR = 0.01


def _require_wad(value: int, name: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= WAD:
        raise InvalidParams(f"{name} must be an integer in [0, 1e18], got {value!r}", Reason.OUT_OF_RANGE)


def _require_unit(value: float, name: str) -> None:
    if not 0.0 <= value <= 1.0:
        raise InvalidParams(f"{name} must be in [0, 1], got {value!r}", Reason.OUT_OF_RANGE)


def clamp_probability_wad(p: int) -> int:
    """Return p clamped to [1e-6, 1 − 1e-12] in 1e18 fixed point."""
    return min(max(p, P_MIN_WAD), P_MAX_WAD)


def compute_posterior_wad(p: int, alpha: int, beta: int, valid: bool) -> int:
    """Return the spoofer probability after one verdict, in 1e18 fixed point as the contract does."""
    for value, name in ((p, "P"), (alpha, "alpha"), (beta, "beta")):
        _require_wad(value, name)
    if valid:
        num = p * beta
        den = num + (WAD - p) * (WAD - alpha)
    else:
        num = p * (WAD - beta)
        den = num + (WAD - p) * alpha
    return clamp_probability_wad(p if den == 0 else num * WAD // den)


def compute_posterior(p: float, alpha: float, beta: float, valid: bool) -> float:
    """Return the spoofer probability after one verdict (float reference)."""
    for value, name in ((p, "P"), (alpha, "alpha"), (beta, "beta")):
        _require_unit(value, name)
    if valid:
        num = p * beta
        den = num + (1 - p) * (1 - alpha)
    else:
        num = p * (1 - beta)
        den = num + (1 - p) * alpha
    return min(max(p if den == 0 else num / den, P_MIN), P_MAX)


def compute_check_probability_wad(p: int, min_rate: int) -> int:
    """Return the probability that an inference is checked, max(min_rate, P), in 1e18 fixed point."""
    _require_wad(p, "P")
    _require_wad(min_rate, "min_rate")
    return max(min_rate, p)


def compute_check_probability(p: float, min_rate: float) -> float:
    """Return max(min_rate, P) (float reference)."""
    _require_unit(p, "P")
    _require_unit(min_rate, "min_rate")
    return max(min_rate, p)


def is_slashable(p: int, slash_threshold: int) -> bool:
    """Check whether an operator with spoofer probability p (1e18) has reached the slash threshold."""
    return p >= slash_threshold

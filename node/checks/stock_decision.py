"""The stock-sampler decision: a "stock sampler" profile's thresholds applied to node.checks.stock's numbers.

Signals in a fixed order, the first over its threshold names the reason: the largest Token-DiFR margin
(TOKEN_DIFR_MAX: one position whose margin the honest logit noise cannot explain), the mean margin
(TOKEN_DIFR), then the two-sided surprisal z (SURPRISAL). An
infinite threshold leaves a signal reported, not decided on; a decided signal that was not measured
(NaN: the noise of an engine that cannot be reproduced) raises. Thresholds per length: the longest
calibrated length not above the response's positions overrides the flat (largest) ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from node.checks.decision import Stage2Decision, select_length_bucket
from node.checks.stock import StockMeasurements
from node.errors import Reason
from node.protocol.hashing import keccak256
from node.protocol.prompt import canonical_json


@dataclass(frozen=True)
class StockThresholds:
    """Upper bounds per stock-sampler signal (inf: reported only)."""

    max_difr_mean: float = math.inf
    max_difr_max: float = math.inf
    max_surprisal_z_abs: float = math.inf
    by_length: tuple[tuple[int, tuple[tuple[str, float], ...]], ...] = ()  # (min positions, (field, threshold)…)


def select_stock_thresholds(t: StockThresholds, positions: int) -> StockThresholds:
    """Return the thresholds for this many positions (a decided signal takes its length bucket's value)."""
    bucket = select_length_bucket((n for n, _ in t.by_length), positions)
    if bucket is None:
        return t
    overrides: dict[str, Any] = {name: value for name, value in dict(t.by_length)[bucket]
                                 if math.isfinite(getattr(t, name))}
    return replace(t, **overrides)


def find_stock_violation(m: StockMeasurements, t: StockThresholds) -> Reason:
    """Return the first signal over its threshold, or Reason.OK."""
    t = select_stock_thresholds(t, m.positions)
    checks = ((m.difr_max, t.max_difr_max, Reason.TOKEN_DIFR_MAX), (m.difr_mean, t.max_difr_mean, Reason.TOKEN_DIFR),
              (m.surprisal_z_abs, t.max_surprisal_z_abs, Reason.SURPRISAL))
    for value, threshold, reason in checks:
        if math.isnan(value) and not math.isinf(threshold):
            raise ValueError(f"{reason.name}: the profile decides on a signal that was not measured")
        if value > threshold:
            return reason
    return Reason.OK


def compute_stock_scores_digest(m: StockMeasurements) -> bytes:
    """Return keccak256 of the canonical JSON of the stock signals (non-finite values as strings)."""
    scores = {k: (v if not isinstance(v, float) or math.isfinite(v) else repr(v)) for k, v in m.as_dict().items()}
    return keccak256(canonical_json(scores))


def decide_stock(m: StockMeasurements, t: StockThresholds) -> Stage2Decision:
    """Return the stock-sampler decision with the digest of the scores behind it."""
    return Stage2Decision(find_stock_violation(m, t), compute_stock_scores_digest(m))

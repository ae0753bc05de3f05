"""Trajectory checks: the ledger's optional loss, gradient norm and learning rate, read cheaply at every step.

The learning rate is declared: a ledger lr that is not the declared schedule's float32 value is a typed
rejection (`verify_declared_schedule`). Loss and gradient norm are not declared, only plausible: per
step t a robust z-score of the loss change d(t) = loss(t) − loss(t−1) and of log gradient norm against
the median and MAD of the trailing `window` values (`compute_trajectory_measurement`, numbers only).
`decide_trajectory` maps the scores to an audit-rate multiplier (p → min(1, p·m)): the auditor audits
extra steps off-chain with it; a trajectory score never makes a verdict on its own.

Pure: numpy only, no clock, no I/O; the declared learning rates are passed in.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from node.protocol.ledger import InvalidTraining, LedgerEntry, TrainingReason

MAD_TO_SIGMA = 1.4826  # MAD × this estimates σ of a normal sample


@dataclass(frozen=True)
class TrajectoryMeasurement:
    """Robust z-scores per step (NaN where the trailing history is too short); numbers only."""

    steps: tuple[int, ...]
    loss_jump_z: tuple[float, ...]  # (d(t) − median d) / (1.4826 · MAD d) over the trailing window
    grad_norm_z: tuple[float, ...]  # the same of log ‖g(t)‖
    window: int

    @property
    def max_abs_loss_jump_z(self) -> float:
        """Return the largest |z| of the loss changes (0 when none is defined)."""
        return _max_abs(self.loss_jump_z)

    @property
    def max_abs_grad_norm_z(self) -> float:
        """Return the largest |z| of the log gradient norms (0 when none is defined)."""
        return _max_abs(self.grad_norm_z)


def _max_abs(values: Sequence[float]) -> float:
    finite = [abs(v) for v in values if math.isfinite(v)]
    return max(finite, default=0.0)


@dataclass(frozen=True)
class TrajectoryPolicy:
    """Thresholds of the trajectory decision (from the honest calibration) and the multiplier it applies."""

    loss_jump_z: float
    grad_norm_z: float
    multiplier: float = 4.0


@dataclass(frozen=True)
class TrajectoryDecision:
    """The audit-rate multiplier for a run and the steps whose scores raised it."""

    multiplier: float
    flagged_steps: tuple[int, ...]


def verify_declared_schedule(entries: Sequence[LedgerEntry], declared_lr: Sequence[float]) -> None:
    """Raise InvalidTraining at the first step t ≥ 1 whose ledger lr is not float32(declared_lr[t]) bit for bit."""
    for entry in entries:
        if entry.step == 0:
            continue
        if entry.step >= len(declared_lr):
            raise InvalidTraining("step past the declared schedule", TrainingReason.SCHEDULE_MISMATCH, entry.step)
        claimed, declared = np.float32(entry.lr), np.float32(declared_lr[entry.step])
        if claimed.tobytes() != declared.tobytes():
            raise InvalidTraining(f"ledger lr {float(claimed):.6g} is not the declared {float(declared):.6g}",
                                  TrainingReason.SCHEDULE_MISMATCH, entry.step)


def compute_robust_z(values: np.ndarray, window: int, min_history: int) -> np.ndarray:
    """Return per index i the z of values[i] against median/MAD of the finite values in [i−window, i) (NaN if fewer
    than min_history)."""
    out = np.full(values.shape, np.nan)
    for i in range(values.size):
        history = values[max(0, i - window):i]
        history = history[np.isfinite(history)]
        if history.size < min_history or not math.isfinite(values[i]):
            continue
        median = float(np.median(history))
        spread = MAD_TO_SIGMA * float(np.median(np.abs(history - median)))
        floor = 1e-3 * float(np.mean(np.abs(history))) + 1e-12  # a flat history must not make every change infinite
        out[i] = (values[i] - median) / max(spread, floor)
    return out


def compute_trajectory_measurement(entries: Sequence[LedgerEntry], window: int = 8,
                                   min_history: int = 4) -> TrajectoryMeasurement:
    """Return the robust z-scores of loss changes and log gradient norms of the training steps (t ≥ 1)."""
    if window < 2 or not 2 <= min_history <= window:
        raise InvalidTraining(f"trajectory window {window} / history {min_history} invalid",
                              TrainingReason.LEDGER_MALFORMED)
    train = [e for e in entries if e.step >= 1]
    loss = np.asarray([e.loss for e in train], dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_norm = np.log(np.asarray([e.grad_norm for e in train], dtype=np.float64))
    jumps = np.concatenate([[np.nan], np.diff(loss)]) if loss.size else loss
    return TrajectoryMeasurement(
        steps=tuple(e.step for e in train),
        loss_jump_z=tuple(float(z) for z in compute_robust_z(jumps, window, min_history)),
        grad_norm_z=tuple(float(z) for z in compute_robust_z(log_norm, window, min_history)),
        window=window)


def decide_trajectory(m: TrajectoryMeasurement, policy: TrajectoryPolicy) -> TrajectoryDecision:
    """Return the multiplier: `policy.multiplier` when any step's |z| passes its threshold, else 1."""
    flagged = tuple(t for t, lz, gz in zip(m.steps, m.loss_jump_z, m.grad_norm_z, strict=True)
                    if abs(lz) > policy.loss_jump_z or abs(gz) > policy.grad_norm_z)  # NaN compares False
    return TrajectoryDecision(multiplier=policy.multiplier if flagged else 1.0, flagged_steps=flagged)


def compute_raised_rate(p: float, decision: TrajectoryDecision) -> float:
    """Return the raised audit rate min(1, p · multiplier)."""
    if not (0.0 <= p <= 1.0 and decision.multiplier >= 1.0):
        raise InvalidTraining(f"audit rate {p} or multiplier {decision.multiplier} invalid",
                              TrainingReason.LEDGER_MALFORMED)
    return min(1.0, p * decision.multiplier)


def compute_extra_audit_probability(p: float, raised: float) -> float:
    """Return the chance to audit a step the chain did not draw, so that the total rate is `raised`."""
    return 0.0 if raised <= p or p >= 1.0 else (raised - p) / (1.0 - p)

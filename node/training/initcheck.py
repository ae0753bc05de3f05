"""The initialisation check: a Kolmogorov–Smirnov test of Z(0) against the declared strategy, per tensor.

Matrices must look like draws from normal(0, 0.02); norm weights must be exactly one. The KS
p-values are measured here; `decide_init` applies a Bonferroni-corrected level from calibration.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

from node.training.model import INIT_STD, build_model
from node.training.spec import RunSpec


@dataclass(frozen=True)
class InitMeasurement:
    """KS p-values of the step-0 matrices and whether every norm weight is exactly one."""

    min_p_value: float
    worst_tensor: str
    tensors: int
    norms_exact: bool


def get_param_slices(spec: RunSpec) -> list[tuple[str, tuple[int, ...], int, int]]:
    """Return (name, shape, start, stop) of each parameter inside the flat vector."""
    model = build_model(spec)
    out, start = [], 0
    for name, p in model.named_parameters():
        out.append((name, tuple(p.shape), start, start + p.numel()))
        start += p.numel()
    return out


def compute_init_measurement(spec: RunSpec, params: np.ndarray, sample: int, seed: int) -> InitMeasurement:
    """Return the KS measurement of a flat parameter vector (matrices subsampled to `sample` entries)."""
    rng = np.random.default_rng(seed)
    worst, worst_name, tensors, norms_exact = 1.0, "", 0, True
    for name, shape, start, stop in get_param_slices(spec):
        values = params[start:stop].astype(np.float64)
        if len(shape) == 1:
            norms_exact = norms_exact and bool(np.all(values == 1.0))
            continue
        if values.size > sample:
            values = rng.choice(values, size=sample, replace=False)
        p = float(stats.kstest(values, "norm", args=(0.0, INIT_STD)).pvalue)
        tensors += 1
        if p < worst:
            worst, worst_name = p, name
    return InitMeasurement(min_p_value=worst, worst_tensor=worst_name, tensors=tensors, norms_exact=norms_exact)


def is_init_accepted(measurement: InitMeasurement, alpha: float) -> bool:
    """Check whether Z(0) passes: norms exact and every tensor's p-value ≥ alpha / tensors (Bonferroni)."""
    return measurement.norms_exact and measurement.min_p_value >= alpha / max(1, measurement.tensors)

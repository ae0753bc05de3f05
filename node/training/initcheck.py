"""The initialisation check: KS and moment tests of Z(0) against the declared strategy, per tensor.

Matrices must look like draws from normal(0, 0.02); norm weights must be exactly one. The KS test
(a 200k subsample per matrix) and the full-tensor moment tests (mean, variance, kurtosis) are measured
here; `is_init_accepted` / `is_moment_accepted` apply Bonferroni-corrected levels from calibration.
The moment tests see what a lightly pre-trained init with reset norms keeps: a heavier-tailed
embedding (kurtosis), which the KS test on a subsample misses.
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


@dataclass(frozen=True)
class MomentMeasurement:
    """Full-tensor moment tests of the step-0 matrices against normal(0, σ): the smallest two-sided p-value."""

    min_p_value: float
    worst: str  # "<tensor>:<mean|variance|kurtosis>"
    tests: int  # 3 per matrix


def compute_moment_measurement(spec: RunSpec, params: np.ndarray) -> MomentMeasurement:
    """Return two-sided tests of each whole matrix: mean (z, exact under the declared normal), variance about 0
    (Σx²/σ² ~ χ²_n, exact) and kurtosis (D'Agostino's `scipy.stats.kurtosistest`)."""
    worst, worst_name, tests = 1.0, "", 0
    for name, shape, start, stop in get_param_slices(spec):
        if len(shape) == 1:
            continue
        x = params[start:stop].astype(np.float64)
        n = x.size
        chi = float(np.sum(x * x)) / INIT_STD**2
        p_values = {"mean": float(2.0 * stats.norm.sf(abs(float(np.mean(x)) / (INIT_STD / np.sqrt(n))))),
                    "variance": float(min(1.0, 2.0 * min(stats.chi2.cdf(chi, n), stats.chi2.sf(chi, n)))),
                    "kurtosis": float(stats.kurtosistest(x).pvalue)}
        for kind, p in p_values.items():
            tests += 1
            if p < worst:
                worst, worst_name = p, f"{name}:{kind}"
    return MomentMeasurement(min_p_value=worst, worst=worst_name, tests=tests)


def is_moment_accepted(measurement: MomentMeasurement, alpha: float) -> bool:
    """Check whether every moment test's p-value is ≥ alpha / tests (Bonferroni)."""
    return measurement.min_p_value >= alpha / max(1, measurement.tests)

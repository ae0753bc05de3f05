"""The spot-check report's plot: detection probability against challenge rate and stolen fraction (matplotlib)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global figure state

from node.spotcheck.feasibility import (
    compute_detection_probability,
    compute_labels_hit_probability,
    estimate_detection,
)


@dataclass(frozen=True)
class DetectionCurve:
    """Detection probability per window at each rate, analytic and Monte Carlo, for one stolen fraction."""

    fraction: float
    rates_hz: tuple[float, ...]
    analytic: tuple[float, ...]
    monte_carlo: tuple[float, ...]


def compute_detection_curves(n_blocks: int, count: int, share: float, window_s: float,
                             fractions: Sequence[float], rates_hz: Sequence[float], trials: int,
                             seed: int = 0) -> list[DetectionCurve]:
    """Return one curve per stolen fraction over the rates (Monte Carlo uses the real index derivation)."""
    rng = np.random.default_rng(seed)
    curves = []
    for f in fractions:
        hit = compute_labels_hit_probability(n_blocks, round(f * n_blocks), count)
        analytic = tuple(compute_detection_probability(r, window_s, share, hit) for r in rates_hz)
        mc = tuple(estimate_detection(rng, n_blocks, f, count, r, window_s, share, trials) for r in rates_hz)
        curves.append(DetectionCurve(f, tuple(rates_hz), analytic, mc))
    return curves


def write_detection_plot(curves: Sequence[DetectionCurve], observed: Sequence[tuple[float, float, float]],
                         path: Path, title: str) -> None:
    """Plot the curves (lines analytic, dots Monte Carlo) and observed (fraction, rate, detected share) points."""
    fig = Figure(figsize=(7, 4.5))
    ax = fig.subplots()
    for curve in curves:
        line = ax.plot(curve.rates_hz, curve.analytic, label=f"{curve.fraction:.0%} evicted (analytic)")[0]
        ax.scatter(curve.rates_hz, curve.monte_carlo, color=line.get_color(), s=14, marker="o")
    for fraction, rate, detected in observed:
        ax.scatter([rate], [detected], marker="*", s=160, edgecolor="black", zorder=5,
                   label=f"sim: {fraction:.0%} evicted, windows caught")
    ax.set_xscale("log")
    ax.set_xlabel("challenge rate per device (Hz)")
    ax.set_ylabel("P(window detected)")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)

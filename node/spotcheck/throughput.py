"""The declared-throughput check's arithmetic (pure): a step's cost from the model's shape, work and device time.

A device leaves no room for undeclared work only if its declared work fills its capacity. The verifier
computes the cost of one declared step itself, from the declared model's configuration (never from the
prover), multiplies it by the declared steps the record shows in a window, and compares the sum with what
the device kind can do in that window: the catalogue's FLOP/s × the share of that peak the declared model
reaches on the kind (measured by the verifier, like the catalogue) × the device seconds of the window.
On a dedicated accelerator the device seconds are the window's wall time; the simulation's devices share
two CPU cores, so there they are the CPU time the kernel gave the device's process (metered by the pinger).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

from node.spotcheck.errors import InvalidSpotParams


@dataclass(frozen=True)
class ModelShape:
    """The parts of a llama configuration that fix a forward pass's cost (the verifier's own copy)."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    vocab: int

    def __post_init__(self) -> None:
        if min(self.layers, self.hidden, self.intermediate, self.heads, self.kv_heads, self.vocab) < 1 or (
                self.hidden % self.heads or self.heads % self.kv_heads):
            raise InvalidSpotParams(f"not a llama shape: {self}")


def compute_step_flops(shape: ModelShape, window: int) -> int:
    """Return the multiply-add FLOPs (2 per MAC) of one declared step: `window` tokens, logits of the last one."""
    if window < 1:
        raise InvalidSpotParams(f"window {window} < 1")
    head_dim = shape.hidden // shape.heads
    kv = shape.kv_heads * head_dim
    # q and o: hidden × hidden; k and v: hidden × kv; gate, up, down: hidden × intermediate
    per_token = shape.hidden * (2 * shape.hidden + 2 * kv + 3 * shape.intermediate)
    attention = 2 * window * window * shape.hidden  # scores (Q·Kᵀ) and the weighted sum (A·V), all heads
    return 2 * (shape.layers * (window * per_token + attention) + shape.hidden * shape.vocab)


def compute_overlap_steps(steps: Sequence[tuple[int, int]], start_ns: int, end_ns: int) -> float:
    """Return the declared steps done in [start, end): each (start, end) step counts the share of it inside."""
    if end_ns <= start_ns:
        raise InvalidSpotParams(f"empty window [{start_ns}, {end_ns})")
    total = 0.0
    for s0, s1 in steps:
        if s1 <= s0:
            total += start_ns <= s1 < end_ns  # an instantaneous step counts where it ends
            continue
        inside = min(s1, end_ns) - max(s0, start_ns)
        if inside > 0:
            total += inside / (s1 - s0)
    return total


def compute_meter_seconds(samples: Sequence[tuple[int, int]], start_ns: int, end_ns: int) -> float | None:
    """Return the device seconds a (time, device-time) meter shows in [start, end), interpolated; None if unmetered.

    Samples come in time order from a meter the verifier runs (the pinger); outside the sampled span the
    meter is extrapolated by nothing: only the part of the window the samples cover counts.
    """
    if end_ns <= start_ns:
        raise InvalidSpotParams(f"empty window [{start_ns}, {end_ns})")
    if len(samples) < 2:
        return None

    def at(t: int) -> float:
        for (t0, c0), (t1, c1) in pairwise(samples):
            if t0 <= t <= t1:
                return c0 if t1 == t0 else c0 + (c1 - c0) * (t - t0) / (t1 - t0)
        return float(samples[0][1] if t < samples[0][0] else samples[-1][1])

    return max(0.0, at(end_ns) - at(start_ns)) / 1e9


"""The protocol's canonical sampler (docs/protocol.md §2, node/protocol/sampler.py) as a StableHLO graph.

temperature → softmax (float32) → stable descending sort (ties: lower id) → top-k mask → top-p
mask (float32 cumulative sum) → integer weights floor(p·2^32/Z) in float64 → walk with v. The
graph is the sampler written as explicit ops; its IREE replay is compared with node.protocol on
recorded logits. Float32 reductions (softmax sum, cumsum) may be ordered differently from numpy's,
so a pick can differ where v falls within rounding distance of a cumulative-weight boundary: that
rate is measured (``measure_sampler_agreement``), not assumed to be zero. Temperature 0 (greedy)
is a separate, trivial graph (argmax, ties lower id) and is not exported here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from node.protocol.sampler import SamplingParams, sample_position
from node.workload.export import Exported, export_function
from node.workload.replay import CompiledGraph, get_compiled
from node.workload.store import WorkloadRecord

WEIGHT_ONE = 2.0**32
# IREE demotes f64 to f32 for StableHLO input by default; the weights need float64 as in the protocol
SAMPLER_COMPILE_FLAGS = ("--iree-input-demote-f64-to-f32=false",)


def compute_blocked_cumsum(x: torch.Tensor, block: int = 256) -> torch.Tensor:
    """Return the inclusive cumulative sum of a vector in blocks (IREE lowers a flat cumsum in O(n^2)).

    Exact for integers; for float32 the summation order differs from numpy's sequential cumsum.
    """
    n = x.shape[0]
    pad = (-n) % block
    rows = torch.cat([x, x.new_zeros(pad)]).reshape(-1, block)
    inner = torch.cumsum(rows, dim=1)
    offsets = torch.cumsum(inner[:, -1], dim=0) - inner[:, -1]
    return (inner + offsets[:, None]).reshape(-1)[:n]


def compute_canonical_sample(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor,
                             top_k: torch.Tensor, v: torch.Tensor, k: int) -> tuple[torch.Tensor, ...]:
    """Return (chosen id, K candidate ids, K candidate weights) with the canonical sampler's ops (T > 0)."""
    vocab = logits.shape[-1]
    z = logits / temperature
    e = torch.exp(z - z.max())
    probs = e / e.sum()
    ranks = torch.arange(vocab, dtype=torch.int64)
    # unique sort keys, as node.protocol does: probabilities are >= +0, so their float32 bits order
    # like the values; descending value, then ascending id (ids < 2^20)
    bits = probs.view(torch.int32).to(torch.int64)
    keys, _ = torch.sort((2**31 - 1 - bits) * 2**20 + ranks)
    order = torch.remainder(keys, 2**20)
    sorted_probs = probs[order]
    limit = torch.where(top_k > 0, torch.minimum(top_k, torch.tensor(vocab)), torch.tensor(vocab))
    reached = compute_blocked_cumsum(sorted_probs) >= top_p
    first = torch.where(reached, ranks, torch.tensor(vocab)).min() + 1  # vocab + 1 when never reached
    keep = torch.where(top_p < 1.0, torch.minimum(limit, first), limit)
    kept = ranks < keep
    p64 = torch.where(kept, sorted_probs, torch.zeros_like(sorted_probs)).to(torch.float64)
    w = torch.floor(p64 * WEIGHT_ONE / p64.sum())
    weights = torch.minimum(w, torch.tensor(WEIGHT_ONE - 1, dtype=torch.float64)).to(torch.int64)
    cum = compute_blocked_cumsum(weights)
    above = cum > v
    j = torch.where(above, ranks, torch.tensor(vocab)).min()
    chosen = torch.where(j < vocab, order[torch.clamp(j, max=vocab - 1)], order[0])
    return chosen, order[:k], weights[:k]


def export_sampler_graph(vocab: int, k: int) -> Exported:
    """Export the canonical sampler for one vocabulary size and K as a StableHLO graph."""
    example = {"logits": torch.zeros(vocab), "temperature": torch.tensor(1.0), "top_p": torch.tensor(1.0),
               "top_k": torch.tensor(0, dtype=torch.int64), "v": torch.tensor(0, dtype=torch.int64)}
    return export_function(lambda **x: compute_canonical_sample(k=k, **x), example,
                           name=f"canonical-sampler-v{vocab}-k{k}", output_names=["chosen", "candidate_ids",
                                                                                 "candidate_weights"],
                           input_roles={"v": "rng_seed"})


def compile_sampler(exported: Exported, record: WorkloadRecord | None = None) -> CompiledGraph:
    """Compile (or load from the record's cache) the sampler graph with float64 kept."""
    vmfb, _ = get_compiled(exported.graph, record, extra_args=SAMPLER_COMPILE_FLAGS)
    return CompiledGraph(vmfb)


@dataclass(frozen=True)
class SamplerAgreement:
    """How often the IREE sampler graph agrees with node.protocol on the same logits and v."""

    positions: int
    chosen_equal: int
    candidates_equal: int
    weights_equal: int
    max_weight_diff: int


def measure_sampler_agreement(compiled: CompiledGraph, rows: list[tuple[np.ndarray[Any, Any], int]],
                              params: SamplingParams, k: int) -> SamplerAgreement:
    """Run both samplers on (logits, v) rows; count agreements (the decision is the caller's)."""
    chosen = cands = weights = 0
    max_diff = 0
    for logits, v in rows:
        ref = sample_position(logits, params, k, v)
        out = compiled.run([np.asarray(logits, np.float32), np.asarray(params.temperature, np.float32),
                            np.asarray(params.top_p, np.float32), np.asarray(params.top_k, np.int64),
                            np.asarray(v, np.int64)])
        chosen += int(int(out[0]) == ref.chosen)
        cands += int(tuple(int(t) for t in out[1]) == ref.token_ids)
        diff = max(abs(int(a) - int(b)) for a, b in zip(out[2], ref.weights, strict=True))
        weights += int(diff == 0)
        max_diff = max(max_diff, diff)
    return SamplerAgreement(len(rows), chosen, cands, weights, max_diff)

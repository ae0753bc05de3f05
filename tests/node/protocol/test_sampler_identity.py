"""The fast sampler path equals, bit for bit, a frozen copy of the sampler it replaced.

``reference_distribution`` and ``reference_sample`` are the implementation of
node/protocol/sampler.py before the sample_position fast path (commit 81d08ec), kept here
unchanged so that any later drift of either path shows up as a difference. Since 26 Nov the
protocol's normaliser Z is the exactly rounded sum rather than numpy's pairwise one; the two differ
only in Z's last bit, which moved no weight on any row here (were it to, this test would say so).
"""

from __future__ import annotations

import numpy as np
import pytest

from node.protocol.errors import InvalidParams
from node.protocol.sampler import (
    WEIGHT_MAX,
    SamplingParams,
    compute_sampling_distribution,
    sample_position,
    tail_exhaustion_floor,
)

SMOLLM2_VOCAB = 49152


# --- frozen reference (do not edit) -----------------------------------------------------------------

def _ref_order(values: np.ndarray) -> np.ndarray:
    v = np.asarray(values, dtype=np.float32)
    if np.signbit(v).any():
        bits = (v + np.float32(0.0)).view(np.uint32)
        descending = np.uint32(0xFFFFFFFF) - np.where(bits >> 31 == 1, ~bits, bits | np.uint32(0x80000000))
    else:
        descending = np.uint32(0x7FFFFFFF) - v.view(np.uint32)
    order = np.argsort((descending & np.uint32(0xFFFF)).astype(np.uint16), kind="stable")
    high = (descending >> np.uint32(16)).astype(np.uint16)[order]
    return order[np.argsort(high, kind="stable")].astype(np.int64, copy=False)


def _ref_raw_logprobs(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max()
    return (z - np.log(np.exp(z).sum(dtype=np.float32))).astype(np.float32)


def _ref_tempered_probs(logits: np.ndarray, temperature: float) -> np.ndarray:
    z = logits / np.float32(temperature)
    assert np.isfinite(z).all()
    z -= z.max()
    np.exp(z, out=z)
    z /= z.sum(dtype=np.float32)
    return z


def _ref_kept_count(sorted_probs: np.ndarray, top_k: int, top_p: float) -> int:
    keep = sorted_probs.size if top_k == 0 else min(top_k, sorted_probs.size)
    if top_p < 1.0:
        reached = np.cumsum(sorted_probs, dtype=np.float32) >= np.float32(top_p)
        if reached.any():
            keep = min(keep, int(np.argmax(reached)) + 1)
    return keep


def _ref_integer_weights(kept_probs: np.ndarray) -> np.ndarray:
    p = kept_probs.astype(np.float64)
    total = p.sum()
    p *= float(2**32)
    p /= total
    np.floor(p, out=p)
    np.minimum(p, float(WEIGHT_MAX), out=p)
    return p.astype(np.uint64)


def reference_distribution(x: np.ndarray, params: SamplingParams) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return (order, weights, raw log-probs) as the replaced compute_sampling_distribution did."""
    weights = np.zeros(x.size, dtype=np.uint64)
    if params.temperature == 0.0:
        order = _ref_order(x)
        weights[0] = WEIGHT_MAX
    else:
        probs = _ref_tempered_probs(x, params.temperature)
        order = _ref_order(probs)
        sorted_probs = probs[order]
        keep = _ref_kept_count(sorted_probs, params.top_k, params.top_p)
        weights[:keep] = _ref_integer_weights(sorted_probs[:keep])
    return order, weights, _ref_raw_logprobs(x)


def reference_sample(dist: tuple[np.ndarray, np.ndarray, np.ndarray], k: int, v: int) -> tuple:
    """Return the replaced sample_position's fields from a reference distribution."""
    order, weights, raw = dist
    ids = order[:k]
    j = int(np.searchsorted(np.cumsum(weights), np.uint64(v), side="right"))
    chosen = int(order[j]) if j < order.size else int(ids[0])
    return (chosen, tuple(int(t) for t in ids), tuple(int(w) for w in weights[:k]),
            tuple(float(lp) for lp in raw[ids]), float(raw[chosen]))


# --- rows and settings -------------------------------------------------------------------------------

SETTINGS = [
    SamplingParams(1.0, 1.0, 0),
    SamplingParams(0.7, 0.95, 0),
    SamplingParams(0.8, 1.0, 40),
    SamplingParams(0.0),
    SamplingParams(1.3, 0.5, 3),
    SamplingParams(0.05, 0.9, 0),  # low temperature: most probabilities underflow to tied zeros
    SamplingParams(1.0, float(np.nextafter(np.float32(1.0), np.float32(0.0))), 0),  # top-p just below 1
    SamplingParams(0.9, 0.999, 2000),
    SamplingParams(0.002, 1.0, 0),  # near-greedy; logits / T overflows float32 on the huge-range rows
]


def smollm2_like(rng: np.random.Generator, size: int = SMOLLM2_VOCAB) -> np.ndarray:
    """Return a row shaped like SmolLM2's: a wide normal bulk, a few spiking tokens, float32."""
    x = rng.normal(rng.uniform(-8, 2), rng.uniform(1.0, 3.5), size)
    spikes = rng.integers(0, size, rng.integers(1, 30))
    x[spikes] += rng.uniform(5, 25, spikes.size)
    return x.astype(np.float32)


def edge_row(rng: np.random.Generator, kind: int) -> np.ndarray:
    """Return a row with ties, signed zeros, huge or tiny ranges."""
    size = int(rng.choice([1, 2, 3, 7, 64, 65, 129, 1000, 4099, 20000]))
    if kind == 0:  # heavy ties: few distinct values
        x = rng.integers(-3, 3, size).astype(np.float32) * np.float32(rng.uniform(0.1, 4))
    elif kind == 1:  # signed zeros among small values
        x = rng.choice(np.array([-0.0, 0.0, -1e-30, 1e-30, -1.0, 1.0], dtype=np.float32), size)
    elif kind == 2:  # huge range (still finite at T >= 0.05)
        x = rng.uniform(-1e36, 1e36, size).astype(np.float32)
    elif kind == 3:  # tiny range: nearly uniform
        x = (np.float32(rng.uniform(-5, 5)) + rng.normal(0, 1e-6, size)).astype(np.float32)
    else:  # all equal
        x = np.full(size, rng.uniform(-50, 50), dtype=np.float32)
    return x


def v_values(rng: np.random.Generator, weights: np.ndarray, size: int) -> list[int]:
    """Return v's at the edges of the cumulative weights, random ones and the tail-exhaustion edge."""
    cumulative = np.cumsum(weights)
    total = int(cumulative[-1])
    picks = {0, 1, WEIGHT_MAX, WEIGHT_MAX - 1, total, max(total - 1, 0), tail_exhaustion_floor(size),
             tail_exhaustion_floor(size) - 1}
    nonzero = np.flatnonzero(weights)
    for j in rng.choice(nonzero, min(4, nonzero.size), replace=False):
        picks |= {int(cumulative[j]) - 1, int(cumulative[j])}
    picks |= {int(cumulative[min(300, size - 1)]), int(cumulative[min(300, size - 1)]) - 1}  # past the walk prefix
    picks |= {int(u) for u in rng.integers(0, 2**32, 3, dtype=np.uint64)}
    return sorted(p for p in picks if 0 <= p <= WEIGHT_MAX)


def assert_identical(x: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> None:
    """Compare the distribution and the samples for many v (and K) with the frozen reference."""
    try:
        ref = reference_distribution(x, params)
    except AssertionError:  # logits / T overflow: both paths must refuse
        with pytest.raises(InvalidParams):
            sample_position(x, params, 1, 0)
        return
    dist = compute_sampling_distribution(x, params)
    assert np.array_equal(dist.order, ref[0]) and dist.order.dtype == ref[0].dtype
    assert np.array_equal(dist.weights, ref[1]) and dist.weights.dtype == ref[1].dtype
    assert np.array_equal(dist.raw_logprobs.view(np.uint32), ref[2].view(np.uint32))
    ks = [1, min(5, x.size), min(64, x.size)]
    for i, v in enumerate(v_values(rng, ref[1], x.size)):
        k = ks[i % 3] if i % 4 else int(rng.integers(1, min(64, x.size) + 1))
        s = sample_position(x, params, k, v)
        got = (s.chosen, s.token_ids, s.weights, s.raw_logprobs, s.chosen_raw_logprob)
        assert got == reference_sample(ref, k, v), (params, k, v)
        assert all(type(w) is int for w in s.weights) and type(s.chosen) is int


@pytest.mark.parametrize("seed", range(10))
def test_sample_position_equals_the_frozen_reference_on_smollm2_shaped_rows(seed):
    # 10 seeds × 200 rows of 49,152 logits, the settings in turn (≥ 222 rows each), ~17 v's per row
    rng = np.random.default_rng(seed)
    for i in range(200):
        assert_identical(smollm2_like(rng), SETTINGS[(i + seed) % len(SETTINGS)], rng)


@pytest.mark.parametrize("kind", range(5))
def test_sample_position_equals_the_frozen_reference_on_edge_rows(kind):
    # 5 kinds × 60 rows × every setting (2,700 pairs): ties, signed zeros, huge and tiny ranges, 1 to 20,000 tokens
    rng = np.random.default_rng(100 + kind)
    for _ in range(60):
        x = edge_row(rng, kind)
        for params in SETTINGS:
            assert_identical(x, params, rng)


def test_sample_position_takes_torch_rows_like_numpy_rows():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(7)
    x = smollm2_like(rng)
    for params in SETTINGS[:4]:
        assert sample_position(torch.from_numpy(x), params, 5, 123456789) == sample_position(x, params, 5, 123456789)

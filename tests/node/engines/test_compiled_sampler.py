"""The executer's compiled sampler returns sample_position's bits, on every row and v tried."""

from __future__ import annotations

import numpy as np
import pytest

from node.engines import compiled_sampler
from node.engines.compiled_sampler import sample_position_compiled, sample_positions_compiled
from node.errors import InvalidParams
from node.protocol.sampler import WEIGHT_MAX, SamplingParams, compute_sampling_distribution, sample_position
from tests.node.protocol.test_sampler_identity import SETTINGS, edge_row, smollm2_like, v_values

UNMASKED = [
    SamplingParams(1.0),
    SamplingParams(0.7),
    SamplingParams(1.3),
    SamplingParams(0.05),  # most probabilities underflow to tied zeros
    SamplingParams(0.002),  # near-greedy; logits / T overflows on the huge-range rows
    SamplingParams(1.0, 1.0, 2**20),  # a top-k beyond the vocabulary masks nothing
]


def assert_same(x: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> None:
    """Compare both paths for v's at the cumulative weights' edges (and past the leading tokens)."""
    try:
        weights = compute_sampling_distribution(x, params).weights
    except InvalidParams:
        with pytest.raises(InvalidParams):
            sample_position_compiled(x, params, 1, 0)
        return
    ks = [1, min(5, x.size), min(64, x.size)]
    for i, v in enumerate(v_values(rng, weights, x.size)):
        k = ks[i % 3]
        assert sample_position_compiled(x, params, k, v) == sample_position(x, params, k, v), (params, k, v)


def test_the_kernels_are_compiled():
    assert compiled_sampler._KERNELS is not None  # numba is a dependency: the fast path is what runs


@pytest.mark.parametrize("seed", range(4))
def test_equal_to_sample_position_on_smollm2_shaped_rows(seed):
    rng = np.random.default_rng(1000 + seed)
    for i in range(60):
        assert_same(smollm2_like(rng), UNMASKED[(i + seed) % len(UNMASKED)], rng)


@pytest.mark.parametrize("kind", range(5))
def test_equal_to_sample_position_on_edge_rows(kind):
    # ties, signed zeros, huge and tiny ranges, 1 to 20,000 tokens (fewer than the 256 leading ones too)
    rng = np.random.default_rng(2000 + kind)
    for _ in range(30):
        x = edge_row(rng, kind)
        for params in UNMASKED:
            assert_same(x, params, rng)


def test_masked_and_greedy_params_take_the_reference_path():
    rng = np.random.default_rng(3)
    x = smollm2_like(rng)
    for params in SETTINGS:
        for v in (0, 123456789, WEIGHT_MAX):
            assert sample_position_compiled(x, params, 5, v) == sample_position(x, params, 5, v)


def test_ties_across_the_leading_boundary_go_to_the_lower_ids():
    # 600 tokens share the top probability: the leading 256 must be the 256 lowest of their ids
    x = np.full(49152, -20.0, dtype=np.float32)
    top = np.sort(np.random.default_rng(5).choice(49152, 600, replace=False))
    x[top] = 3.0
    for v in (0, 2**31, WEIGHT_MAX - 49153, WEIGHT_MAX):
        got = sample_position_compiled(x, SamplingParams(1.0), 64, v)
        assert got == sample_position(x, SamplingParams(1.0), 64, v)
        assert got.token_ids == tuple(int(t) for t in top[:64])


def test_takes_torch_rows_and_refuses_bad_input_like_the_reference():
    torch = pytest.importorskip("torch")
    x = smollm2_like(np.random.default_rng(9))
    assert sample_position_compiled(torch.from_numpy(x), SamplingParams(1.0), 5, 99) == \
        sample_position(x, SamplingParams(1.0), 5, 99)
    bad = x.copy()
    bad[7] = np.nan
    for args in ((bad, 5, 0), (x, 0, 0), (x, 65, 0), (x, 5, 2**32), (x, 5, -1)):
        with pytest.raises(InvalidParams) as got:
            sample_position_compiled(args[0], SamplingParams(1.0), args[1], args[2])
        with pytest.raises(InvalidParams) as want:
            sample_position(args[0], SamplingParams(1.0), args[1], args[2])
        assert got.value.reason == want.value.reason


@pytest.mark.parametrize("seed", range(3))
def test_a_batch_of_rows_equals_sample_position_row_by_row(seed):
    # 8 SmolLM2-shaped rows at T = 1 share the softmax's calls; v's inside and past the leading tokens
    rng = np.random.default_rng(4000 + seed)
    for _ in range(6):
        x = np.stack([smollm2_like(rng) for _ in range(8)])
        requests = [(SamplingParams(1.0), int(rng.choice([1, 5, 64])), int(rng.integers(0, 2**32)))
                    for _ in range(8)]
        requests[0] = (SamplingParams(1.0), 5, WEIGHT_MAX)  # the walk runs out: the reference's full order
        want = [sample_position(row, p, k, v) for row, (p, k, v) in zip(x, requests, strict=True)]
        assert sample_positions_compiled(x, requests) == want
        mixed = [requests[0], (SamplingParams(0.7, 0.9, 0), 5, 7), *requests[2:]]  # one masked row: row by row
        assert sample_positions_compiled(x, mixed) == [sample_position(row, p, k, v)
                                                       for row, (p, k, v) in zip(x, mixed, strict=True)]


def test_a_batch_with_a_bad_row_raises_the_references_error():
    rng = np.random.default_rng(8)
    x = np.stack([smollm2_like(rng) for _ in range(3)])
    x[1, 9] = np.inf
    with pytest.raises(InvalidParams) as got:
        sample_positions_compiled(x, [(SamplingParams(1.0), 5, 1)] * 3)
    with pytest.raises(InvalidParams) as want:
        sample_position(x[1], SamplingParams(1.0), 5, 1)
    assert got.value.reason == want.value.reason


def test_a_minus_infinity_logit_is_refused_like_the_reference():
    # -inf softmaxes to a zero probability without tripping the max: the kernels' zero count sends it back
    rng = np.random.default_rng(10)
    x = np.stack([smollm2_like(rng) for _ in range(3)])
    x[2, 40] = -np.inf
    for call in (lambda: sample_position_compiled(x[2], SamplingParams(1.0), 5, 1),
                 lambda: sample_positions_compiled(x, [(SamplingParams(1.0), 5, 1)] * 3)):
        with pytest.raises(InvalidParams) as got:
            call()
        with pytest.raises(InvalidParams) as want:
            sample_position(x[2], SamplingParams(1.0), 5, 1)
        assert got.value.reason == want.value.reason


def test_a_crowded_octave_selects_the_leading_tokens_before_sorting_them():
    # 20,000 probabilities within one octave of each other: the leading 256 (and 1,024, 8,192) are picked
    # out of far more candidates than they number, ties included
    rng = np.random.default_rng(12)
    x = rng.uniform(0.0, 0.6, 20_000).astype(np.float32)
    x[rng.choice(20_000, 3000, replace=False)] = np.float32(0.3)
    weights = compute_sampling_distribution(x, SamplingParams(1.0)).weights
    for v in v_values(rng, weights, x.size):
        for k in (1, 5, 64):
            want = sample_position(x, SamplingParams(1.0), k, v)
            assert sample_position_compiled(x, SamplingParams(1.0), k, v) == want

"""node.protocol.vllm_sampler: golden values, an independent scalar reimplementation, bad input."""

import math

import numpy as np
import pytest

from node.protocol.errors import InvalidParams, Reason
from node.protocol.sampler import SamplingParams
from node.protocol.seed import run_seed
from node.protocol.vllm_sampler import (
    choose_vllm_token,
    compute_gumbel_noise,
    compute_processed_logits,
    compute_step_seeds,
    sample_vllm_position,
    vllm_request_seed,
)

MASK64 = 2**64 - 1


def splitmix64(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def scalar_gumbel(step_seed: int, i: int) -> float:
    """The kernel's noise for one token, with Python integers and math.log (no numpy)."""
    key = splitmix64(step_seed & MASK64)
    bits = splitmix64((key + (i + 1) * 0x9E3779B97F4A7C15) & MASK64) >> 11
    return -math.log(-math.log((bits + 0.5) * 2.0**-53))


def test_golden_request_seed_and_step_seeds():
    # step seeds measured with torch 2.13: torch.Generator().manual_seed(42); torch.randint(0, 2**31, (1,), generator=g)
    assert compute_step_seeds(42, 4).tolist() == [1273642419, 787846414, 1201263687, 415968276]
    assert vllm_request_seed(run_seed(1, 2)) == 7614361072933207510
    assert 0 <= vllm_request_seed(bytes(32)) < 2**63  # a valid int64 for vLLM


def test_step_seeds_use_the_low_32_bits_like_torchs_cpu_generator():
    assert compute_step_seeds(5, 3).tolist() == compute_step_seeds(5 + 2**32, 3).tolist()
    assert compute_step_seeds(5, 3).tolist() != compute_step_seeds(6, 3).tolist()
    assert compute_step_seeds(9, 700).tolist()[:5] == compute_step_seeds(9, 5).tolist()  # a prefix, past a twist


def test_noise_matches_a_scalar_reimplementation():
    seeds = np.array([0, 7, 2**31 - 1, -(2**63), 123456789], dtype=np.int64)
    noise = compute_gumbel_noise(seeds, 300)
    for s, seed in enumerate(seeds.tolist()):
        for i in (0, 1, 150, 299):
            assert noise[s, i] == pytest.approx(scalar_gumbel(seed, i), rel=0, abs=1e-15)
    assert compute_gumbel_noise(np.array([7]), 4)[0].tolist() == pytest.approx(
        [0.4375695572536006, -0.17970813867067745, 2.7998999921969956, 2.086099934781561], abs=1e-15)


def test_noise_is_gumbel():
    noise = compute_gumbel_noise(np.arange(40), 5000).ravel()
    assert abs(noise.mean() - 0.5772156649) < 0.01 and abs(noise.var() - math.pi**2 / 6) < 0.03


def test_processing_temperature_top_k_top_p():
    logits = np.array([2.0, 1.0, 0.5, 0.0, -1.0, -3.0], dtype=np.float32)
    assert np.array_equal(compute_processed_logits(logits, SamplingParams(0.5, 1.0, 0, 4))[0], logits / np.float32(0.5))
    top2 = compute_processed_logits(logits, SamplingParams(1.0, 1.0, 2, 4))[0]
    assert np.isfinite(top2).sum() == 2 and np.isfinite(top2[:2]).all()
    # softmax(logits) = .53 .20 .12 .07 .03 .00: top_p 0.7 keeps the two whose mass reaches it
    nucleus = compute_processed_logits(logits, SamplingParams(1.0, 0.7, 0, 4))[0]
    assert np.isfinite(nucleus).tolist() == [True, True, False, False, False, False]
    assert np.isfinite(compute_processed_logits(logits, SamplingParams(1.0, 0.01, 0, 4))[0]).sum() == 1
    greedy = compute_processed_logits(logits, SamplingParams(0.0, 1.0, 0, 4))[0]
    assert np.array_equal(greedy, logits)


def test_choice_is_first_argmax_of_logit_plus_noise():
    processed = np.array([0.0, 1.0, -np.inf, 1.0], dtype=np.float32)
    assert choose_vllm_token(processed, None) == 1  # greedy: first maximum
    assert choose_vllm_token(processed, np.array([0.0, 0.0, 99.0, 0.5])) == 3
    assert choose_vllm_token(processed, np.array([2.0, 0.0, 99.0, 0.5])) == 0
    assert choose_vllm_token(np.full(3, -np.inf, dtype=np.float32), np.zeros(3)) == 0  # the kernel's answer


def test_sample_position_follows_the_noise():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=64).astype(np.float32)
    params = SamplingParams(1.0, 1.0, 0, 8)
    for step_seed in range(20):
        expected = int(np.argmax(logits.astype(np.float64) + [scalar_gumbel(step_seed, i) for i in range(64)]))
        assert sample_vllm_position(logits, params, step_seed) == expected


@pytest.mark.parametrize("bad", [np.array([1.0, np.nan], dtype=np.float32), np.array([1.0, np.inf]),
                                 np.zeros((2, 2, 2)), np.zeros(0)])
def test_bad_logits_are_typed_errors(bad):
    with pytest.raises(InvalidParams) as err:
        compute_processed_logits(bad, SamplingParams(1.0, 1.0, 0, 4))
    assert err.value.reason in (Reason.NON_FINITE_LOGITS, Reason.OUT_OF_RANGE, Reason.VOCAB_TOO_LARGE)


def test_bad_seeds_and_counts_are_typed_errors():
    for seed, steps in ((-1, 3), (2**64, 3), (True, 3), (1, -1), (1, 2**32)):
        with pytest.raises(InvalidParams) as err:
            compute_step_seeds(seed, steps)
        assert err.value.reason is Reason.OUT_OF_RANGE
    with pytest.raises(InvalidParams):
        vllm_request_seed(b"short")
    with pytest.raises(InvalidParams) as err:
        compute_gumbel_noise(np.array([1]), 0)
    assert err.value.reason is Reason.VOCAB_TOO_LARGE
    with pytest.raises(InvalidParams) as err:
        compute_processed_logits(np.array([3e38, 0.0], dtype=np.float32), SamplingParams(0.001, 1.0, 0, 4))
    assert err.value.reason is Reason.NON_FINITE_LOGITS

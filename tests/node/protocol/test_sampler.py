import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from node.errors import InvalidParams, Reason
from node.protocol.sampler import (
    WEIGHT_MAX,
    WEIGHT_ONE,
    SamplingParams,
    choose_token,
    compute_exact_sum,
    compute_integer_weights,
    compute_kept_count,
    compute_sampling_distribution,
    compute_tempered_probs,
    float32_bits,
    float32_from_bits,
    sample_position,
    tail_exhaustion_floor,
    to_float32_array,
)


def f32(values):
    return np.array(values, dtype=np.float32)


def test_integer_weights_by_hand():
    # Powers of two are exact: floor(p * 2^32).
    assert compute_integer_weights(f32([0.5, 0.25, 0.25])).tolist() == [2**31, 2**30, 2**30]
    # Renormalised over the kept mass 0.75: floor(2/3 * 2^32), floor(1/3 * 2^32).
    assert compute_integer_weights(f32([0.5, 0.25])).tolist() == [2863311530, 1431655765]
    # A single kept token would get 2^32: clipped to 2^32 - 1.
    assert compute_integer_weights(f32([0.3])).tolist() == [WEIGHT_MAX]


def test_kept_count_top_k_and_top_p_by_hand():
    sorted_p = f32([0.5, 0.25, 0.125, 0.125])
    assert compute_kept_count(sorted_p, 0, 1.0) == 4
    assert compute_kept_count(sorted_p, 2, 1.0) == 2
    assert compute_kept_count(sorted_p, 0, 0.5) == 1  # the first prefix already reaches 0.5
    assert compute_kept_count(sorted_p, 0, 0.6) == 2
    assert compute_kept_count(sorted_p, 0, 0.8) == 3
    assert compute_kept_count(sorted_p, 2, 0.8) == 2  # top-k cuts first
    # A cumulative sum that ends below top_p (float32 rounding) cuts nothing.
    assert compute_kept_count(f32([0.3, 0.3]), 0, 0.99) == 2


def test_choose_token_walks_candidates_then_tail_by_hand():
    ids, w = np.array([7, 3]), np.array([2**31, 2**30])
    tail_ids, tail_w = np.array([9, 1]), np.array([2**30, 0])
    assert choose_token(0, ids, w, tail_ids, tail_w) == 7
    assert choose_token(2**31 - 1, ids, w, tail_ids, tail_w) == 7
    assert choose_token(2**31, ids, w, tail_ids, tail_w) == 3
    assert choose_token(3 * 2**30, ids, w, tail_ids, tail_w) == 9  # first tail token
    assert choose_token(2**32 - 1, ids, w, tail_ids, tail_w) == 9
    # Tail runs out: the most probable token.
    assert choose_token(2**32 - 1, ids, w, np.array([9]), np.array([2**30 - 1])) == 7


def test_sorted_order_ties_by_lower_id_and_greedy_weight():
    logits = f32([1.0, 3.0, 3.0, 0.0, 3.0])
    dist = compute_sampling_distribution(logits, SamplingParams(0.0))
    assert dist.order[:4].tolist() == [1, 2, 4, 0]
    assert dist.weights[0] == WEIGHT_MAX and dist.weights[1:].sum() == 0
    sample = sample_position(logits, SamplingParams(0.0), 3, 2**32 - 2)
    assert sample.chosen == 1 and sample.token_ids == (1, 2, 4)
    dist = compute_sampling_distribution(logits, SamplingParams(1.0))
    assert dist.order[:3].tolist() == [1, 2, 4]
    assert dist.weights[0] == dist.weights[1] == dist.weights[2]


def test_candidates_are_the_most_probable_even_when_masked():
    logits = f32([0.0, 5.0, 4.0, 3.0, 2.0, 1.0])
    sample = sample_position(logits, SamplingParams(1.0, 1.0, 2), 5, 0)
    assert sample.token_ids == (1, 2, 3, 4, 5)
    assert sample.weights[2:] == (0, 0, 0)
    assert sum(sample.weights) <= WEIGHT_ONE


def test_raw_logprobs_are_temperature_one_before_masking():
    logits = f32([2.0, 1.0, 0.0, -1.0])
    expected = torch.log_softmax(torch.tensor(logits), dim=-1).numpy()
    sample = sample_position(logits, SamplingParams(0.3, 0.5, 1), 4, 5)
    assert np.allclose(sample.raw_logprobs, expected[list(sample.token_ids)], atol=1e-6)


def test_torch_and_numpy_inputs_agree():
    rng = np.random.default_rng(3)
    row = (rng.standard_normal(500) * 4).astype(np.float32)
    params = SamplingParams(0.8, 0.95, 50)
    for v in (0, 2**31, 2**32 - 1, 123456789):
        assert sample_position(row, params, 5, v) == sample_position(torch.from_numpy(row), params, 5, v)
    assert sample_position(torch.from_numpy(row).to(torch.bfloat16), params, 5, 7).chosen >= 0


@pytest.mark.parametrize("kwargs,reason", [
    ({"temperature": -1.0}, Reason.INVALID_TEMPERATURE),
    ({"temperature": -0.0}, Reason.INVALID_TEMPERATURE),
    ({"temperature": float("nan")}, Reason.INVALID_TEMPERATURE),
    ({"temperature": float("inf")}, Reason.INVALID_TEMPERATURE),
    ({"temperature": 1e-6}, Reason.INVALID_TEMPERATURE),
    ({"temperature": 1.0, "top_p": 0.0}, Reason.INVALID_TOP_P),
    ({"temperature": 1.0, "top_p": 1.5}, Reason.INVALID_TOP_P),
    ({"temperature": 1.0, "top_k": -1}, Reason.INVALID_TOP_K),
    ({"temperature": 1.0, "max_tokens": 2**32}, Reason.OUT_OF_RANGE),
])
def test_params_out_of_domain_raise_typed_errors(kwargs, reason):
    with pytest.raises(InvalidParams) as err:
        SamplingParams(**kwargs)
    assert err.value.reason is reason


def test_params_round_to_float32_and_round_trip_bits():
    p = SamplingParams(0.7, 0.9, 40, 128)
    assert p.temperature == float(np.float32(0.7))
    assert float32_from_bits(p.temperature_bits) == p.temperature
    assert p.top_p_bits == 0x3F666666
    assert SamplingParams.from_bits(p.temperature_bits, p.top_p_bits, 40, 128) == p
    assert float32_bits(1.0) == 0x3F800000


@pytest.mark.parametrize("logits,reason", [
    (f32([1.0, np.nan, 0.0]), Reason.NON_FINITE_LOGITS),
    (f32([1.0, np.inf, 0.0]), Reason.NON_FINITE_LOGITS),
    (np.zeros((2, 3), dtype=np.float32), Reason.OUT_OF_RANGE),
    (np.zeros(0, dtype=np.float32), Reason.VOCAB_TOO_LARGE),
])
def test_bad_logits_raise_typed_errors(logits, reason):
    with pytest.raises(InvalidParams) as err:
        sample_position(logits, SamplingParams(1.0), 1, 0)
    assert err.value.reason is reason


def test_bad_k_and_v_raise():
    with pytest.raises(InvalidParams):
        sample_position(f32([1.0, 2.0]), SamplingParams(1.0), 3, 0)
    with pytest.raises(InvalidParams):
        sample_position(f32([1.0, 2.0]), SamplingParams(1.0), 1, 2**32)


logit_rows = arrays(np.float32, st.integers(2, 300),
                    elements=st.floats(-30, 30, width=32, allow_nan=False, allow_infinity=False))
params_st = st.builds(SamplingParams, st.sampled_from([0.0, 0.3, 0.7, 1.0, 1.5]),
                      st.sampled_from([1.0, 0.95, 0.9, 0.5, 0.1]), st.sampled_from([0, 1, 5, 40]))


@given(logit_rows, params_st)
def test_weights_are_sorted_and_sum_within_the_proved_bounds(logits, params):
    dist = compute_sampling_distribution(logits, params)
    w = dist.weights.astype(np.int64)
    assert (w[1:] <= w[:-1]).all()
    total = int(w.sum())
    assert total <= WEIGHT_ONE
    if params.temperature > 0:
        # Tokens kept by the masks (some may still floor to weight 0): 2^32 - kept - 1 < total.
        probs = compute_tempered_probs(to_float32_array(logits), params.temperature)
        kept = compute_kept_count(probs[dist.order], params.top_k, params.top_p)
        assert total > WEIGHT_ONE - kept - 1
        # Hence the tail can only run out at or above tail_exhaustion_floor.
        assert total >= tail_exhaustion_floor(logits.size) + 1
    assert sorted(dist.order.tolist()) == list(range(logits.size))


@given(logit_rows, params_st, st.integers(0, WEIGHT_MAX))
def test_chosen_token_is_the_walk_over_the_full_sorted_order(logits, params, v):
    dist = compute_sampling_distribution(logits, params)
    cumulative = np.cumsum(dist.weights.astype(np.int64))
    hit = np.flatnonzero(v < cumulative)
    expected = int(dist.order[hit[0]]) if hit.size else int(dist.order[0])
    k = min(5, logits.size)
    assert sample_position(logits, params, k, v).chosen == expected


@given(arrays(np.float32, st.integers(1, 400), elements=st.floats(-2.0**100, 2.0**100, width=32)), st.randoms())
def test_exact_sum_is_the_correctly_rounded_sum_in_any_order(values, random):
    import math
    expected = math.fsum(values.astype(np.float64).tolist())
    assert compute_exact_sum(values) == expected
    shuffled = values.copy()
    random.shuffle(shuffled)
    assert compute_exact_sum(shuffled) == expected


def test_exact_sum_on_a_vocabulary_of_probabilities_with_subnormals():
    rng = np.random.default_rng(7)
    probs = compute_tempered_probs(rng.standard_normal(2**17).astype(np.float32) * 12, 1.0)
    probs[:1000] = np.float32(1e-44)  # subnormal float32
    import math
    exact = math.fsum(probs.astype(np.float64).tolist())
    assert compute_exact_sum(probs) == exact
    assert compute_exact_sum(probs[::-1].copy()) == exact
    with pytest.raises(InvalidParams):
        compute_exact_sum(np.zeros(2**20 + 1, dtype=np.float32))


@given(arrays(np.float32, st.integers(1, 400), elements=st.floats(-2.0**100, 2.0**100, width=32)))
def test_descending_order_is_a_stable_sort_of_the_negated_values(values):
    from node.protocol.sampler import compute_descending_order

    assert compute_descending_order(values).tolist() == np.argsort(-values, kind="stable").tolist()


def test_descending_order_treats_signed_zeros_as_equal():
    from node.protocol.sampler import compute_descending_order

    assert compute_descending_order(f32([-0.0, 0.0, -1.0, 2.0])).tolist() == [3, 0, 1, 2]


@pytest.mark.parametrize("size", [49_152, 262_144])
def test_descending_order_of_a_vocabulary_sized_row_with_ties(size):
    from node.protocol.sampler import compute_descending_order, compute_tempered_probs

    rng = np.random.default_rng(size)
    logits = np.round(rng.standard_normal(size) * 4, 1).astype(np.float32)  # many exact ties
    for values in (logits, compute_tempered_probs(logits, 0.7)):
        assert np.array_equal(compute_descending_order(values), np.lexsort((np.arange(size), -values)))

"""node.checks.stock: Token-DiFR and the surprisal statistic, by hand, on the tiny model, and on bad input."""

import math

import numpy as np
import pytest

from node.calibrate.stock import generate_with_vllm_rule
from node.checks.stock import measure_stock_positions, measure_stock_sampler, summarise_stock
from node.protocol.errors import InvalidParams, Reason
from node.protocol.sampler import SamplingParams
from node.protocol.vllm_sampler import compute_gumbel_noise, compute_step_seeds, sample_vllm_position

PROMPT = (1, 9690, 198, 2683, 359, 253, 5356, 28, 1780, 314)


def test_difr_by_hand():
    logits = np.array([[2.0, 1.0, 0.0, -1.0]] * 3, dtype=np.float32)
    params = SamplingParams(0.5, 1.0, 0, 3)
    seed = 77
    noise = compute_gumbel_noise(compute_step_seeds(seed, 3), 4)
    noisy = logits.astype(np.float64) / 0.5 + noise
    chosen = [int(np.argmax(noisy[0])), 3, 2]
    pos = measure_stock_positions(logits, chosen, params, seed)
    assert pos.difr[0] == 0.0 and not pos.mismatch[0]
    for i in (1, 2):
        assert pos.difr[i] == pytest.approx(noisy[i].max() - noisy[i, chosen[i]], abs=1e-12)
        assert pos.mismatch[i] == (int(np.argmax(noisy[i])) != chosen[i])
    m = summarise_stock(pos)
    assert m.difr_mean == pytest.approx(pos.difr.mean()) and m.difr_max == pytest.approx(pos.difr.max())


def test_greedy_margin_is_the_raw_logit_gap_and_surprisal_is_left_out():
    logits = np.array([[3.0, 1.0, 0.5], [0.0, 2.5, 1.0]], dtype=np.float32)
    m = measure_stock_sampler(logits, [0, 2], SamplingParams(0.0, 1.0, 0, 2), 5)
    assert m.difr_max == pytest.approx(1.5) and m.difr_mean == pytest.approx(0.75)
    assert m.difr_mismatch_rate == 0.5 and m.surprisal_z == 0.0


def test_a_masked_choice_is_scored_with_its_unmasked_logit_and_counted():
    logits = np.array([[5.0, 4.0, -3.0, -4.0]], dtype=np.float32)
    params = SamplingParams(1.0, 1.0, 2, 1)  # top-k 2 masks tokens 2 and 3
    pos = measure_stock_positions(logits, [3], params, 9)
    noise = compute_gumbel_noise(compute_step_seeds(9, 1), 4)[0]
    best = max(5.0 + noise[0], 4.0 + noise[1])
    assert pos.masked.tolist() == [True]
    assert pos.difr[0] == pytest.approx(max(best - (-4.0 + noise[3]), 0.0), abs=1e-12)
    assert math.isfinite(pos.surprisal[0]) and pos.surprisal[0] > 60  # p = 0: the floor, not inf


def test_surprisal_z_is_near_zero_for_true_samples_and_high_for_hotter_ones():
    rng = np.random.default_rng(1)
    logits = (rng.normal(size=(400, 50)) * 2).astype(np.float32)
    params = SamplingParams(1.0, 1.0, 0, 400)
    seeds = compute_step_seeds(3, 400)
    honest = [sample_vllm_position(logits[i], params, int(seeds[i])) for i in range(400)]
    hot = [sample_vllm_position(logits[i], SamplingParams(1.6, 1.0, 0, 400), int(seeds[i])) for i in range(400)]
    assert abs(measure_stock_sampler(logits, honest, params, None).surprisal_z) < 4
    assert measure_stock_sampler(logits, hot, params, None).surprisal_z > 6


def test_unknown_noise_leaves_difr_unmeasured():
    logits = np.zeros((4, 8), dtype=np.float32)
    m = measure_stock_sampler(logits, [1, 2, 3, 4], SamplingParams(1.0, 1.0, 0, 4), None)
    assert math.isnan(m.difr_mean) and math.isnan(m.difr_mismatch_rate) and math.isfinite(m.surprisal_z)


@pytest.fixture(scope="module")
def tiny_generations(tiny):
    params = SamplingParams(0.8, 0.95, 0, 32)
    honest = generate_with_vllm_rule(tiny.engine, PROMPT, params, 1234)
    logits = tiny.engine.prefill(PROMPT, honest).logits
    return tiny, params, honest, logits


def test_honest_tokens_measure_zero_on_the_tiny_model(tiny_generations):
    _, params, honest, logits = tiny_generations
    m = measure_stock_sampler(logits, honest, params, 1234)
    assert m.positions == 32 and m.difr_max < 1e-4 and m.difr_mismatch_rate == 0 and m.masked_choices == 0


def test_wrong_seed_and_temperature_lie_leave_margins(tiny_generations):
    tiny, params, _, _ = tiny_generations
    wrong = generate_with_vllm_rule(tiny.engine, PROMPT, params, 1235)
    m = measure_stock_sampler(tiny.engine.prefill(PROMPT, wrong).logits, wrong, params, 1234)
    assert m.difr_mismatch_rate > 0.3 and m.difr_mean > 0.1
    hot = generate_with_vllm_rule(tiny.engine, PROMPT, SamplingParams(1.3, 0.95, 0, 32), 1234)
    assert measure_stock_sampler(tiny.engine.prefill(PROMPT, hot).logits, hot, params, 1234).difr_mean > 0


def test_prefixes_summarise_the_first_positions(tiny_generations):
    _, params, honest, logits = tiny_generations
    pos = measure_stock_positions(logits, honest, params, 1234)
    assert summarise_stock(pos, 16).positions == 16
    assert summarise_stock(pos, 0).difr_mean == 0.0
    with pytest.raises(InvalidParams):
        summarise_stock(pos, 33)


@pytest.mark.parametrize(("logits", "ids", "reason"), [
    (np.zeros((3, 8), dtype=np.float32), [1, 2], Reason.OUT_OF_RANGE),  # rows ≠ tokens
    (np.zeros(8, dtype=np.float32), [1], Reason.OUT_OF_RANGE),  # not rows
    (np.zeros((2, 8), dtype=np.float32), [1, 8], Reason.OUT_OF_RANGE),  # token outside the vocabulary
    (np.zeros((2, 8), dtype=np.float32), [1, -1], Reason.OUT_OF_RANGE),
    (np.array([[0.0, np.nan], [0.0, 1.0]], dtype=np.float32), [0, 1], Reason.NON_FINITE_LOGITS),
])
def test_bad_input_is_a_typed_error(logits, ids, reason):
    with pytest.raises(InvalidParams) as err:
        measure_stock_sampler(logits, ids, SamplingParams(1.0, 1.0, 0, 2), 3)
    assert err.value.reason is reason

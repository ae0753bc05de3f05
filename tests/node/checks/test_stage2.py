import math

import numpy as np
import pytest

from node.checks.stage2 import compute_sampler_margin, measure_stage2
from node.engines.base import GenerationRequest
from node.protocol.artifact import ArtifactHeader, make_positions
from node.protocol.sampler import WEIGHT_ONE, SamplingParams
from node.protocol.seed import compute_sampler_uniforms, run_seed

PROMPT = (1, 9690, 198, 2683, 359, 253, 5356, 28, 1780, 314)


def generated(model, actual, declared=None, seed=(3, 4), n=24):
    declared = declared or actual
    req = GenerationRequest(PROMPT, SamplingParams(actual.temperature, actual.top_p, actual.top_k, n),
                            run_seed(*seed), 5)
    gen = model.engine.generate([req])[0]
    header = ArtifactHeader(model.files.model_id, declared.temperature_bits, declared.top_p_bits, declared.top_k, n,
                            5, req.run_seed, PROMPT, len(gen.output_ids))
    return header, gen


def test_sampler_margin_by_hand():
    cumulative = np.array([100, 300, 300, 1000])
    assert compute_sampler_margin(150, cumulative, 1) == 0.0
    assert compute_sampler_margin(50, cumulative, 1) == 50 / WEIGHT_ONE
    assert compute_sampler_margin(300, cumulative, 1) == 1 / WEIGHT_ONE
    assert compute_sampler_margin(0, cumulative, 0) == 0.0
    assert compute_sampler_margin(5, cumulative, 2) == 295 / WEIGHT_ONE  # zero-width interval


@pytest.mark.parametrize("params", [SamplingParams(1.0), SamplingParams(0.7, 0.9), SamplingParams(0.0)])
def test_honest_generation_measures_near_zero(tiny, params):
    header, gen = generated(tiny, params)
    pre = tiny.engine.prefill(PROMPT, gen.output_ids)
    m = measure_stage2(header, gen.positions(5), pre.logits)
    assert m.positions == 24
    assert m.weight_error_max < 1e-5 and m.sampler_margin_max == 0 and m.sampler_mismatches == 0
    assert m.logprob_distance_max < 1e-3 and m.candidate_mismatch_rate == 0
    assert m.distance2 < 1e-3 and math.isfinite(m.surprisal_z) and m.perplexity > 1


def test_temperature_lie_shows_in_the_weights(tiny):
    # The tiny random model is nearly uniform over 49,152 tokens (candidate weights ~2e-5), so the
    # lie is compared with the same run measured honestly rather than with an absolute number.
    honest_header, gen = generated(tiny, SamplingParams(1.0))
    lie_header, _ = generated(tiny, SamplingParams(1.0), declared=SamplingParams(0.7))
    logits = tiny.engine.prefill(PROMPT, gen.output_ids).logits
    honest = measure_stage2(honest_header, gen.positions(5), logits)
    lie = measure_stage2(lie_header, gen.positions(5), logits)
    assert lie.weight_error_max > 100 * max(honest.weight_error_max, 1e-9)


def test_a_swapped_tail_token_shows_as_a_sampler_margin(tiny):
    header, gen = generated(tiny, SamplingParams(1.0))
    p = gen.positions(5)
    v = compute_sampler_uniforms(header.run_seed, len(p)).astype(np.int64)
    i = int(np.flatnonzero(v >= p.weights.sum(axis=1))[0])  # tiny's flat distributions: most positions
    chosen = np.array(p.chosen)
    chosen[i] = next(t for t in range(1000, 2000) if t not in p.token_ids[i] and t != chosen[i])
    forged = make_positions(chosen, p.token_ids, p.weights, p.raw_logprobs)
    m = measure_stage2(header, forged, tiny.engine.prefill(PROMPT, [int(t) for t in chosen]).logits)
    assert m.sampler_margin_max > 0 and m.sampler_mismatches >= 1


def test_greedy_picking_a_non_argmax_token_is_infinitely_surprising(tiny):
    header, gen = generated(tiny, SamplingParams(0.0))
    p = gen.positions(5)
    chosen = np.array(p.chosen)
    chosen[3] = p.token_ids[3][1]
    forged = make_positions(chosen, p.token_ids, p.weights, p.raw_logprobs)
    m = measure_stage2(header, forged, tiny.engine.prefill(PROMPT, [int(t) for t in chosen]).logits)
    assert m.surprisal_z == math.inf


def test_rows_must_match_positions(tiny):
    header, gen = generated(tiny, SamplingParams(1.0))
    with pytest.raises(ValueError):
        measure_stage2(header, gen.positions(5), np.zeros((3, 10), dtype=np.float32))


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from node.checks.stage2 import measure_position, measure_position_fast  # noqa: E402
from node.protocol.sampler import sample_position  # noqa: E402


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), vocab=st.sampled_from([7, 300, 5000]),
       scale=st.sampled_from([0.3, 3.0, 12.0]), ties=st.booleans(),
       temperature=st.sampled_from([0.0, 0.5, 1.0, 1.7]), top_p=st.sampled_from([1.0, 0.95, 0.5, 0.05]),
       top_k=st.sampled_from([0, 1, 3, 40, 400]), v=st.integers(0, 2**32 - 1), lie=st.booleans())
def test_fast_position_measurement_equals_the_reference(seed, vocab, scale, ties, temperature, top_p, top_k, v, lie):
    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal(vocab) * scale).astype(np.float32)
    if ties:  # coarse logits: many exact ties, the order's tie rule matters
        logits = np.round(logits).astype(np.float32)
    params = SamplingParams(temperature, top_p, top_k, 64)
    k = min(5, vocab)
    s = sample_position(logits, params, k, v)
    chosen = s.chosen if not lie else int(rng.integers(0, vocab))  # also positions the sampler did not choose
    args = (logits, params, v, chosen, np.array(s.token_ids), np.array(s.weights, dtype=np.int64),
            np.array(s.raw_logprobs, dtype=np.float32))
    ref, fast = measure_position(*args), measure_position_fast(*args)
    assert fast.candidates_differ == ref.candidates_differ
    assert fast.logprob_distance == ref.logprob_distance and fast.raw_nll == ref.raw_nll
    one = 1 / WEIGHT_ONE  # the normaliser's summation order may move a weight by one unit
    assert abs(fast.weight_error - ref.weight_error) <= one
    assert abs(fast.sampler_margin - ref.sampler_margin) <= vocab * one
    assert math.isclose(fast.entropy, ref.entropy, rel_tol=1e-9, abs_tol=1e-9)
    assert math.isclose(fast.surprisal, ref.surprisal, rel_tol=1e-9, abs_tol=1e-6)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), vocab=st.sampled_from([7, 300, 5000]), scale=st.sampled_from([0.3, 3.0, 12.0]),
       ties=st.booleans(), temperature=st.sampled_from([0.0, 0.5, 1.0, 1.7]), top_p=st.sampled_from([1.0, 0.9]),
       top_k=st.sampled_from([0, 3, 40]), n=st.integers(1, 6), noise=st.sampled_from([0.0, 0.05]))
def test_the_decision_path_measures_the_same_weight_error(seed, vocab, scale, ties, temperature, top_p, top_k, n,
                                                           noise):
    from node.checks.stage2 import measure_stage2_decision
    from node.protocol.artifact import positions_from_samples

    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal((n, vocab)) * scale).astype(np.float32)
    if ties:
        logits = np.round(logits).astype(np.float32)
    params = SamplingParams(temperature, top_p, top_k, 64)
    k = min(5, vocab)
    v = compute_sampler_uniforms(b"\x07" * 32, n)
    claimed = logits + (rng.standard_normal(logits.shape) * noise).astype(np.float32)  # an executer's other numbers
    samples = [sample_position(claimed[i], params, k, int(v[i])) for i in range(n)]
    header = ArtifactHeader(b"\x11" * 32, params.temperature_bits, params.top_p_bits, top_k, 64, k, b"\x07" * 32,
                            (1, 2), n)
    positions = positions_from_samples(samples, k)
    full = measure_stage2(header, positions, logits)
    fast = measure_stage2_decision(header, positions, logits)
    assert abs(fast.weight_error_max - full.weight_error_max) <= 1 / WEIGHT_ONE
    assert abs(fast.weight_error_mean - full.weight_error_mean) <= 1 / WEIGHT_ONE
    assert math.isnan(fast.surprisal_z) and math.isnan(fast.distance2)


def test_a_profile_deciding_on_an_unmeasured_signal_is_an_error_not_a_pass():
    from node.checks.decision import Stage2Thresholds, decide_stage2, is_weight_error_only
    from node.checks.fingerprint import FingerprintThresholds
    from node.checks.stage2 import measure_stage2_decision
    from node.protocol.artifact import positions_from_samples

    logits = np.zeros((1, 8), dtype=np.float32)
    params = SamplingParams(1.0)
    samples = [sample_position(logits[0], params, 5, 0)]
    header = ArtifactHeader(b"\x11" * 32, params.temperature_bits, params.top_p_bits, 0, 64, 5, b"\x07" * 32, (1,), 1)
    m = measure_stage2_decision(header, positions_from_samples(samples, 5), logits)
    fp = FingerprintThresholds(1, 1.0, 1.0, 1)
    only_weight = Stage2Thresholds(1e-3, math.inf, math.inf, math.inf, math.inf, math.inf, fp)
    assert is_weight_error_only(only_weight) and decide_stage2(m, only_weight).valid
    with_surprisal = Stage2Thresholds(1e-3, math.inf, math.inf, math.inf, 5.0, math.inf, fp)
    assert not is_weight_error_only(with_surprisal)
    with pytest.raises(ValueError, match="not measured"):
        decide_stage2(m, with_surprisal)


@pytest.mark.parametrize("declared, actual", [(0.7, 1.0), (1.0, 0.7), (0.7, 0.8)])
def test_a_temperature_lie_shows_in_the_pooled_temperature_fit(tiny, declared, actual):
    honest_header, honest_gen = generated(tiny, SamplingParams(declared))
    lie_header, lie_gen = generated(tiny, SamplingParams(actual), declared=SamplingParams(declared))
    honest = measure_stage2(honest_header, honest_gen.positions(5),
                            tiny.engine.prefill(PROMPT, honest_gen.output_ids).logits)
    lie = measure_stage2(lie_header, lie_gen.positions(5), tiny.engine.prefill(PROMPT, lie_gen.output_ids).logits)
    assert honest.temperature_deviation < 1e-3  # the same engine: only the weights' integer floor
    assert lie.temperature_deviation == pytest.approx(abs(actual / declared - 1), rel=0.05)


def test_greedy_claims_must_commit_one_hot_weights(tiny):
    header, gen = generated(tiny, SamplingParams(0.0))
    logits = tiny.engine.prefill(PROMPT, gen.output_ids).logits
    assert measure_stage2(header, gen.positions(5), logits).temperature_deviation == 0.0
    lie_header, lie = generated(tiny, SamplingParams(0.8), declared=SamplingParams(0.0))  # sampled, claimed greedy
    lie_logits = tiny.engine.prefill(PROMPT, lie.output_ids).logits
    assert measure_stage2(lie_header, lie.positions(5), lie_logits).temperature_deviation == math.inf


def synthetic_leaves(seed: int, declared: SamplingParams, actual: SamplingParams, n: int = 48, vocab: int = 400,
                     noise: float = 0.05, scale: float = 2.5):
    """Leaves an executer sampled at `actual` from noisy logits (bf16-like), declared as `declared`."""
    from node.protocol.artifact import positions_from_samples

    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal((n, vocab)) * scale).astype(np.float32)
    claimed = logits + (rng.standard_normal(logits.shape) * noise).astype(np.float32)
    v = compute_sampler_uniforms(seed.to_bytes(32, "big"), n)
    samples = [sample_position(claimed[i], actual, 8, int(v[i])) for i in range(n)]
    header = ArtifactHeader(b"\x11" * 32, declared.temperature_bits, declared.top_p_bits, declared.top_k, n, 8,
                            seed.to_bytes(32, "big"), (1, 2), n)
    return header, positions_from_samples(samples, 8), logits


def test_the_temperature_t_value_is_standard_under_honest_noise_and_large_under_a_lie():
    from node.checks.stage2 import compute_temperature_t

    declared = SamplingParams(0.8, 1.0, 0, 48)
    honest = [compute_temperature_t(0.8, *synthetic_leaves(s, declared, declared)[1:]) for s in range(200)]
    # |t| of an unbiased slope with a correct standard error: ~5 % beyond 1.96, ~0 beyond 4.
    assert 0.01 <= np.mean(np.array(honest) > 1.96) <= 0.12
    assert max(honest) < 5.0
    lie = SamplingParams(0.88, 1.0, 0, 48)  # 10 % hotter than declared
    lies = [compute_temperature_t(0.8, *synthetic_leaves(s, declared, lie)[1:]) for s in range(20)]
    assert min(lies) > 8.0


def test_the_t_value_grows_with_length_under_a_lie_and_not_when_honest():
    from node.checks.stage2 import compute_temperature_t

    declared, lie = SamplingParams(0.8, 1.0, 0, 64), SamplingParams(0.85, 1.0, 0, 64)
    short = np.median([compute_temperature_t(0.8, *synthetic_leaves(s, declared, lie, n=16)[1:]) for s in range(20)])
    long = np.median([compute_temperature_t(0.8, *synthetic_leaves(s, declared, lie, n=64)[1:]) for s in range(20)])
    assert long > 1.6 * short  # ~√4 = 2 for a real shift
    honest_long = [compute_temperature_t(0.8, *synthetic_leaves(s, declared, declared, n=64)[1:]) for s in range(20)]
    assert np.median(honest_long) < 1.5


@pytest.mark.parametrize("declared_p, actual_p", [(1.0, 0.9), (0.9, 0.95), (0.95, 0.9)])
def test_a_top_p_lie_shows_in_the_kept_mass_and_honest_noise_does_not(declared_p, actual_p):
    from node.checks.stage2 import compute_kept_mass_shift, compute_kept_mass_shifts, compute_own_candidate_weights

    declared, actual = SamplingParams(1.0, declared_p, 0, 48), SamplingParams(1.0, actual_p, 0, 48)

    def shift(params: SamplingParams, seed: int) -> float:
        _, positions, logits = synthetic_leaves(seed, declared, params, scale=5.0)  # peaked: top_p truncates
        own = compute_own_candidate_weights(declared, positions, logits)
        return compute_kept_mass_shift(compute_kept_mass_shifts(declared, positions, logits, own))

    honest = [shift(declared, s) for s in range(40)]
    lies = [shift(actual, s) for s in range(40)]
    assert max(honest) < 0.001  # flips at the cut move C by the noise only
    assert min(lies) > 10 * max(honest) and np.median(lies) > 0.01


def test_the_sampler_fits_are_the_same_on_the_hot_path_and_in_the_full_measurement():
    from node.checks.stage2 import measure_stage2_decision

    declared = SamplingParams(0.7, 0.9, 0, 48)
    header, positions, logits = synthetic_leaves(5, declared, SamplingParams(0.75, 0.95, 0, 48))
    fast, full = measure_stage2_decision(header, positions, logits), measure_stage2(header, positions, logits)
    assert (fast.temperature_t, fast.kept_mass_shift, fast.kept_mass_score) == \
        (full.temperature_t, full.kept_mass_shift, full.kept_mass_score)
    assert fast.kept_mass_score == pytest.approx(fast.kept_mass_shift * math.sqrt(len(positions)))
    assert fast.kept_mass_shift > 0 and fast.temperature_t > 0


def test_the_kept_mass_t_value_ignores_one_spike_and_sees_a_one_sided_lie():
    from node.checks.stage2 import compute_kept_mass_shifts, compute_kept_mass_t, compute_own_candidate_weights

    assert compute_kept_mass_t(np.array([0.0, 0.0, 0.105, 0.0, 0.0, 0.0])) == pytest.approx(1.0)  # any single spike
    assert compute_kept_mass_t(np.zeros(16)) == 0.0 and compute_kept_mass_t(np.full(8, 0.02)) == math.inf
    declared, lie = SamplingParams(1.0, 0.9, 0, 48), SamplingParams(1.0, 0.95, 0, 48)

    def t(params: SamplingParams, seed: int) -> float:
        _, positions, logits = synthetic_leaves(seed, declared, params, scale=5.0, noise=0.1)
        return compute_kept_mass_t(compute_kept_mass_shifts(declared, positions, logits,
                                                            compute_own_candidate_weights(declared, positions, logits)))

    honest, lies = [t(declared, s) for s in range(30)], [t(lie, s) for s in range(30)]
    assert max(honest) < 3.0 < min(lies)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_own_candidate_weights_match_the_reference_in_every_block_of_rows(temperature):
    # 37 rows: two full blocks of 16 and a partial one; each weight within one unit of the reference's
    # (the hot path normalises by numpy's float64 sum, the protocol by the exact sum)
    from node.checks.stage2 import compute_own_candidate_weights
    from node.protocol.sampler import compute_sampling_distribution

    params = SamplingParams(temperature)
    _, positions, logits = synthetic_leaves(21, params, params, n=37, vocab=3000)
    own = compute_own_candidate_weights(params, positions, logits)
    for i in range(37):
        dist = compute_sampling_distribution(logits[i], params)
        by_id = np.zeros(logits.shape[1], dtype=np.int64)
        by_id[dist.order] = dist.weights.astype(np.int64)
        assert np.abs(own[i] - by_id[positions.token_ids[i]]).max() <= 1


@pytest.mark.parametrize("row", [0, 20, 36])
def test_own_candidate_weights_refuse_non_finite_logits_in_any_block(row):
    from node.checks.stage2 import compute_own_candidate_weights
    from node.errors import InvalidParams, Reason

    params = SamplingParams(1.0)
    _, positions, logits = synthetic_leaves(22, params, params, n=37)
    for bad in (np.nan, np.inf, -np.inf):
        broken = logits.copy()
        broken[row, 5] = bad
        with pytest.raises(InvalidParams) as got:
            compute_own_candidate_weights(params, positions, broken)
        assert got.value.reason == Reason.NON_FINITE_LOGITS and "NaN or inf" in str(got.value)
    huge = logits.copy()
    huge[row, 5] = 3e38  # finite, but divided by T = 0.5 it overflows
    with pytest.raises(InvalidParams, match="overflow") as got:
        compute_own_candidate_weights(SamplingParams(0.5), positions, huge)
    assert got.value.reason == Reason.NON_FINITE_LOGITS

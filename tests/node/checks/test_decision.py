import dataclasses
import math

from node.checks.decision import Stage2Thresholds, compute_scores_digest, decide_stage2, is_weight_error_only
from node.checks.fingerprint import FingerprintThresholds
from node.checks.stage2 import Stage2Measurements, measure_stage2, measure_stage2_decision
from node.errors import Reason
from node.protocol.fingerprint import ChunkMeasurement
from node.protocol.sampler import SamplingParams
from tests.node.checks.test_stage2 import PROMPT, generated

CLEAN = Stage2Measurements(positions=16, distance2=0.0, logprob_distance_sum=0.0, logprob_distance_max=0.0,
                           candidate_mismatch_rate=0.0, weight_error_max=1e-6, weight_error_mean=1e-7,
                           sampler_margin_max=0.0, sampler_mismatches=0, surprisal_z=0.3, surprisal_mean=1.0,
                           entropy_mean=1.1, perplexity=3.0,
                           fingerprint=(ChunkMeasurement(0, 0, 0.0, 0.0, 128), ChunkMeasurement(1, 0, 0.5, 0.0, 127)))
T = Stage2Thresholds(max_weight_error=1e-4, max_sampler_margin=1e-4, max_logprob_distance=0.01,
                     max_candidate_mismatch_rate=0.1, max_surprisal_z=5.0, max_distance2=0.05,
                     fingerprint=FingerprintThresholds(3, 2.0, 2.0, 0), max_temperature_deviation=0.2,
                     max_temperature_t=6.0, max_kept_mass_shift=0.01, max_kept_mass_score=0.04)


def test_clean_measurements_pass():
    assert decide_stage2(CLEAN, T).valid


def test_each_signal_names_its_reason_and_order_is_fixed():
    cases = [("weight_error_max", 0.2, Reason.WEIGHT_ERROR), ("sampler_margin_max", 0.1, Reason.SAMPLER_MARGIN),
             ("logprob_distance_max", 1.0, Reason.LOGPROB_DISTANCE),
             ("candidate_mismatch_rate", 0.5, Reason.CANDIDATE_MISMATCH), ("distance2", 0.5, Reason.DISTANCE2),
             ("surprisal_z", math.inf, Reason.SURPRISAL), ("temperature_deviation", 0.3, Reason.TEMPERATURE_FIT),
             ("temperature_t", 7.0, Reason.TEMPERATURE_FIT), ("kept_mass_shift", 0.02, Reason.TOP_P_FIT),
             ("kept_mass_score", 0.05, Reason.TOP_P_FIT)]
    for field, value, reason in cases:
        assert decide_stage2(dataclasses.replace(CLEAN, **{field: value}), T).reason is reason
    both = dataclasses.replace(CLEAN, weight_error_max=0.2, surprisal_z=9.0)
    assert decide_stage2(both, T).reason is Reason.WEIGHT_ERROR


def test_fingerprint_is_decided_after_the_token_signals():
    bad = dataclasses.replace(CLEAN, fingerprint=(ChunkMeasurement(40, 0, 0.0, 0.0, 88),))
    assert decide_stage2(bad, T).reason is Reason.FINGERPRINT_EXPONENT_MISMATCH
    signs = dataclasses.replace(CLEAN, fingerprint=(ChunkMeasurement(0, 2, 0.0, 0.0, 128),))
    assert decide_stage2(signs, T).reason is Reason.FINGERPRINT_SIGN_MISMATCH


def test_scores_digest_binds_the_numbers():
    assert compute_scores_digest(CLEAN) == compute_scores_digest(dataclasses.replace(CLEAN))
    assert compute_scores_digest(CLEAN) != compute_scores_digest(dataclasses.replace(CLEAN, weight_error_max=2e-6))
    assert len(compute_scores_digest(dataclasses.replace(CLEAN, surprisal_z=math.inf))) == 32


def test_a_profile_deciding_on_the_temperature_fit_rejects_a_temperature_lie_on_the_hot_path(tiny):
    header, gen = generated(tiny, SamplingParams(1.0), declared=SamplingParams(0.7))
    logits = tiny.engine.prefill(PROMPT, gen.output_ids).logits
    fast = measure_stage2_decision(header, gen.positions(5), logits)
    assert fast.temperature_deviation == measure_stage2(header, gen.positions(5), logits).temperature_deviation
    inf = math.inf
    off = Stage2Thresholds(max_weight_error=inf, max_sampler_margin=inf, max_logprob_distance=inf,
                           max_candidate_mismatch_rate=inf, max_surprisal_z=inf, max_distance2=inf,
                           fingerprint=FingerprintThresholds(10**6, 1e6, 1e6, 10**6))
    strict = dataclasses.replace(off, max_temperature_deviation=0.1)
    assert is_weight_error_only(strict)  # the hot path measures it: no full measurement needed
    assert decide_stage2(fast, off).reason is Reason.OK
    assert decide_stage2(fast, strict).reason is Reason.TEMPERATURE_FIT


def test_a_long_response_is_decided_by_its_length_bucket():
    from node.checks.decision import select_thresholds_for_length

    t = dataclasses.replace(T, max_kept_mass_score=math.inf,
                            by_length=((16, (("max_distance2", 0.05),)), (64, (("max_distance2", 0.02),
                                                                              ("max_kept_mass_score", 0.001)))))
    assert select_thresholds_for_length(t, 10).max_distance2 == 0.05  # below every bucket: the flat one
    assert select_thresholds_for_length(t, 63).max_distance2 == 0.05
    assert select_thresholds_for_length(t, 64).max_distance2 == 0.02
    assert select_thresholds_for_length(t, 64).max_kept_mass_score == math.inf  # not decided on: stays off
    long = dataclasses.replace(CLEAN, positions=64, distance2=0.03)
    assert decide_stage2(long, t).reason is Reason.DISTANCE2
    assert decide_stage2(dataclasses.replace(long, positions=32), t).valid


def test_beyond_the_longest_calibrated_length_t_values_scale_with_the_square_root():
    from node.checks.decision import compute_beyond_calibration_scale, select_thresholds_for_length

    t = dataclasses.replace(T, max_kept_mass_t=4.0,
                            by_length=((16, (("max_kept_mass_t", 2.5), ("max_distance2", 0.05))),
                                       (64, (("max_kept_mass_t", 3.0), ("max_distance2", 0.02),
                                             ("max_temperature_t", 5.0)))))
    assert compute_beyond_calibration_scale(64, 64) == 1.0 and compute_beyond_calibration_scale(40, 64) == 1.0
    assert compute_beyond_calibration_scale(256, 64) == 2.0
    at_256 = select_thresholds_for_length(t, 256)
    assert (at_256.max_kept_mass_t, at_256.max_temperature_t) == (6.0, 10.0)  # t-values: × √(256/64)
    assert at_256.max_distance2 == 0.02  # an average's threshold is not widened
    assert select_thresholds_for_length(t, 32).max_kept_mass_t == 2.5  # inside the calibrated range: as fitted
    biased = dataclasses.replace(CLEAN, positions=256, kept_mass_t=5.0)  # an honest bias's t grows with √n
    assert decide_stage2(biased, t).valid
    assert decide_stage2(dataclasses.replace(biased, kept_mass_t=6.5), t).reason is Reason.TOP_P_FIT


def test_the_calibration_fit_applies_the_same_length_rule_as_the_decision():
    from node.calibrate.fit import thresholds_at
    from node.checks.decision import select_thresholds_for_length

    flat = {"kept_mass_t": 4.0, "kept_mass_t@16": 2.5, "kept_mass_t@64": 3.0, "distance2": 0.05,
            "distance2@16": 0.05, "distance2@64": 0.02}
    t = dataclasses.replace(T, max_kept_mass_t=4.0,
                            by_length=((16, (("max_kept_mass_t", 2.5), ("max_distance2", 0.05))),
                                       (64, (("max_kept_mass_t", 3.0), ("max_distance2", 0.02)))))
    for positions in (8, 16, 40, 64, 100, 1000):
        fit_side, decision_side = thresholds_at(flat, positions), select_thresholds_for_length(t, positions)
        assert fit_side["kept_mass_t"] == decision_side.max_kept_mass_t
        assert fit_side["distance2"] == decision_side.max_distance2

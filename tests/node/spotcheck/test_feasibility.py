import math

import numpy as np
import pytest

from node.spotcheck.errors import InvalidSpotParams
from node.spotcheck.feasibility import (
    FeasibilityInputs,
    compute_detection_probability,
    compute_false_alarm_probability,
    compute_feasibility_margins,
    compute_labels_hit_probability,
    estimate_detection,
    is_sound,
)


def test_hit_probability_is_the_hypergeometric_miss_complement():
    assert compute_labels_hit_probability(10, 0, 3) == 0.0
    assert compute_labels_hit_probability(10, 8, 3) == 1.0
    # C(8,3)/C(10,3) = 56/120 of the time all three named blocks were kept
    assert compute_labels_hit_probability(10, 2, 3) == pytest.approx(1 - 56 / 120)
    assert compute_labels_hit_probability(4095, 41, 64) == pytest.approx(1 - 0.99**64, abs=0.01)


def test_detection_grows_with_rate_and_window():
    p = [compute_detection_probability(r, 20, 0.5, 0.47) for r in (0.05, 0.5, 5)]
    assert p[0] < p[1] < p[2] and p[2] > 0.999
    assert compute_detection_probability(1, 10, 0.5, 0.2) == pytest.approx(1 - math.exp(-1.0))


def test_false_alarms_are_a_binomial_tail():
    assert compute_false_alarm_probability(40, 0.0, 0) == 0.0
    assert compute_false_alarm_probability(40, 0.01, 0) == pytest.approx(1 - 0.99**40)
    assert compute_false_alarm_probability(40, 0.01, 2) < compute_false_alarm_probability(40, 0.01, 1)


def test_monte_carlo_matches_the_analytic_detection():
    rng = np.random.default_rng(5)
    n, count, rate, window, share = 1000, 16, 0.5, 10.0, 0.5
    hit = compute_labels_hit_probability(n, 100, count)
    analytic = compute_detection_probability(rate, window, share, hit)
    assert estimate_detection(rng, n, 0.10, count, rate, window, share, 800) == pytest.approx(analytic, abs=0.06)


def test_soundness_needs_every_margin():
    base = dict(x_s=0.15, y_bytes=64 << 20, z_min_s=0.8, honest_latency_max_s=0.08, far_extra_s=0.4,
                free_bytes=16384, min_undeclared_bytes=1 << 20)
    assert is_sound(compute_feasibility_margins(FeasibilityInputs(**base)))
    for change in ({"z_min_s": 0.1}, {"honest_latency_max_s": 0.14}, {"far_extra_s": 0.01},
                   {"free_bytes": 2 << 20}):
        assert not is_sound(compute_feasibility_margins(FeasibilityInputs(**{**base, **change}))), change


@pytest.mark.parametrize("args", [(-1, 1, 0.5, 0.5), (1, 1, 1.5, 0.5), (1, 1, 0.5, -0.1)])
def test_bad_domain_is_a_typed_error(args):
    with pytest.raises(InvalidSpotParams):
        compute_detection_probability(*args)


def test_the_late_tolerance_is_the_least_that_keeps_honest_windows_under_the_false_alarm_target() -> None:
    from node.spotcheck.feasibility import compute_false_alarm_probability, compute_max_late

    m = compute_max_late(40, 0.002, 1e-6)  # the sim's window (2 Hz × 20 s) at the measured honest late rate
    assert m == 4
    assert compute_false_alarm_probability(40, 0.002, m) <= 1e-6 < compute_false_alarm_probability(40, 0.002, m - 1)
    assert compute_max_late(40, 0.0, 1e-6) == 0, "a machine that is never late tolerates nothing"
    assert compute_max_late(10, 0.9, 1e-6) == 10, "never more than the window's challenges"


def test_the_sim_policy_tolerates_a_machine_stall_but_not_a_far_state() -> None:
    from node.spotcheck.sim import SimConfig
    from node.spotcheck.verify import WindowMeasurement, decide_window

    policy = SimConfig().get_policy()
    base = dict(device_id="d", window=0, challenges=19, state_challenges=9, labels_challenges=10, missing=0, errors=0,
                unsigned=0,
                wrong_labels=0, stale_state=0, unknown_step=0, state_quanta=(), declared_bytes=1, catalog_bytes=1,
                accounted_bytes=1, declared_flops=1.0, capacity_flops=1.0)  # a full window of declared work
    stall = [220.0] * 18 + [1538.0]  # run 3: one ~1.5 s stall of the whole machine
    far = [220.0] * 10 + [900.0] * 9  # every state answer from far memory
    assert decide_window(WindowMeasurement(**base, latencies_ms=tuple(stall)), policy).passed
    assert decide_window(WindowMeasurement(**base, latencies_ms=tuple(far)), policy).failures == ("late",)

import pytest
from hypothesis import given
from hypothesis import strategies as st

from node.errors import InvalidParams
from node.protocol.reputation import (
    P_MAX_WAD,
    P_MIN_WAD,
    PRIOR,
    PRIOR_WAD,
    WAD,
    compute_check_probability,
    compute_check_probability_wad,
    compute_posterior,
    compute_posterior_wad,
    is_slashable,
)


def test_seeds_table_float():
    p, seen = PRIOR, []
    for _ in range(3):
        p = compute_posterior(p, 0.01, 0.0, valid=False)
        seen.append(round(p * 100, 2))
    assert seen == [50.25, 99.02, 99.99]


def test_seeds_table_fixed_point_by_hand():
    # 0.01 / (0.01 + 0.99 * 0.01) = 100/199, floored in 1e18.
    p1 = compute_posterior_wad(PRIOR_WAD, 10**16, 0, valid=False)
    assert p1 == (10**16 * WAD * WAD) // (10**16 * WAD + (WAD - 10**16) * 10**16)
    assert p1 == 502512562814070351
    p2 = compute_posterior_wad(p1, 10**16, 0, valid=False)
    p3 = compute_posterior_wad(p2, 10**16, 0, valid=False)
    assert [round(x / 1e16, 2) for x in (p1, p2, p3)] == [50.25, 99.02, 99.99]


def test_valid_verdict_lowers_p_and_clamps():
    p = PRIOR_WAD
    for _ in range(100):
        p = compute_posterior_wad(p, 10**16, 0, valid=True)
    assert p == P_MIN_WAD  # beta = 0: a valid verdict drives P to the floor
    p = PRIOR_WAD
    for _ in range(20):
        p = compute_posterior_wad(p, 10**16, 0, valid=False)
    assert p == P_MAX_WAD


def test_zero_denominator_keeps_p():
    # alpha = 0 and beta = 1: an invalid verdict is impossible for anyone; P is left as it was.
    assert compute_posterior_wad(PRIOR_WAD, 0, WAD, valid=False) == PRIOR_WAD


def test_check_probability_and_slash_threshold():
    assert compute_check_probability_wad(10**15, 5 * 10**16) == 5 * 10**16
    assert compute_check_probability_wad(6 * 10**17, 5 * 10**16) == 6 * 10**17
    assert compute_check_probability(0.001, 0.05) == 0.05
    assert is_slashable(95 * 10**16, 95 * 10**16) and not is_slashable(94 * 10**16, 95 * 10**16)


@pytest.mark.parametrize("args", [(-1, 0, 0), (WAD + 1, 0, 0), (0, WAD + 1, 0), (0, 0, -5)])
def test_out_of_range_inputs_raise(args):
    with pytest.raises(InvalidParams):
        compute_posterior_wad(*args, valid=True)


wad = st.integers(P_MIN_WAD, P_MAX_WAD)
rate = st.integers(10**12, 5 * 10**17)


@given(wad, rate, rate, st.booleans())
def test_fixed_point_tracks_float_reference(p, alpha, beta, valid):
    fixed = compute_posterior_wad(p, alpha, beta, valid) / WAD
    ref = compute_posterior(p / WAD, alpha / WAD, beta / WAD, valid)
    assert fixed == pytest.approx(ref, rel=1e-9, abs=1e-15)
    assert P_MIN_WAD <= compute_posterior_wad(p, alpha, beta, valid) <= P_MAX_WAD

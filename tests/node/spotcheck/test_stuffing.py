import numpy as np
import pytest

from node.spotcheck.errors import InvalidSpotParams
from node.spotcheck.stuffing import StuffingParams, compute_block_on_demand, compute_cone_costs, compute_stuffing

SEED = bytes(range(32))
SMALL = StuffingParams(n_blocks=64, block_bytes=256, layers=4, parents=2)


def stuff(seed: bytes = SEED, params: StuffingParams = SMALL) -> np.ndarray:
    out = np.zeros((params.n_blocks, params.words), dtype=np.uint64)
    compute_stuffing(seed, params, out)
    return out


def test_the_stuffing_is_a_function_of_the_seed():
    assert np.array_equal(stuff(), stuff())
    other = stuff(seed=bytes(31) + b"\x01")
    assert (stuff() != other).mean() > 0.99


@pytest.mark.parametrize("layers", [1, 2, 3, 4])
def test_every_block_recomputed_on_demand_equals_the_filled_one(layers):
    params = StuffingParams(n_blocks=32, block_bytes=128, layers=layers)
    full = stuff(params=params)
    for i in (0, 1, 17, 31):
        block = compute_block_on_demand(SEED, params, i, full[i - 1] if i else None)
        assert np.array_equal(block, full[i]), i


def test_a_block_depends_on_its_chain_predecessor():
    full = stuff()
    wrong_prev = full[9].copy()
    wrong_prev[0] ^= np.uint64(1)
    assert (compute_block_on_demand(SEED, SMALL, 10, wrong_prev) != full[10]).mean() > 0.9


def test_one_flipped_bit_in_the_seed_changes_every_word():
    a = stuff()
    b = stuff(seed=SEED[:-1] + bytes([SEED[-1] ^ 1]))
    assert (a != b).mean() > 0.99


def test_recomputing_any_kept_block_costs_most_of_a_fill():
    params = StuffingParams(n_blocks=256, block_bytes=64, layers=6)
    costs = compute_cone_costs(SEED, params)
    # the lower layers are never kept: every block's cone reaches most of each of them
    assert costs.min() > 0.5 * params.n_blocks * (params.layers - 1)
    assert costs.max() <= params.n_blocks * (params.layers - 1) + 1


def test_cone_costs_count_exactly_what_recomputation_touches():
    params = StuffingParams(n_blocks=16, block_bytes=64, layers=2, parents=1)
    costs = compute_cone_costs(SEED, params)
    from node.spotcheck.stuffing import compute_layer_plan
    plan = compute_layer_plan(SEED, params, 1)
    for i in range(16):
        assert costs[i] == max(i, int(plan.parents[i].max())) + 1 + 1


@pytest.mark.parametrize("kwargs", [dict(n_blocks=1), dict(n_blocks=8, block_bytes=100), dict(n_blocks=8, layers=0),
                                    dict(n_blocks=8, parents=9)])
def test_bad_params_are_typed_errors(kwargs):
    with pytest.raises(InvalidSpotParams):
        StuffingParams(**kwargs)


def test_short_seed_and_wrong_buffer_are_refused():
    with pytest.raises(InvalidSpotParams):
        stuff(seed=b"short")
    with pytest.raises(InvalidSpotParams):
        compute_stuffing(SEED, SMALL, np.zeros((SMALL.n_blocks, SMALL.words), dtype=np.int64))
    with pytest.raises(InvalidSpotParams):
        compute_block_on_demand(SEED, SMALL, 3, None)

import math

import numpy as np
import pytest

from node.errors import InvalidParams
from node.protocol.lsh import (
    CHUNK,
    compute_block_sign_plan,
    compute_catch_probability,
    compute_named_positions,
    compute_optimal_audit_rate,
    compute_projection,
    compute_projection_plan,
    compute_projection_with_plan,
    compute_quantised_projection,
    compute_sketch,
    compute_sketch_distance,
    compute_sketch_plan,
    compute_sketch_with_plan,
    is_audited,
)

SEED = b"s" * 32


def test_projection_is_deterministic_and_seed_dependent():
    x = np.random.default_rng(0).standard_normal(5000).astype(np.float32)
    a = compute_projection(x, SEED, 64)
    assert a.dtype == np.float64 and a.shape == (64,)
    assert np.array_equal(a, compute_projection(x, SEED, 64))
    assert not np.array_equal(a, compute_projection(x, b"t" * 32, 64))


def test_projection_is_linear():
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal(3000), rng.standard_normal(3000)
    lhs = compute_projection(x + 2 * y, SEED, 32)
    rhs = compute_projection(x, SEED, 32) + 2 * compute_projection(y, SEED, 32)
    assert np.allclose(lhs, rhs, atol=1e-12)


def test_projection_matches_a_dense_count_sketch_and_shape_does_not_matter():
    x = np.random.default_rng(2).standard_normal((30, 50))
    plan = compute_projection_plan(SEED, x.size, 16)
    dense = np.zeros((16, x.size))
    dense[plan.buckets, np.arange(x.size)] = plan.signs
    assert np.allclose(compute_projection(x, SEED, 16), dense @ x.reshape(-1), atol=1e-12)
    assert np.array_equal(compute_projection(x, SEED, 16), compute_projection(x.reshape(-1), SEED, 16))


def test_plan_equals_streaming_across_chunks():
    x = np.random.default_rng(3).standard_normal(CHUNK + 1234).astype(np.float32)
    plan = compute_projection_plan(SEED, x.size, 128)
    assert np.array_equal(compute_projection_with_plan(plan, x), compute_projection(x, SEED, 128))
    # a prefix's chunk draws do not depend on the input length (counter-based)
    short = compute_projection_plan(SEED, 1000, 128)
    assert np.array_equal(short.buckets, plan.buckets[:1000]) and np.array_equal(short.signs, plan.signs[:1000])


def test_sketch_preserves_norm_roughly():
    x = np.random.default_rng(4).standard_normal(20000)
    y = compute_projection(x, SEED, 256)
    assert 0.8 < np.linalg.norm(y) / np.linalg.norm(x) < 1.2


def test_quantised_projection_is_int32_and_rejects_overflow():
    x = np.random.default_rng(5).standard_normal(1000)
    q = compute_quantised_projection(x, SEED, 8, 1000.0)
    assert q.dtype == np.int32
    assert np.array_equal(q, np.rint(compute_projection(x, SEED, 8) * 1000.0).astype(np.int32))
    with pytest.raises(InvalidParams):
        compute_quantised_projection(x, SEED, 8, 1e12)
    with pytest.raises(InvalidParams):
        compute_quantised_projection(x, SEED, 8, float("nan"))


@pytest.mark.parametrize("bad", [np.array([1.0, np.nan]), np.array([np.inf]), np.array([1, 2])])
def test_bad_inputs_are_typed_errors(bad):
    with pytest.raises(InvalidParams):
        compute_projection(bad, SEED, 4)


def test_bad_dim_and_short_seed_are_refused():
    with pytest.raises(InvalidParams):
        compute_projection(np.ones(4), SEED, 0)
    with pytest.raises(InvalidParams):
        compute_projection(np.ones(4), b"short", 4)


def test_sketch_distance_separates_a_changed_gradient():
    rng = np.random.default_rng(6)
    g = rng.standard_normal(10000)
    q = compute_quantised_projection(g, SEED, 64, 1e4)
    assert compute_sketch_distance(q, q).relative_l2 == 0.0
    other = compute_quantised_projection(g + 0.1 * rng.standard_normal(10000), SEED, 64, 1e4)
    assert compute_sketch_distance(other, q).relative_l2 > 0.05


def test_audit_rate_maths():
    k = 3.0
    p = compute_optimal_audit_rate(k)
    assert p == 0.25
    q = compute_catch_probability(p, k)
    assert math.isclose(q, 0.25 * 0.75**3)
    for other in (0.1, 0.2, 0.3, 0.5):
        assert compute_catch_probability(other, k) < q


def test_is_audited_uses_the_draw_modulo_wad():
    assert is_audited((5).to_bytes(32, "big"), 6)
    assert not is_audited((6).to_bytes(32, "big"), 6)
    with pytest.raises(InvalidParams):
        is_audited(b"x", 1)


def test_named_positions_are_distinct_sorted_and_step_dependent():
    a = compute_named_positions(SEED, 7, 10**8, 64)
    assert len(set(a.tolist())) == 64 and np.all(np.diff(a) > 0) and a.max() < 10**8
    assert not np.array_equal(a, compute_named_positions(SEED, 8, 10**8, 64))
    assert np.array_equal(a, compute_named_positions(SEED, 7, 10**8, 64))


def test_interrupting_policy_completes_a_step_with_probability_p_one_minus_p_to_the_k():
    from node.protocol.lsh import compute_completed_audits

    assert compute_completed_audits([True, False, True, False, False, False], 2) == [2]  # 0 interrupted by 2
    assert compute_completed_audits([True, False, False, True], 2) == [0, 3]
    rng = np.random.default_rng(11)
    for p, k in ((0.25, 3), (0.1, 8), (0.5, 1)):
        steps = 200_000
        done = compute_completed_audits((rng.random(steps) < p).tolist(), k)
        assert abs(len(done) / steps - compute_catch_probability(p, k)) < 0.01 * p + 0.002


@pytest.mark.parametrize("length", [1, 3, 4095, 4097, 100_001])
def test_a_short_chunk_plan_is_the_prefix_of_the_full_chunk(length):
    import numpy as np

    from node.protocol.lsh import CHUNK, compute_chunk_plan, get_chunk_generator

    draws = get_chunk_generator(b"s" * 16, 2).integers(0, 1 << 32, size=CHUNK, dtype=np.uint64)[:length]
    buckets, signs = compute_chunk_plan(b"s" * 16, 2, length, 97)
    assert (buckets == ((draws >> np.uint64(1)) % np.uint64(97)).astype(np.int64)).all()
    assert (signs == (draws & np.uint64(1)).astype(np.float64) * 2.0 - 1.0).all()


def test_completed_audits_of_a_run_without_draws_is_empty():
    from node.protocol.lsh import compute_completed_audits

    assert compute_completed_audits([], 2) == [] and compute_completed_audits([False, False], 0) == []


# --- block-sign sketch ------------------------------------------------------------------------------


def block_sign_by_definition(x: np.ndarray, seed: bytes, dim: int) -> np.ndarray:
    """The block-sign sketch written out: rows of dim (last padded), block sums in row order, float64 totals."""
    flat = x.reshape(-1)
    plan = compute_block_sign_plan(seed, flat.size, dim)
    rows = -(-flat.size // dim)
    padded = np.zeros(rows * dim, dtype=flat.dtype)
    padded[: flat.size] = flat
    grid = padded.reshape(rows, dim)
    block = max(1, CHUNK // dim)
    out = np.zeros(dim, dtype=np.float64)
    for start in range(0, rows, block):
        signed = grid[start:start + block] * plan.row_signs[start:start + block, None].astype(flat.dtype)
        out += np.cumsum(signed, axis=0)[-1]  # cumsum adds in row order by definition
    return out * plan.col_signs


SHAPES = [(1000, 64, np.float32), (5000, 7, np.float64), (3, 16, np.float32), (2 * CHUNK + 37, 2, np.float32),
          (999, 3, np.float32), (70_000, 4096, np.float32), (3 * CHUNK // 256 * 256 + 5, 256, np.float32)]


@pytest.mark.parametrize(("n", "dim", "dtype"), SHAPES)
def test_block_sign_equals_its_definition_bit_for_bit(n, dim, dtype):
    x = np.random.default_rng(n).standard_normal(n).astype(dtype)
    got = compute_sketch("block-sign", x, SEED, dim)
    assert np.array_equal(got, block_sign_by_definition(x, SEED, dim))
    plan = compute_block_sign_plan(SEED, n, dim)
    rows = plan.row_signs.astype(np.float64)
    signs = np.repeat(rows, dim)[:n] * np.tile(plan.col_signs, len(rows))[:n]
    exact = np.bincount(np.arange(n) % dim, weights=x.astype(np.float64) * signs, minlength=dim)
    assert np.allclose(got, exact, rtol=1e-4, atol=1e-3)  # the float64 count sketch with bucket i mod dim


def test_block_sign_is_linear_seeded_and_shape_blind():
    rng = np.random.default_rng(7)
    x, y = rng.standard_normal((40, 75)), rng.standard_normal((40, 75))
    def sketch(v: np.ndarray, seed: bytes = SEED) -> np.ndarray:
        return compute_sketch("block-sign", v, seed, 32)

    assert np.allclose(sketch(x + 2 * y), sketch(x) + 2 * sketch(y))
    assert np.array_equal(sketch(x), sketch(x.reshape(-1)))
    assert not np.array_equal(sketch(x), sketch(x, b"t" * 32))
    plan = compute_sketch_plan("block-sign", SEED, x.size, 32)
    assert np.array_equal(compute_sketch_with_plan(plan, x), sketch(x))


def test_block_sign_preserves_norm_roughly():
    x = np.random.default_rng(8).standard_normal(200_000)
    ratios = [np.linalg.norm(compute_sketch("block-sign", x, bytes([s]) * 32, 256)) / np.linalg.norm(x)
              for s in range(5)]
    assert all(0.8 < r < 1.2 for r in ratios)


@pytest.mark.parametrize("bad_at", [0, 999, 1003])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_block_sign_refuses_non_finite_input_anywhere(bad, bad_at):
    x = np.ones(1004, dtype=np.float32)
    x[bad_at] = bad
    with pytest.raises(InvalidParams):
        compute_sketch("block-sign", x, SEED, 16)


def test_unknown_kind_and_wrong_length_are_typed():
    with pytest.raises(InvalidParams):
        compute_sketch("fourier", np.ones(8), SEED, 4)
    plan = compute_sketch_plan("block-sign", SEED, 8, 4)
    with pytest.raises(InvalidParams):
        compute_sketch_with_plan(plan, np.ones(9))
    with pytest.raises(InvalidParams):
        compute_sketch_with_plan(plan, np.ones(8, dtype=np.int64))
    with pytest.raises(InvalidParams):
        compute_sketch_plan("block-sign", b"short", 8, 4)
    with pytest.raises(InvalidParams):  # one column: numpy would sum it pairwise, not in row order
        compute_sketch_plan("block-sign", SEED, 8, 1)

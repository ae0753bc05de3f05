"""Per-expert leaves, trees, fingerprints and the expert assignment draw (node/protocol/moe.py)."""

import dataclasses

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from node.protocol.errors import InvalidInput
from node.protocol.hashing import keccak256
from node.protocol.merkle import compute_merkle_root
from node.protocol.moe import (
    FP_K,
    ROUTER,
    SHARED,
    ExpertKey,
    Holder,
    InvalidMoe,
    MoeCommitment,
    MoeReason,
    RouterLeaf,
    compute_expert_assignment,
    compute_expert_fingerprint,
    compute_routing,
    compute_used_experts,
    decode_expert_leaf,
    encode_expert_leaf,
    expert_leaf_size,
    find_routing_gaps,
    make_expert_leaf,
    measure_expert_fingerprint,
    verify_expert_leaves,
)

HIDDEN = 32
GOLDEN_ASSIGNMENT = {"layer0.e0": [11, 6, 7], "shared": [1, 11, 8], "layer0.router": [11, 7, 10],
                     "layer1.e3": [10, 4, 6]}


def make_commitment(seed: int = 0, layers: int = 2, experts: int = 4, positions: int = 6) -> MoeCommitment:
    rng = np.random.default_rng(seed)
    router, by_key = [], {}
    for layer in range(layers):
        for t in range(positions):
            x = rng.standard_normal(HIDDEN).astype(np.float32)
            chosen = sorted(rng.choice(experts, 2, replace=False).tolist())
            w = rng.dirichlet([1, 1]).astype(np.float32)
            leaf_r = RouterLeaf(layer, t, tuple(chosen), tuple(float(v) for v in w),
                                make_expert_leaf(layer, 0, t, 0.0, x, x).input_hash)
            router.append(leaf_r)
            for e, wi in zip(chosen, w, strict=True):
                y = rng.standard_normal(HIDDEN).astype(np.float32)
                by_key.setdefault(ExpertKey(layer, e), []).append(make_expert_leaf(layer, e, t, float(wi), x, y))
    return MoeCommitment(layers, experts, tuple(router), {k: tuple(v) for k, v in by_key.items()})


def test_expert_key_round_trips_and_rejects_non_canonical_names():
    assert str(ExpertKey.parse("layer3.e1")) == "layer3.e1"
    assert ExpertKey.parse("layer3.router") == ExpertKey(3, ROUTER)
    assert ExpertKey.parse("shared") == ExpertKey(0, SHARED)
    for bad in ("layer03.e1", "layer3.e", "l3.e1", "layer3.x1", "layer-1.e0", "layer3.e+1", "layer99999.e0"):
        with pytest.raises(InvalidInput) as info:
            ExpertKey.parse(bad)
        assert info.value.moe_reason == MoeReason.EXPERT_UNKNOWN
        assert bad in str(info.value) or "out of range" in str(info.value)


def test_fingerprint_takes_largest_magnitudes_with_ties_to_the_lower_index():
    row = np.zeros(40, dtype=np.float32)
    row[[5, 9, 30]] = [-3.0, 3.0, 2.0]
    index, value = compute_expert_fingerprint(row)
    assert index[:3] == (5, 9, 30) and value[:3] == (-3.0, 3.0, 2.0)
    assert list(index[3:]) == [i for i in range(40) if i not in (5, 9, 30)][:FP_K - 3]


def test_fingerprint_refuses_non_finite_and_short_rows():
    with pytest.raises(InvalidMoe):
        compute_expert_fingerprint(np.full(40, np.nan, dtype=np.float32))
    with pytest.raises(InvalidMoe):
        compute_expert_fingerprint(np.ones(FP_K - 1, dtype=np.float32))


@given(st.integers(0, 2**16 - 1), st.integers(0, 2**32 - 1), st.floats(-1e6, 1e6, width=32))
def test_expert_leaf_encoding_round_trips(expert, position, weight):
    x = np.arange(HIDDEN, dtype=np.float32)
    leaf = make_expert_leaf(1, expert % 4096, position, weight, x, x[::-1].copy())
    raw = encode_expert_leaf(leaf)
    assert len(raw) == expert_leaf_size() == 2 + 2 + 4 + 4 + 32 + 32 + FP_K * 6
    assert decode_expert_leaf(raw) == leaf


def test_decoding_rejects_wrong_length_and_non_finite_values():
    x = np.arange(HIDDEN, dtype=np.float32)
    raw = encode_expert_leaf(make_expert_leaf(0, 0, 0, 0.5, x, x))
    with pytest.raises(InvalidMoe):
        decode_expert_leaf(raw + b"\x00")
    nan = raw[:-4] + np.array([np.nan], dtype=">f4").tobytes()
    with pytest.raises(InvalidMoe) as info:
        decode_expert_leaf(nan)
    assert info.value.moe_reason == MoeReason.MOE_MALFORMED


def test_one_experts_leaves_prove_alone_and_any_change_breaks_the_proof():
    c = make_commitment()
    root = c.root()
    for key in c.expert_keys():
        leaves = c.leaves_of(key)
        proof = c.expert_proof(key)
        assert verify_expert_leaves(leaves, proof, root)
        if not leaves:
            continue
        changed = dataclasses.replace(leaves[0], fp_value=(leaves[0].fp_value[0] + 1e-3, *leaves[0].fp_value[1:]))
        assert not verify_expert_leaves((changed, *leaves[1:]), proof, root)
        assert not verify_expert_leaves(leaves[1:], proof, root)  # a dropped leaf changes the count and root
        assert not verify_expert_leaves(leaves[::-1], proof, root) or len(leaves) == 1
    other = c.expert_proof(ExpertKey(0, 1))
    assert not verify_expert_leaves(c.leaves_of(ExpertKey(0, 0)), other, root)


def test_moe_root_covers_router_and_experts():
    c = make_commitment()
    assert c.root() == keccak256(c.router_root() + compute_merkle_root(c.summary_leaf_hashes()))
    r0 = c.router[0]
    moved = dataclasses.replace(r0, weights=(r0.weights[1], r0.weights[0]))
    assert MoeCommitment(c.num_layers, c.num_experts, (moved, *c.router[1:]), c.experts).root() != c.root()


def test_routing_gaps_find_missing_and_unrouted_leaves():
    c = make_commitment()
    assert find_routing_gaps(c) == []
    key = next(iter(c.experts))
    dropped = {k: (v[1:] if k == key else v) for k, v in c.experts.items()}
    gaps = find_routing_gaps(MoeCommitment(c.num_layers, c.num_experts, c.router, dropped))
    assert gaps == [(key, c.experts[key][0].position)]


def test_measurement_is_zero_for_the_committed_row_and_grows_with_a_perturbation():
    rng = np.random.default_rng(1)
    y = rng.standard_normal(HIDDEN).astype(np.float32)
    leaf = make_expert_leaf(0, 0, 0, 1.0, y, y)
    same = measure_expert_fingerprint(leaf, y)
    assert (same.max_abs_error, same.rel_error, same.index_mismatches) == (0.0, 0.0, 0)
    noisy = measure_expert_fingerprint(leaf, y + 0.01 * rng.standard_normal(HIDDEN).astype(np.float32))
    assert 0 < noisy.rel_error < 0.05
    permuted = measure_expert_fingerprint(leaf, rng.permutation(y))
    assert permuted.index_mismatches > 0 and permuted.rel_error > 0.1


def test_routing_is_softmax_top_k_renormalised_with_ties_to_the_lower_expert():
    experts, weights = compute_routing(np.array([[1.0, 3.0, 3.0, 0.0]]), 2)
    assert experts.tolist() == [[1, 2]]
    assert weights.tolist() == [[0.5, 0.5]]


def test_used_experts_cover_every_routed_expert_every_router_and_the_link():
    c = make_commitment()
    used = compute_used_experts(c)
    assert {k for k in used if k.expert < ROUTER - 1} == {k for k, v in c.experts.items() if v}
    assert {k for k in used if k.expert == ROUTER} == {ExpertKey(L, ROUTER) for L in range(c.num_layers)}
    assert ExpertKey(0, SHARED) in used


def holders(n: int = 12) -> list[Holder]:
    return [Holder(bytes([i]) * 20, 10 + i) for i in range(n)]


def test_assignment_covers_every_duty_with_distinct_validators_and_is_deterministic():
    hs = holders()
    duties = [ExpertKey(0, 0), ExpertKey(1, 1), ExpertKey(0, ROUTER), ExpertKey(0, SHARED)]
    a = compute_expert_assignment(b"\x07" * 32, duties, hs, 3)
    assert a == compute_expert_assignment(b"\x07" * 32, list(reversed(duties)), list(reversed(hs)), 3)
    assert all(len(set(chosen)) == 3 for chosen in a.values())
    assert a != compute_expert_assignment(b"\x08" * 32, duties, hs, 3)


def test_assignment_draws_from_every_validator_so_no_one_picks_its_duties():
    # finding 4 of issue 30: two sybils claiming one rare expert were its only judges. A draw takes no holdings: over
    # many inferences every validator judges every duty, and each duty's judges are spread by stake alone.
    hs = holders(6)
    seen: dict[ExpertKey, set[bytes]] = {}
    for seed in range(60):
        for key, chosen in compute_expert_assignment(seed.to_bytes(32, "big"), [ExpertKey(1, 3), ExpertKey(0, SHARED)],
                                                     hs, 3).items():
            seen.setdefault(key, set()).update(chosen)
    assert all(judges == {h.address for h in hs} for judges in seen.values())


def test_assignment_is_stake_weighted():
    hs = [Holder(b"\x01" * 20, 900), Holder(b"\x02" * 20, 100)]
    counts = {b"\x01" * 20: 0, b"\x02" * 20: 0}
    for seed in range(400):
        chosen = compute_expert_assignment(seed.to_bytes(32, "big"), [ExpertKey(0, 0)], hs, 1)[ExpertKey(0, 0)]
        counts[chosen[0]] += 1
    assert 320 < counts[b"\x01" * 20] < 400  # expectation 360 (90 %)


def test_settled_weight_ignores_stake_added_within_the_delay():
    from node.protocol.moe import compute_settled_weight

    assert compute_settled_weight(0, 10**21) == 0  # bonded within the delay: drawn for nothing
    assert compute_settled_weight(5, 7) == 5  # a top-up within the delay does not count yet
    assert compute_settled_weight(7, 5) == 5  # stake removed counts at once
    with pytest.raises(InvalidMoe):
        compute_settled_weight(-1, 5)


def test_assignment_refuses_too_few_validators_and_bad_inputs():
    hs = holders(4)
    with pytest.raises(InvalidMoe) as info:
        compute_expert_assignment(b"\x00" * 32, [ExpertKey(1, 3)], hs, 5)
    assert info.value.moe_reason == MoeReason.ASSIGNMENT_UNCOVERED and "4 eligible" in str(info.value)
    with pytest.raises(InvalidMoe) as info:  # zero settled weight is not eligible
        compute_expert_assignment(b"\x00" * 32, [ExpertKey(1, 3)], [*hs[:2], dataclasses.replace(hs[2], stake=0)], 3)
    assert info.value.moe_reason == MoeReason.ASSIGNMENT_UNCOVERED
    with pytest.raises(InvalidMoe):
        compute_expert_assignment(b"\x00" * 31, [ExpertKey(0, 0)], hs, 1)
    with pytest.raises(InvalidMoe):
        compute_expert_assignment(b"\x00" * 32, [ExpertKey(0, 0)], [*hs, hs[0]], 1)


def test_assignment_golden_vector_for_the_contract_mirror():
    # keccak256(randomness ‖ uint16 layer ‖ uint16 expert ‖ uint32 draw) mod remaining stake, ascending address
    hs = holders()
    duties = [ExpertKey(0, 0), ExpertKey(1, 3), ExpertKey(0, ROUTER), ExpertKey(0, SHARED)]
    got = compute_expert_assignment(bytes(range(32)), duties, hs, 3)
    assert {str(k): [x[0] for x in v] for k, v in got.items()} == GOLDEN_ASSIGNMENT


def test_moe_root_golden_vector():
    assert make_commitment().root().hex() == "b12bb73e7a646ffdb8cd4a9d09acdcd960982524553f182c93b0ddb34aa02ed5"


def test_the_committed_fingerprint_hash_of_an_moe_model_binds_the_moe_root():
    from node.protocol.moe import compute_moe_fingerprint_hash

    f, m = b"\x01" * 32, b"\x02" * 32
    assert compute_moe_fingerprint_hash(f, m) == keccak256(f + m)
    assert compute_moe_fingerprint_hash(f, m) != compute_moe_fingerprint_hash(m, f)
    with pytest.raises(InvalidMoe):
        compute_moe_fingerprint_hash(f, m[:31])


def test_the_opening_rebuilds_the_moe_root():
    from node.protocol.merkle import compute_leaf_hash
    from node.protocol.moe import compute_duty_key, parse_duty_key

    c = make_commitment()
    router_root, counts, roots = c.opening()
    summaries = [compute_leaf_hash(L.to_bytes(2, "big") + e.to_bytes(2, "big") + n.to_bytes(4, "big") + r)
                 for (L, e), n, r in zip(((k.layer, k.expert) for k in c.expert_keys()), counts, roots, strict=True)]
    assert keccak256(router_root + compute_merkle_root(summaries)) == c.root()
    assert sum(counts) == sum(len(v) for v in c.experts.values())
    for key in (ExpertKey(3, 1), ExpertKey(2, ROUTER), ExpertKey(0, SHARED)):
        assert parse_duty_key(compute_duty_key(key)) == key
    assert compute_duty_key(ExpertKey(1, 3)) == 0x00010003


def test_every_moe_reason_is_the_nodes_reason_of_the_same_name():
    from node.errors import Reason

    assert all(Reason(int(r)).name == r.name for r in MoeReason if r is not MoeReason.OK)

import dataclasses

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from node.checks.stage1 import POSITION_RULES, compute_position_violations, find_termination_position, sequence_check
from node.errors import Reason
from node.executer.synthetic import SyntheticRequest, make_onchain, make_synthetic_artifact
from node.protocol.artifact import Artifact, make_positions
from node.protocol.sampler import WEIGHT_MAX, SamplingParams, tail_exhaustion_floor
from node.protocol.seed import compute_sampler_uniforms
from node.protocol.sequence import find_length_violation, find_position_violation, find_termination_violation
from tests.node.protocol.strategies import requests


def honest(req: SyntheticRequest, logits_seed: int = 0):
    art = make_synthetic_artifact(req, logits_seed)
    return art, make_onchain(req, art)


def with_columns(art: Artifact, **columns) -> Artifact:
    p = art.positions
    cols = {name: np.array(getattr(p, name)) for name in ("chosen", "token_ids", "weights", "raw_logprobs")}
    cols.update(columns)
    return Artifact(art.header, make_positions(**cols))


def recommitted(req: SyntheticRequest, forged: Artifact):
    """The forger commits its forged artifact: hashes match, only the rules can catch it."""
    return make_onchain(req, forged)


REQ = SyntheticRequest(inference_id=77, user_seed=5, params=SamplingParams(1.0, 1.0, 0, 40), output_length=40,
                       vocab_size=200, logit_scale=2.0)  # runs to max_tokens: terminated without a stop token


@given(requests, st.integers(0, 10_000))
def test_sampler_output_always_passes(req, logits_seed):
    art, onchain = honest(req, logits_seed)
    result = sequence_check(art.header, art.positions, onchain)
    assert result.valid, result
    assert result.positions_checked == req.output_length


@pytest.mark.parametrize("field,value,reason", [
    ("model_id", b"\x22" * 32, Reason.MODEL_MISMATCH),
    ("temperature_bits", SamplingParams(0.9).temperature_bits, Reason.PARAMS_MISMATCH),
    ("top_p_bits", SamplingParams(1.0, 0.5).top_p_bits, Reason.PARAMS_MISMATCH),
    ("top_k", 7, Reason.PARAMS_MISMATCH),
    ("max_tokens", 63, Reason.PARAMS_MISMATCH),
    ("k", 4, Reason.K_MISMATCH),
    ("run_seed", b"\x01" * 32, Reason.SEED_MISMATCH),
    ("prompt_token_ids", (1, 2, 4), Reason.PROMPT_MISMATCH),
    ("output_length", 39, Reason.OUTPUT_LENGTH_MISMATCH),
])
def test_every_header_field_mutation_fails_even_if_recommitted(field, value, reason):
    art, onchain = honest(REQ)
    forged = Artifact(dataclasses.replace(art.header, **{field: value}), art.positions)
    assert sequence_check(forged.header, forged.positions, onchain).reason is reason
    assert sequence_check(forged.header, forged.positions, recommitted(REQ, forged)).reason is reason


def test_output_longer_than_max_tokens_fails():
    req = dataclasses.replace(REQ, params=SamplingParams(1.0, 1.0, 0, 10), output_length=12)
    art, onchain = honest(req)
    assert sequence_check(art.header, art.positions, onchain).reason is Reason.OUTPUT_TOO_LONG


@given(st.integers(0, REQ.output_length - 1), st.sampled_from(["chosen", "token_ids", "weights", "raw_logprobs"]),
       st.integers(0, REQ.k - 1), st.integers(1, 2**20))
def test_every_leaf_field_mutation_fails_against_the_commitment(i, column, j, delta):
    art, onchain = honest(REQ)
    col = np.array(getattr(art.positions, column))
    if column == "chosen":
        col[i] = (col[i] + 1 + delta % (REQ.vocab_size - 1)) % REQ.vocab_size  # never a no-op
    elif column == "raw_logprobs":
        col[i, j] = np.nextafter(col[i, j], np.float32(-np.inf))
    else:
        col[i, j] = col[i, j] - 1 if col[i, j] > 0 else col[i, j] + 1
    forged = with_columns(art, **{column: col})
    result = sequence_check(forged.header, forged.positions, onchain)
    assert not result.valid
    assert result.reason in (Reason.OUTPUT_HASH_MISMATCH, Reason.ARTIFACT_ROOT_MISMATCH)


def _v(art):
    return compute_sampler_uniforms(art.header.run_seed, len(art.positions)).astype(np.int64)


@given(st.integers(0, REQ.output_length - 1), st.integers(0, REQ.k - 1))
def test_choosing_another_candidate_fails_at_that_position(i, j):
    art, _ = honest(REQ)
    chosen = np.array(art.positions.chosen)
    assume(chosen[i] != art.positions.token_ids[i, j])
    chosen[i] = art.positions.token_ids[i, j]
    forged = with_columns(art, chosen=chosen)
    result = sequence_check(forged.header, forged.positions, recommitted(REQ, forged))
    assert (result.reason, result.position) in {(Reason.CHOSEN_MISMATCH, i), (Reason.TAIL_TOKEN_IN_CANDIDATES, i)}


def test_choosing_a_non_candidate_where_v_is_inside_fails():
    art, _ = honest(REQ)
    v = _v(art)
    inside = np.flatnonzero(v < art.positions.weights.sum(axis=1))
    i = int(inside[len(inside) // 2])
    chosen = np.array(art.positions.chosen)
    chosen[i] = next(t for t in range(REQ.vocab_size) if t not in art.positions.token_ids[i])
    forged = with_columns(art, chosen=chosen)
    result = sequence_check(forged.header, forged.positions, recommitted(REQ, forged))
    assert (result.reason, result.position) == (Reason.CHOSEN_MISMATCH, i)


def test_swapping_a_tail_token_for_another_passes_stage1_and_is_left_to_stage2():
    # v >= W_K: any non-candidate token is consistent with the leaf; only the model can tell.
    art, _ = honest(REQ)
    v = _v(art)
    tail = np.flatnonzero(v >= art.positions.weights.sum(axis=1))
    assert tail.size, "REQ is chosen so that some positions fall in the tail"
    i = int(tail[0])
    chosen = np.array(art.positions.chosen)
    chosen[i] = next(t for t in range(REQ.vocab_size) if t not in art.positions.token_ids[i] and t != chosen[i])
    forged = with_columns(art, chosen=chosen)
    assert sequence_check(forged.header, forged.positions, recommitted(REQ, forged)).valid


@given(st.integers(0, REQ.output_length - 1))
def test_reordering_candidates_or_duplicating_ids_fails_at_that_position(i):
    art, _ = honest(REQ)
    w = art.positions.weights
    assume(w[i, 0] > w[i, 1])
    ids, weights = np.array(art.positions.token_ids), np.array(w)
    ids[i, [0, 1]], weights[i, [0, 1]] = ids[i, [1, 0]], weights[i, [1, 0]]
    forged = with_columns(art, token_ids=ids, weights=weights)
    result = sequence_check(forged.header, forged.positions, recommitted(REQ, forged))
    assert (result.reason, result.position) == (Reason.WEIGHTS_NOT_SORTED, i)
    ids = np.array(art.positions.token_ids)
    ids[i, 2] = ids[i, 0]
    forged = with_columns(art, token_ids=ids)
    result = sequence_check(forged.header, forged.positions, recommitted(REQ, forged))
    assert (result.reason, result.position) == (Reason.DUPLICATE_TOKEN_ID, i)
    ids = np.array(art.positions.token_ids)
    ids[i, 4] = REQ.vocab_size
    forged = with_columns(art, token_ids=ids)
    result = sequence_check(forged.header, forged.positions, recommitted(REQ, forged))
    assert (result.reason, result.position) == (Reason.CANDIDATE_ID_OUT_OF_RANGE, i)


def test_inflated_weights_fail():
    art, _ = honest(REQ)
    weights = np.array(art.positions.weights)
    weights[3, 0] = WEIGHT_MAX
    forged = with_columns(art, weights=weights)
    result = sequence_check(forged.header, forged.positions, recommitted(REQ, forged))
    assert (result.reason, result.position) == (Reason.WEIGHT_SUM_OVERFLOW, 3)


def test_first_failure_is_reported():
    art, _ = honest(REQ)
    ids = np.array(art.positions.token_ids)
    ids[30, 1] = ids[30, 0]
    ids[12, 4] = REQ.vocab_size + 5
    forged = with_columns(art, token_ids=ids)
    result = sequence_check(forged.header, forged.positions, recommitted(REQ, forged))
    assert (result.reason, result.position, result.positions_checked) == (Reason.CANDIDATE_ID_OUT_OF_RANGE, 12, 12)


leaf = st.tuples(
    st.integers(0, WEIGHT_MAX),  # v
    st.integers(-1, 12),  # chosen
    st.lists(st.integers(-1, 12), min_size=3, max_size=3),  # ids
    st.lists(st.sampled_from([0, 1, 2**30, 2**31, 2**31 + 1, WEIGHT_MAX, 2**32]), min_size=3, max_size=3),
)


@given(st.lists(leaf, min_size=1, max_size=20), st.sampled_from([10, 13]))
def test_vectorised_rules_equal_the_scalar_spec(leaves, vocab):
    v = np.array([x[0] for x in leaves], dtype=np.uint64)
    positions = make_positions([x[1] for x in leaves], [x[2] for x in leaves], [sorted(x[3], reverse=True)
                               if k % 2 else x[3] for k, x in enumerate(leaves)], np.zeros((len(leaves), 3)))
    matrix = compute_position_violations(v, positions, vocab)
    for n in range(len(leaves)):
        scalar = find_position_violation(int(v[n]), int(positions.chosen[n]), positions.token_ids[n].tolist(),
                                         positions.weights[n].tolist(), vocab)
        vector = POSITION_RULES[int(np.argmax(matrix[:, n]))] if matrix[:, n].any() else Reason.OK
        assert vector is scalar


def test_tail_exhaustion_boundary_vectorised():
    positions = make_positions([4, 4], [[4, 5, 6], [4, 5, 6]], [[2**31, 2**30, 0]] * 2, np.zeros((2, 3)))
    floor = tail_exhaustion_floor(10)
    v = np.array([floor, floor - 1], dtype=np.uint64)
    matrix = compute_position_violations(v, positions, 10)
    assert not matrix[:, 0].any()
    assert POSITION_RULES[int(np.argmax(matrix[:, 1]))] is Reason.TAIL_TOKEN_IN_CANDIDATES


# ---- the termination rule (docs/security.md rule 3, issue 15 finding 6) ----------------------------------------------


def _with_stop(req: SyntheticRequest, stops: set[int], max_tokens: int | None = None) -> SyntheticRequest:
    params = req.params if max_tokens is None else dataclasses.replace(req.params, max_tokens=max_tokens)
    return dataclasses.replace(req, params=params, stop_token_ids=frozenset(stops))


def _last_unique(art: Artifact) -> int:
    """Return a token that the honest output chooses only at its last position."""
    chosen = [int(t) for t in art.positions.chosen]
    assert chosen[-1] not in chosen[:-1], "REQ's last token is unique in its output"
    return chosen[-1]


def test_a_truncated_output_is_not_terminated_at_its_last_position():
    req = _with_stop(REQ, {REQ.vocab_size - 1}, max_tokens=64)  # a stop token it never chose
    art, onchain = honest(req)
    result = sequence_check(art.header, art.positions, onchain)
    assert (result.reason, result.position) == (Reason.NOT_TERMINATED, REQ.output_length - 1)


def test_an_honest_stop_at_the_last_position_passes():
    art, _ = honest(REQ)
    req = _with_stop(REQ, {_last_unique(art)}, max_tokens=64)
    art, onchain = honest(req)
    assert sequence_check(art.header, art.positions, onchain).valid


def test_a_stop_token_before_the_end_is_tokens_after_stop():
    art, _ = honest(REQ)
    first = int(art.positions.chosen[3])
    at = [int(t) for t in art.positions.chosen].index(first)
    req = _with_stop(REQ, {first})
    art, onchain = honest(req)
    result = sequence_check(art.header, art.positions, onchain)
    assert (result.reason, result.position) == (Reason.TOKENS_AFTER_STOP, at)


def test_an_empty_output_is_not_terminated():
    req = _with_stop(dataclasses.replace(REQ, output_length=0), {1}, max_tokens=64)
    art, onchain = honest(req)
    result = sequence_check(art.header, art.positions, onchain)
    assert (result.reason, result.position) == (Reason.NOT_TERMINATED, None)
    empty_allowed = _with_stop(dataclasses.replace(REQ, output_length=0), {1}, max_tokens=0)
    art, onchain = honest(empty_allowed)
    assert sequence_check(art.header, art.positions, onchain).valid  # max_tokens 0 allows nothing else


def test_an_over_long_output_is_rejected():
    req = _with_stop(REQ, {1}, max_tokens=30)  # 40 tokens committed under max_tokens 30
    art, onchain = honest(req)
    assert sequence_check(art.header, art.positions, onchain).reason is Reason.OUTPUT_TOO_LONG


def test_a_sampler_failure_at_the_same_position_is_reported_first():
    req = _with_stop(REQ, {REQ.vocab_size - 1}, max_tokens=64)
    art, _ = honest(req)
    chosen = np.array(art.positions.chosen)
    last = REQ.output_length - 1
    chosen[last] = next(t for t in art.positions.token_ids[last] if t != chosen[last])
    forged = with_columns(art, chosen=chosen)
    result = sequence_check(forged.header, forged.positions, recommitted(req, forged))
    assert result.position == last and result.reason in (Reason.CHOSEN_MISMATCH, Reason.TAIL_TOKEN_IN_CANDIDATES)


def _never_chosen(art: Artifact) -> int:
    return next(t for t in range(REQ.vocab_size) if t not in set(int(c) for c in art.positions.chosen))


def test_reaching_max_tokens_needs_no_stop_token():
    art, _ = honest(REQ)
    req = _with_stop(REQ, {_never_chosen(art)})  # N == max_tokens == 40, the last token is no stop
    art, onchain = honest(req)
    assert sequence_check(art.header, art.positions, onchain).valid


def test_the_one_token_answer_stop_is_the_valid_empty_answer():
    one = dataclasses.replace(REQ, output_length=1)
    art, _ = honest(one)
    req = _with_stop(one, {int(art.positions.chosen[0])}, max_tokens=64)
    art, onchain = honest(req)
    assert sequence_check(art.header, art.positions, onchain).valid
    cut = _with_stop(one, {_never_chosen(art)}, max_tokens=64)
    art, onchain = honest(cut)
    result = sequence_check(art.header, art.positions, onchain)
    assert (result.reason, result.position) == (Reason.NOT_TERMINATED, 0)


def test_going_on_after_a_stop_is_caught_below_max_tokens_too():
    art, _ = honest(REQ)
    stop = int(art.positions.chosen[5])
    at = [int(t) for t in art.positions.chosen].index(stop)
    req = _with_stop(REQ, {stop, _never_chosen(art)}, max_tokens=64)  # and the end is no stop either
    art, onchain = honest(req)
    result = sequence_check(art.header, art.positions, onchain)
    assert (result.reason, result.position, result.positions_checked) == (Reason.TOKENS_AFTER_STOP, at, at)


def test_the_first_failing_position_wins_between_the_sampler_and_termination():
    art, _ = honest(REQ)
    stop = int(art.positions.chosen[5])
    at = [int(t) for t in art.positions.chosen].index(stop)
    req = _with_stop(REQ, {stop})
    art, _ = honest(req)
    ids = np.array(art.positions.token_ids)
    ids[at + 3, 4] = REQ.vocab_size  # a sampler failure after the early stop
    forged = with_columns(art, token_ids=ids)
    result = sequence_check(forged.header, forged.positions, recommitted(req, forged))
    assert (result.reason, result.position) == (Reason.TOKENS_AFTER_STOP, at)
    ids = np.array(art.positions.token_ids)
    ids[at - 1 if at else 0, 4] = REQ.vocab_size  # ... and one before (or at) it
    forged = with_columns(art, token_ids=ids)
    result = sequence_check(forged.header, forged.positions, recommitted(req, forged))
    assert (result.reason, result.position) == (Reason.CANDIDATE_ID_OUT_OF_RANGE, at - 1 if at else 0)


def _scalar_termination(chosen: list[int], max_tokens: int, stops: frozenset[int]) -> tuple[Reason, int | None]:
    """The per-leaf spec (what the fraud proof applies) scanned over every position."""
    length = find_length_violation(len(chosen), max_tokens)
    if length is not Reason.OK:
        return length, None
    for p, c in enumerate(chosen):
        reason = find_termination_violation(p, c in stops, len(chosen), max_tokens)
        if reason is not Reason.OK:
            return reason, p
    return Reason.OK, None


@given(st.lists(st.integers(0, 6), max_size=12), st.integers(0, 14), st.frozensets(st.integers(0, 6), max_size=3))
def test_stage1_termination_equals_the_per_leaf_spec(chosen, max_tokens, stops):
    positions = make_positions(np.array(chosen, dtype=np.int64), np.zeros((len(chosen), 2), dtype=np.int64),
                               np.zeros((len(chosen), 2), dtype=np.int64), np.zeros((len(chosen), 2)))
    assert find_termination_position(positions, max_tokens, stops) == _scalar_termination(chosen, max_tokens, stops)

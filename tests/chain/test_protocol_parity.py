"""The contract computes what node.protocol computes: seeds, uniforms, reputation, the position rule, Merkle roots."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from web3 import Web3
from web3.providers.eth_tester import EthereumTesterProvider

from chain.contracts import Hub, HubConfig
from chain.deploy import deploy
from node.executer.synthetic import SyntheticRequest, make_synthetic_artifact
from node.protocol.artifact import compute_leaf_proof, compute_positions_root, encode_header, encode_leaf
from node.protocol.reputation import P_MAX_WAD, P_MIN_WAD, PRIOR_WAD, WAD, compute_posterior_wad
from node.protocol.sampler import SamplingParams
from node.protocol.seed import position_uniform, run_seed, sampler_uniform
from node.protocol.sequence import find_length_violation, find_position_violation, find_termination_violation
from tests.chain.conftest import funded_tester_accounts
from tests.node.protocol.strategies import requests

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def hub() -> Hub:
    w3 = Web3(EthereumTesterProvider())
    admin, treasury = funded_tester_accounts(w3, 2)
    return deploy(w3, admin, HubConfig(treasury=treasury.address))[0]


@SETTINGS
@given(user_seed=st.integers(0, 2**64 - 1), inference_id=st.integers(0, 2**256 - 1), i=st.integers(0, 2**32 - 1))
def test_run_seed_and_uniform_match(hub: Hub, user_seed: int, inference_id: int, i: int) -> None:
    seed = run_seed(user_seed, inference_id)
    assert bytes(hub.call_views("computeRunSeed", user_seed, inference_id)) == seed
    assert hub.call_views("computeSamplerUniform", seed, i) == sampler_uniform(position_uniform(seed, i))


@SETTINGS
@given(alpha=st.integers(1, WAD - 1), beta=st.integers(0, WAD - 1), verdicts=st.lists(st.booleans(), max_size=12),
       start=st.one_of(st.just(PRIOR_WAD), st.integers(P_MIN_WAD, P_MAX_WAD)))
def test_reputation_is_bit_identical_over_verdict_sequences(hub: Hub, alpha: int, beta: int, verdicts: list[bool],
                                                           start: int) -> None:
    p_chain = p_py = start
    for valid in verdicts:
        p_chain = hub.call_views("computePosterior", p_chain, alpha, beta, valid)
        p_py = compute_posterior_wad(p_py, alpha, beta, valid)
        assert p_chain == p_py


leaf_cases = st.integers(1, 6).flatmap(lambda k: st.tuples(
    st.just(k),
    st.lists(st.integers(0, 80), min_size=k, max_size=k),  # token ids, some >= vocab, some repeated
    st.lists(st.one_of(st.integers(0, 2**32 - 1), st.sampled_from([0, 2**30, 2**31, 2**32 - 1])), min_size=k,
             max_size=k),
    st.integers(0, 80),
    st.one_of(st.integers(0, 2**32 - 1), st.integers(2**32 - 70, 2**32 - 1)),
))


@SETTINGS
@given(case=leaf_cases, sort=st.booleans())
def test_position_rule_matches_the_scalar_spec(hub: Hub, case: tuple[int, list[int], list[int], int, int],
                                              sort: bool) -> None:
    k, tokens, weights, chosen, v = case
    if sort:  # mostly well-formed leaves, so the walk itself is exercised
        weights = sorted(weights, reverse=True)
        total = sum(weights)
        if total > 2**32:
            weights = [w * 2**32 // total for w in weights]
    vocab = 64
    leaf = (0).to_bytes(4, "big") + chosen.to_bytes(4, "big") + b"".join(
        t.to_bytes(4, "big") + w.to_bytes(4, "big") + b"\x00" * 4 for t, w in zip(tokens, weights, strict=True))
    want = find_position_violation(v, chosen, tokens, weights, vocab)
    assert hub.call_views("findPositionViolation", leaf, k, v, vocab) == int(want)


@SETTINGS
@given(request=requests, logits_seed=st.integers(0, 2**32 - 1), data=st.data())
def test_python_leaves_and_proofs_give_the_python_positions_root(hub: Hub, request, logits_seed: int, data) -> None:
    artifact = make_synthetic_artifact(request, logits_seed)
    if len(artifact.positions) == 0:
        return
    i = data.draw(st.integers(0, len(artifact.positions) - 1))
    root = hub.call_views("computePositionsRoot", encode_leaf(artifact.positions, i), compute_leaf_proof(artifact, i))
    assert bytes(root) == compute_positions_root(artifact.positions)


@SETTINGS
@given(position=st.integers(0, 2**32 - 1), is_stop=st.booleans(), n=st.integers(0, 2**32 - 1),
       m=st.integers(0, 2**32 - 1))
def test_the_termination_rule_matches(hub: Hub, position: int, is_stop: bool, n: int, m: int) -> None:
    small = (position % 10, is_stop, n % 10, m % 10)  # the interesting region, besides the extremes
    for args in ((position, is_stop, n, m), small):
        assert hub.call_views("findTerminationViolation", *args) == int(find_termination_violation(*args))
        assert hub.call_views("findLengthViolation", args[2], args[3]) == int(find_length_violation(args[2], args[3]))


def test_the_header_output_length_matches(hub: Hub) -> None:
    art = make_synthetic_artifact(SyntheticRequest(inference_id=5, user_seed=6, params=SamplingParams(1.0, 1.0, 0, 9),
                                                   output_length=9, prompt_token_ids=(1, 2, 3, 4)), 0)
    assert hub.call_views("decodeHeaderOutputLength", encode_header(art.header)) == 9

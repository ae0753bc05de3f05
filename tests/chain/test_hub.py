"""Whole inference lives driven from Python, on eth-tester (fast) and on a real anvil node."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest

from chain.contracts import ModelState, Status, Vote
from chain.eip712 import Verdict, compute_verdict_digest, recover_verdict_signer, sign_verdict
from chain.errors import ContractReverted
from node.errors import Reason
from node.protocol.artifact import Artifact, compute_leaf_proof, encode_header, encode_leaf
from node.protocol.hashing import keccak256
from node.protocol.reputation import PRIOR_WAD, compute_posterior_wad
from tests.chain.conftest import ALPHA, BETA, MODEL_ID, STOP_TOKENS, Net
from tests.chain.flows import (
    FEE,
    forge_position,
    honest_artifact,
    request_and_commit,
    signed_votes,
    stage1_failure_position,
    stage1_result,
)


@pytest.fixture(params=["eth-tester", "anvil"])
def net(request: pytest.FixtureRequest) -> Net:
    return request.getfixturevalue("tester_net" if request.param == "eth-tester" else "anvil_net")


def test_python_digest_equals_the_contract_digest(net: Net) -> None:
    verdict = Verdict(7, b"\x33" * 32, False, 504, b"\x44" * 32, 2**40)
    want = net.hub.verdict_digest(7, b"\x33" * 32, False, 504, b"\x44" * 32, 2**40)
    assert compute_verdict_digest(verdict, net.hub.chain_id(), net.hub.address) == want
    signature = sign_verdict(net.validators[0], verdict, net.hub.chain_id(), net.hub.address)
    assert recover_verdict_signer(verdict, signature, net.hub.chain_id(), net.hub.address) == net.validators[0].address
    # another chain id or contract gives another digest
    assert compute_verdict_digest(verdict, net.hub.chain_id() + 1, net.hub.address) != want


def test_a_valid_quorum_settles_and_pays(net: Net) -> None:
    inference_id, artifact, c = request_and_commit(net)
    checked, committee = net.hub.selection_of(inference_id)
    assert checked and 1 <= len(committee) <= 3
    votes = signed_votes(net, inference_id, artifact.root, valid=True)
    net.hub.submit_verdicts(net.requester, inference_id, c, votes)  # anyone may submit
    assert net.hub.get_inference(inference_id).status is Status.VALID
    share = FEE * 1000 // 10_000 // 3
    assert net.hub.credits(net.operator.address) == FEE - share * len(votes)
    assert net.hub.staker(net.operator.address).spoof_p == compute_posterior_wad(PRIOR_WAD, ALPHA, BETA, True)


def test_on_chain_reputation_follows_python_over_a_verdict_sequence(net: Net) -> None:
    net.hub.set_model_state(net.admin, MODEL_ID, ModelState.VERIFYING)  # no jail: every verdict counts
    p = PRIOR_WAD
    for valid in (False, True, True, False, True):
        inference_id, artifact, c = request_and_commit(net)
        net.hub.submit_verdicts(net.requester, inference_id, c, signed_votes(net, inference_id, artifact.root, valid))
        p = compute_posterior_wad(p, ALPHA, BETA, valid)
        assert net.hub.staker(net.operator.address).spoof_p == p


def test_a_double_vote_is_skipped_and_a_stranger_refused(net: Net) -> None:
    inference_id, artifact, c = request_and_commit(net)
    _, committee = net.hub.selection_of(inference_id)
    assert len(committee) == 3  # the minimum committee: never one judge by chance
    first = signed_votes(net, inference_id, artifact.root, True, count=1)
    net.hub.submit_verdicts(net.requester, inference_id, c, first)
    receipt = net.hub.submit_verdicts(net.requester, inference_id, c, first)  # idempotent: skipped, not fatal
    skipped = net.hub.contract.events.VoteSkipped().process_receipt(receipt)
    assert [(e["args"]["validator"], e["args"]["why"]) for e in skipped] == [(committee[0], 1)]
    assert net.hub.get_inference(inference_id).valid_votes == 1
    stranger = Verdict(inference_id, artifact.root, True, 0, b"\x00" * 32, 2**40)
    sig = sign_verdict(net.operator, stranger, net.hub.chain_id(), net.hub.address)
    with pytest.raises(ContractReverted) as err:
        net.hub.submit_verdicts(net.requester, inference_id, c, [Vote(True, 0, b"\x00" * 32, 2**40, sig)])
    assert err.value.error == "NotInCommittee" and err.value.args_ == (net.operator.address,)


def test_a_stage1_forgery_is_slashed_by_a_fraud_proof(net: Net) -> None:
    forged_at = 3

    def forged(inference_id: int):
        request, artifact = honest_artifact(inference_id)
        return request, forge_position(artifact, forged_at)

    inference_id, artifact, c = request_and_commit(net, forged)
    request, _ = honest_artifact(inference_id)
    assert stage1_failure_position(request, artifact) == forged_at  # the validator's stage 1 sees it too
    stake = net.hub.staker(net.operator.address).stake
    prover = net.validators[0]
    net.hub.prove_fraud(prover, inference_id, c, keccak256(encode_header(artifact.header)),
                        encode_leaf(artifact.positions, forged_at), compute_leaf_proof(artifact, forged_at))
    after = net.hub.staker(net.operator.address)
    assert after.stake == 0 and after.jailed
    assert net.hub.get_inference(inference_id).status is Status.FRAUD
    assert net.hub.credits(prover.address) >= stake // 10


def test_an_honest_leaf_cannot_be_proven_fraudulent(net: Net) -> None:
    inference_id, artifact, c = request_and_commit(net)
    request, _ = honest_artifact(inference_id)
    assert stage1_failure_position(request, artifact) is None
    header_hash = keccak256(encode_header(artifact.header))
    for i in range(len(artifact.positions)):
        with pytest.raises(ContractReverted) as err:
            net.hub.prove_fraud(net.validators[0], inference_id, c, header_hash, encode_leaf(artifact.positions, i),
                                compute_leaf_proof(artifact, i))
        assert err.value.error == "NotFraud" and err.value.args_ == (i,)


def test_reverts_come_back_typed(net: Net) -> None:
    with pytest.raises(ContractReverted) as err:
        net.hub.selection_of(999)
    assert err.value.error == "WrongStatus" and err.value.args_ == (999, 0)
    with pytest.raises(ContractReverted) as err:
        net.hub.commit_inference(net.requester, 999, request_and_commit(net)[2])
    assert err.value.error == "WrongStatus"


def test_anvil_stops_with_its_process_group(anvil) -> None:
    pid = anvil.process.pid
    anvil.stop()
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)


def test_a_truncated_output_is_slashed_by_a_termination_proof(net: Net) -> None:
    # an honest synthetic artifact of 8 tokens committed under max_tokens 64: shorter, and its last token is
    # not the registered stop token (2) — the cut answer of issue 15 finding 6, proven from the header + 1 leaf
    def truncated(inference_id: int):
        request, artifact = honest_artifact(inference_id)
        header = replace(artifact.header, max_tokens=64)
        return replace(request, params=replace(request.params, max_tokens=64)), Artifact(header, artifact.positions)

    inference_id, artifact, c = request_and_commit(net, truncated)
    last = len(artifact.positions) - 1
    assume_not_stop = int(artifact.positions.chosen[last]) not in STOP_TOKENS
    assert assume_not_stop, "the synthetic output does not end on the stop token"
    request, _ = truncated(inference_id)
    # the validator's own stage 1 sees it too
    assert stage1_result(request, artifact, STOP_TOKENS) == (Reason.NOT_TERMINATED, last)
    prover = net.validators[0]
    receipt = net.hub.prove_termination(prover, inference_id, c, encode_header(artifact.header), b"\x00" * 32,
                                        encode_leaf(artifact.positions, last), compute_leaf_proof(artifact, last))
    proven = net.hub.contract.events.FraudProven().process_receipt(receipt)[0]["args"]
    assert (proven["position"], proven["reason"]) == (last, int(Reason.NOT_TERMINATED))
    after = net.hub.staker(net.operator.address)
    assert after.stake == 0 and after.jailed and net.hub.get_inference(inference_id).status is Status.FRAUD


def test_an_honest_full_length_output_has_no_termination_proof(net: Net) -> None:
    inference_id, artifact, c = request_and_commit(net)  # runs to max_tokens: may end on anything
    last = len(artifact.positions) - 1
    with pytest.raises(ContractReverted) as err:
        net.hub.prove_termination(net.validators[0], inference_id, c, encode_header(artifact.header), b"\x00" * 32,
                                  encode_leaf(artifact.positions, last), compute_leaf_proof(artifact, last))
    assert err.value.error == "NotFraud"

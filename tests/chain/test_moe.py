"""The ExpertDuty module on a real anvil node: the draw mirrors node.protocol.moe, only assigned holders judge."""

from __future__ import annotations

import pytest
from web3 import Web3

from chain.contracts import Commitment, Params
from chain.errors import ContractReverted
from chain.moe import DutyResult, ExpertVote, MoeOpening, compute_expert_digest, deploy_expert_duty, sign_expert_vote
from node.protocol.hashing import keccak256
from node.protocol.moe import (
    ROUTER,
    SHARED,
    ExpertKey,
    Holder,
    MoeReason,
    compute_covered_assignment,
    compute_duty_key,
    compute_duty_randomness,
    compute_moe_fingerprint_hash,
    compute_used_experts,
    parse_duty_key,
)
from tests.chain.conftest import MODEL_ID, Net
from tests.chain.flows import FEE, USER_SEED, honest_artifact
from tests.node.protocol.test_moe import make_commitment

LAYERS, EXPERTS = 2, 4
DENSE_FP = keccak256(b"fingerprints")


def holdings() -> list[frozenset[ExpertKey] | None]:
    """vals[0] the whole model; vals[1] layer 0's experts and the routers; vals[2] layer 1's, the routers, the link."""
    routers = {ExpertKey(L, ROUTER) for L in range(LAYERS)}
    return [None,
            frozenset({ExpertKey(0, e) for e in range(EXPERTS)} | routers),
            frozenset({ExpertKey(1, e) for e in range(EXPERTS)} | routers | {ExpertKey(0, SHARED)})]


def test_the_chain_draws_what_the_protocol_draws_and_a_failed_expert_slashes_once(anvil_net: Net) -> None:
    net = anvil_net
    ed = deploy_expert_duty(net.w3, net.admin, net.hub, per_duty=2)
    ed.set_shape(net.admin, MODEL_ID, LAYERS, EXPERTS)
    for account, holds in zip(net.validators, holdings(), strict=True):
        ed.declare_holdings(account, MODEL_ID, None if holds is None else sorted(compute_duty_key(k) for k in holds))
    net.mine(1)

    moe = make_commitment(layers=LAYERS, experts=EXPERTS)
    inference_id = net.hub.call("nextInferenceId") + 1
    _, artifact = honest_artifact(inference_id)
    h = artifact.header
    got = net.hub.request_inference(net.requester, net.operator.address, MODEL_ID, keccak256(b"prompt"), USER_SEED,
                                    Params(h.temperature_bits, h.top_p_bits, h.top_k, h.max_tokens), FEE)
    assert got == inference_id
    output_hash = keccak256(b"output")
    net.hub.commit_inference(net.operator, inference_id,
                             Commitment(output_hash, artifact.root, compute_moe_fingerprint_hash(DENSE_FP, moe.root())))
    net.mine(2)
    router_root, counts, roots = moe.opening()
    opening = MoeOpening(output_hash, artifact.root, DENSE_FP, router_root, tuple(counts), tuple(roots))

    forged = MoeOpening(output_hash, artifact.root, DENSE_FP, router_root, (0, *counts[1:]), tuple(roots))
    with pytest.raises(ContractReverted) as info:
        ed.assign_duties(net.requester, inference_id, forged)
    assert info.value.error == "CommitmentMismatch"

    ed.assign_duties(net.requester, inference_id, opening)
    opened = ed.opened(inference_id)
    assert opened.moe_root == moe.root()
    duties = compute_used_experts(moe)
    assert opened.duties == len(duties) and opened.uncovered == 0

    # the same draw in Python: weights at the block before the commit, randomness from the hub's seed
    commit_block = net.hub.get_inference(inference_id).commit_block
    holders = [Holder(bytes.fromhex(a.address[2:]), net.hub.call("weightAt", a.address, commit_block - 1), holds)
               for a, holds in zip(net.validators, holdings(), strict=True)]
    randomness = compute_duty_randomness(bytes(net.hub.call("selectionSeed", inference_id)))
    want, uncovered = compute_covered_assignment(randomness, duties, holders, 2)
    assert uncovered == []
    drawn = ed.assignments(inference_id)  # the lazy draws, read as views (a set of validators per duty)
    assert {parse_duty_key(k): sorted(v) for k, v in drawn.items()} == \
        {k: sorted(Web3.to_checksum_address(a) for a in v) for k, v in want.items()}, \
        "the chain mirrors the protocol draw"
    for v in net.validators:  # each validator's duties in one view: exactly the draws naming it
        assert sorted(parse_duty_key(d) for d in ed.duties_of(inference_id, v.address)) == \
            sorted(k for k, a in want.items() if v.address in [Web3.to_checksum_address(x) for x in a])
    for key, addresses in want.items():
        assert sorted(ed.assigned_to(inference_id, compute_duty_key(key))) == \
            sorted(Web3.to_checksum_address(a) for a in addresses)

    chain_id = net.hub.chain_id()
    target = next(k for k in duties if k.layer == 1 and k.expert < EXPERTS)  # a routed expert of layer 1
    duty = compute_duty_key(target)
    scores = keccak256(b"scores")
    assert compute_expert_digest(chain_id, ed.address, inference_id, duty, moe.root(), False, 903, scores) == \
        ed.verdict_digest(inference_id, duty, moe.root(), False, 903, scores)
    by_address = {a.address: a for a in net.validators}
    assigned = [by_address[a] for a in ed.assigned_to(inference_id, duty)]
    outsider = next(a for a in net.validators if a not in assigned)

    def vote(account_index: int | None, valid: bool) -> ExpertVote:
        account = outsider if account_index is None else assigned[account_index]
        return sign_expert_vote(account, chain_id, ed.address, inference_id, duty, moe.root(), valid,
                                0 if valid else int(MoeReason.EXPERT_FINGERPRINT_MISMATCH), scores)

    with pytest.raises(ContractReverted) as info:
        ed.submit_verdicts(net.requester, inference_id, [vote(None, False)])
    assert info.value.error == "NotAssignedTo"
    stake_before = net.hub.call("stakers", net.operator.address)[0]
    ed.submit_verdicts(net.requester, inference_id, [vote(0, False)])
    assert ed.duty_result(inference_id, duty) is DutyResult.OPEN, "one of two assigned holders decides nothing"
    assert net.hub.call("stakers", net.operator.address)[0] == stake_before
    ed.submit_verdicts(net.requester, inference_id, [vote(1, False)])
    assert ed.duty_result(inference_id, duty) is DutyResult.FAILED
    staker = net.hub.call("stakers", net.operator.address)
    assert staker[0] == stake_before // 2, "the hub's slashBps (50 %)"
    assert staker[6] is True, "jailed"
    assert ed.opened(inference_id).slashed
    with pytest.raises(ContractReverted) as info:
        ed.assign_duties(net.requester, inference_id, opening)
    assert info.value.error == "AlreadyAssigned"


def test_a_duty_with_too_few_holders_at_the_commit_stays_uncovered_as_in_the_protocol(anvil_net: Net) -> None:
    net = anvil_net
    ed = deploy_expert_duty(net.w3, net.admin, net.hub, per_duty=2)
    ed.set_shape(net.admin, MODEL_ID, LAYERS, EXPERTS)
    before = [*holdings()[:2], frozenset()]  # vals[2] holds nothing yet
    for account, holds in zip(net.validators, before, strict=True):
        ed.declare_holdings(account, MODEL_ID, None if holds is None else sorted(compute_duty_key(k) for k in holds))
    net.mine(1)
    moe = make_commitment(seed=3, layers=LAYERS, experts=EXPERTS)
    inference_id = net.hub.call("nextInferenceId") + 1
    _, artifact = honest_artifact(inference_id)
    h = artifact.header
    net.hub.request_inference(net.requester, net.operator.address, MODEL_ID, keccak256(b"prompt"), USER_SEED,
                              Params(h.temperature_bits, h.top_p_bits, h.top_k, h.max_tokens), FEE)
    output_hash = keccak256(b"output")
    net.hub.commit_inference(net.operator, inference_id,
                             Commitment(output_hash, artifact.root, compute_moe_fingerprint_hash(DENSE_FP, moe.root())))
    ed.declare_holdings(net.validators[2], MODEL_ID, None)  # after the commit: does not count for it
    net.mine(2)
    router_root, counts, roots = moe.opening()
    opening = MoeOpening(output_hash, artifact.root, DENSE_FP, router_root, tuple(counts), tuple(roots))
    receipt = ed.assign_duties(net.requester, inference_id, opening)
    commit_block = net.hub.get_inference(inference_id).commit_block
    holders = [Holder(bytes.fromhex(a.address[2:]), net.hub.call("weightAt", a.address, commit_block - 1), holds)
               for a, holds in zip(net.validators, before, strict=True)]
    randomness = compute_duty_randomness(bytes(net.hub.call("selectionSeed", inference_id)))
    want, uncovered = compute_covered_assignment(randomness, compute_used_experts(moe), holders, 2)
    assert uncovered, "layer 1's experts and the link have one holder"
    assert ed.opened(inference_id).uncovered == len(uncovered)
    events = ed.get_events("DutyUncovered", int(receipt["blockNumber"]))
    assert sorted(parse_duty_key(int(e["args"]["duty"])) for e in events) == uncovered
    drawn = ed.assignments(inference_id)
    assert {parse_duty_key(k): sorted(v) for k, v in drawn.items()} == \
        {k: sorted(Web3.to_checksum_address(a) for a in v) for k, v in want.items()}


def test_the_event_stream_decodes_module_events_whose_argument_is_named_keys(anvil_net: Net) -> None:
    """HoldingsDeclared(…, uint32[] keys): a web3 AttributeDict's .keys() is shadowed by that argument."""
    from chain.events import EventStream, MemoryCursor

    net = anvil_net
    ed = deploy_expert_duty(net.w3, net.admin, net.hub, per_duty=2)
    ed.set_shape(net.admin, MODEL_ID, LAYERS, EXPERTS)
    keys = sorted(compute_duty_key(ExpertKey(0, e)) for e in range(2))
    ed.declare_holdings(net.validators[0], MODEL_ID, keys)
    stream = EventStream(net.w3, ed.contract, MemoryCursor(), confirmations=0)
    events, reorg = stream.poll()
    declared = [e for e in events if e.name == "HoldingsDeclared"]
    assert reorg is None and len(declared) == 1
    assert list(declared[0].args["keys"]) == keys
    assert declared[0].args["validator"] == net.validators[0].address

"""The ExpertDuty module on a real anvil node: the draw from every settled validator mirrors node.protocol.moe."""

from __future__ import annotations

import dataclasses

import pytest
from web3 import Web3

from chain.contracts import Commitment, Params, Role
from chain.devnet import dev_account
from chain.errors import ContractReverted
from chain.moe import DutyResult, ExpertVote, MoeOpening, compute_expert_digest, deploy_expert_duty, sign_expert_vote
from node.protocol.hashing import keccak256
from node.protocol.moe import (
    ExpertKey,
    Holder,
    InvalidMoe,
    MoeCommitment,
    MoeReason,
    compute_duty_key,
    compute_duty_randomness,
    compute_expert_assignment,
    compute_moe_fingerprint_hash,
    compute_settled_weight,
    compute_used_experts,
    parse_duty_key,
)
from tests.chain.conftest import MODEL_ID, Net
from tests.chain.flows import FEE, USER_SEED, honest_artifact
from tests.node.protocol.test_moe import make_commitment

LAYERS, EXPERTS = 2, 4
DENSE_FP = keccak256(b"fingerprints")


WEIGHT_DELAY = 3


def _commit(net: Net, seed: int = 0) -> tuple[int, MoeOpening, MoeCommitment]:
    """Request and commit an MoE inference of a synthetic commitment; return (id, its opening, the commitment)."""
    moe = make_commitment(seed=seed, layers=LAYERS, experts=EXPERTS)
    inference_id = net.hub.call("nextInferenceId") + 1
    _, artifact = honest_artifact(inference_id)
    h = artifact.header
    got = net.hub.request_inference(net.requester, net.operator.address, MODEL_ID, keccak256(b"prompt"), USER_SEED,
                                    Params(h.temperature_bits, h.top_p_bits, h.top_k, h.max_tokens), FEE)
    assert got == inference_id
    output_hash = keccak256(b"output")
    net.hub.commit_inference(net.operator, inference_id,
                             Commitment(output_hash, artifact.root, compute_moe_fingerprint_hash(DENSE_FP, moe.root())))
    router_root, counts, roots = moe.opening()
    return inference_id, MoeOpening(output_hash, artifact.root, DENSE_FP, router_root, tuple(counts),
                                    tuple(roots)), moe


def test_the_chain_draws_what_the_protocol_draws_from_every_settled_validator(anvil_net: Net) -> None:
    net = anvil_net
    ed = deploy_expert_duty(net.w3, net.admin, net.hub, per_duty=2, weight_delay=WEIGHT_DELAY)
    ed.set_shape(net.admin, MODEL_ID, LAYERS, EXPERTS)
    ed.declare_holdings(net.validators[0], MODEL_ID, [compute_duty_key(ExpertKey(0, 0))])  # a hint: narrows nothing
    net.hub.bond(net.validators[1], Role.VALIDATOR, 2 * 10**18)  # unequal settled stakes: 5, 7, 5 ETH
    net.mine(WEIGHT_DELAY + 1)
    newcomer = dev_account(7)
    net.hub.bond(newcomer, Role.VALIDATOR, 100 * 10**18)  # within the delay before the commit: drawn for nothing
    net.hub.bond(net.validators[2], Role.VALIDATOR, 100 * 10**18)  # a top-up within the delay: counts 5 ETH
    inference_id, opening, moe = _commit(net)
    net.mine(2)

    forged = dataclasses.replace(opening, counts=(0, *opening.counts[1:]))
    with pytest.raises(ContractReverted) as info:
        ed.assign_duties(net.requester, inference_id, forged)
    assert info.value.error == "CommitmentMismatch"

    ed.assign_duties(net.requester, inference_id, opening)
    opened = ed.opened(inference_id)
    assert opened.moe_root == moe.root()
    duties = compute_used_experts(moe)
    assert opened.duties == len(duties) and opened.failed == 0

    # the same draw in Python: settled weights at the block before the commit, randomness from the hub's seed
    b = net.hub.get_inference(inference_id).commit_block - 1
    everyone = [*net.validators, newcomer]
    holders = [Holder(bytes.fromhex(a.address[2:]), compute_settled_weight(
        net.hub.call("weightAt", a.address, b - WEIGHT_DELAY), net.hub.call("weightAt", a.address, b)))
        for a in everyone]
    assert [h.stake for h in holders] == [5 * 10**18, 7 * 10**18, 5 * 10**18, 0]
    assert [ed.settled_weight_at(a.address, b) for a in everyone] == [h.stake for h in holders]
    randomness = compute_duty_randomness(bytes(net.hub.call("selectionSeed", inference_id)))
    want = compute_expert_assignment(randomness, duties, holders, 2)
    drawn = ed.assignments(inference_id)  # the lazy draws, read as views (a set of validators per duty)
    assert {parse_duty_key(k): sorted(v) for k, v in drawn.items()} == \
        {k: sorted(Web3.to_checksum_address(a) for a in v) for k, v in want.items()}, \
        "the chain mirrors the protocol draw"
    for v in everyone:  # each validator's duties in one view: exactly the draws naming it
        assert sorted(parse_duty_key(d) for d in ed.duties_of(inference_id, v.address)) == \
            sorted(k for k, a in want.items() if v.address in [Web3.to_checksum_address(x) for x in a])
    assert ed.duties_of(inference_id, newcomer.address) == []
    judged = {Web3.to_checksum_address(a) for v in want.values() for a in v}
    assert judged == {a.address for a in net.validators}, "every settled validator judges, whatever it declared"

    chain_id = net.hub.chain_id()
    target = next(k for k in duties if k.layer == 1 and k.expert < EXPERTS)  # a routed expert of layer 1
    duty = compute_duty_key(target)
    scores = keccak256(b"scores")
    assert compute_expert_digest(chain_id, ed.address, inference_id, duty, moe.root(), False, 903, scores) == \
        ed.verdict_digest(inference_id, duty, moe.root(), False, 903, scores)
    by_address = {a.address: a for a in everyone}
    assigned = [by_address[a] for a in ed.assigned_to(inference_id, duty)]
    outsider = next(a for a in everyone if a not in assigned)

    def vote(account_index: int | None, valid: bool) -> ExpertVote:
        account = outsider if account_index is None else assigned[account_index]
        return sign_expert_vote(account, chain_id, ed.address, inference_id, duty, moe.root(), valid,
                                0 if valid else int(MoeReason.EXPERT_FINGERPRINT_MISMATCH), scores)

    with pytest.raises(ContractReverted) as info:
        ed.submit_verdicts(net.requester, inference_id, [vote(None, False)])
    assert info.value.error == "NotAssignedTo"
    stake_before = net.hub.staker(net.operator.address).stake
    ed.submit_verdicts(net.requester, inference_id, [vote(0, False)])
    assert ed.duty_result(inference_id, duty) is DutyResult.OPEN, "one of two drawn judges decides nothing"
    ed.submit_verdicts(net.requester, inference_id, [vote(1, False)])
    assert ed.duty_result(inference_id, duty) is DutyResult.FAILED
    assert ed.opened(inference_id).failed == 1
    staker = net.hub.staker(net.operator.address)
    assert staker.stake == stake_before and not staker.jailed, "the module slashes no one: the hub committee does"
    with pytest.raises(ContractReverted) as info:
        ed.assign_duties(net.requester, inference_id, opening)
    assert info.value.error == "AlreadyAssigned"


def test_too_few_settled_validators_make_the_open_revert_as_in_the_protocol(anvil_net: Net) -> None:
    net = anvil_net
    ed = deploy_expert_duty(net.w3, net.admin, net.hub, weight_delay=10_000)  # nobody's stake stood that long
    ed.set_shape(net.admin, MODEL_ID, LAYERS, EXPERTS)
    inference_id, opening, moe = _commit(net, seed=3)
    net.mine(2)
    with pytest.raises(ContractReverted) as info:
        ed.assign_duties(net.requester, inference_id, opening)
    assert info.value.error == "Uncoverable"
    with pytest.raises(InvalidMoe) as protocol:
        compute_expert_assignment(bytes(32), compute_used_experts(moe), [Holder(bytes(20), 0)], 3)
    assert protocol.value.moe_reason is MoeReason.ASSIGNMENT_UNCOVERED
    assert ed.opened(inference_id).commit_block == 0


def test_the_event_stream_decodes_module_events_whose_argument_is_named_keys(anvil_net: Net) -> None:
    """HoldingsDeclared(…, uint32[] keys): a web3 AttributeDict's .keys() is shadowed by that argument."""
    from chain.events import EventStream, MemoryCursor

    net = anvil_net
    ed = deploy_expert_duty(net.w3, net.admin, net.hub)
    ed.set_shape(net.admin, MODEL_ID, LAYERS, EXPERTS)
    keys = sorted(compute_duty_key(ExpertKey(0, e)) for e in range(2))
    ed.declare_holdings(net.validators[0], MODEL_ID, keys)
    stream = EventStream(net.w3, ed.contract, MemoryCursor(), confirmations=0)
    events, reorg = stream.poll()
    declared = [e for e in events if e.name == "HoldingsDeclared"]
    assert reorg is None and len(declared) == 1
    assert list(declared[0].args["keys"]) == keys
    assert declared[0].args["validator"] == net.validators[0].address

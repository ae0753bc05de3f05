"""The SpotCheck module on a real anvil node: digests agree, a supermajority fails a window, the hub slashes."""

from __future__ import annotations

import pytest

from chain.contracts import WEIGHT_DELAY
from chain.errors import ContractReverted
from chain.spotcheck import WindowResult, WindowVote, compute_window_digest, deploy_spotcheck, sign_window_vote
from tests.chain.conftest import Net

RUN = b"\x01" * 32
WINDOW = b"\x02" * 32
ROOT = b"\x03" * 32
POLICY = b"\x04" * 32


def test_a_failed_window_slashes_and_jails_the_operator_once_and_a_passed_one_costs_nothing(anvil_net: Net) -> None:
    net = anvil_net
    sc = deploy_spotcheck(net.w3, net.admin, net.hub)
    chain_id = net.hub.chain_id()
    net.mine(WEIGHT_DELAY)  # the validators' stake has settled before the opening (StakeQuorum.weightDelay)
    sc.open_run(RUN, net.operator)
    net.mine(1)
    op = net.operator.address
    assert compute_window_digest(chain_id, sc.address, op, RUN, WINDOW, ROOT, False, 800, POLICY) == \
        sc.verdict_digest(op, RUN, WINDOW, ROOT, False, 800, POLICY)

    def vote(i: int, window: bytes, valid: bool, reason: int) -> WindowVote:
        return sign_window_vote(net.validators[i], chain_id, sc.address, op, RUN, window, valid, reason, ROOT, POLICY)

    stake_before = net.hub.call("stakers", op)[0]
    sc.submit_votes(op, RUN, WINDOW, [vote(0, WINDOW, False, 800)], net.requester)
    assert sc.window_result(op, RUN, WINDOW) is WindowResult.OPEN, "one validator of three decides nothing"
    sc.submit_votes(op, RUN, WINDOW, [vote(0, WINDOW, False, 800)], net.requester)  # a relayed repeat is skipped
    assert sc.window_result(op, RUN, WINDOW) is WindowResult.OPEN
    assert net.hub.call("stakers", op)[0] == stake_before

    passed = b"\x05" * 32
    sc.submit_votes(op, RUN, passed, [vote(i, passed, True, 0) for i in range(2)], net.requester)
    assert sc.window_result(op, RUN, passed) is WindowResult.PASSED
    assert net.hub.call("stakers", op)[0] == stake_before, "a passed window costs nothing"

    sc.submit_votes(op, RUN, WINDOW, [vote(1, WINDOW, False, 801)], net.requester)
    assert sc.window_result(op, RUN, WINDOW) is WindowResult.FAILED
    staker = net.hub.call("stakers", op)
    assert staker[0] == stake_before // 2, "the hub's slashBps (50 %)"
    assert staker[6] is True, "jailed"
    with pytest.raises(ContractReverted) as info:
        sc.submit_votes(op, RUN, WINDOW, [vote(2, WINDOW, True, 0)], net.requester)
    assert info.value.error == "AlreadySettled"


def test_votes_from_outside_the_validator_set_and_runs_nobody_opened_are_refused(anvil_net: Net) -> None:
    net = anvil_net
    sc = deploy_spotcheck(net.w3, net.admin, net.hub)
    chain_id = net.hub.chain_id()
    op = net.operator.address
    forged = sign_window_vote(net.requester, chain_id, sc.address, op, RUN, WINDOW, False, 800, ROOT, POLICY)
    with pytest.raises(ContractReverted) as info:
        sc.submit_votes(op, RUN, WINDOW, [forged], net.requester)
    assert info.value.error == "NoSuchRun"
    sc.open_run(RUN, net.operator)
    net.mine(1)
    with pytest.raises(ContractReverted) as info:
        sc.submit_votes(op, RUN, WINDOW, [forged], net.requester)
    assert info.value.error == "NotAValidator"
    with pytest.raises(ContractReverted) as info:
        sc.open_run(RUN, net.validators[0])
    assert info.value.error == "NotAnOperator"

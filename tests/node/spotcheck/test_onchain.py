"""Window verdicts as SpotCheck votes: recorded before signing, signed in the module's domain, settled on anvil."""

import pytest
from eth_account import Account
from eth_account.messages import encode_typed_data

from chain.spotcheck import compute_window_typed_data
from node.spotcheck.devnet import (
    OPERATOR_STAKE,
    DeviceVotes,
    get_outcomes,
    is_chain_ok,
    open_devnet,
    process_open_runs,
    process_votes,
)
from node.spotcheck.onchain import (
    SpotReason,
    compute_run_key,
    compute_window_id,
    get_reason,
    process_sign_window,
    to_window_decision,
)
from node.spotcheck.verify import SpotcheckPolicy, WindowMeasurement, WindowVerdict
from node.store.leveldb import ConflictingVerdict, Store

CONTRACT = "0x" + "11" * 20
OPERATOR = "0x" + "22" * 20
POLICY = SpotcheckPolicy(x_ms=400, capacity_slack_bytes=16384)


def measurement(device: str = "evict-10pct", window: int = 0, wrong_labels: int = 1) -> WindowMeasurement:
    return WindowMeasurement(device, window, 20, 10, 10, 0, 0, 0, wrong_labels, 0, 0, (5.0,) * 20, (0,) * 10,
                             64 << 20, 64 << 20, (64 << 20) - 16384)


def failed(device: str = "evict-10pct", window: int = 0) -> WindowVerdict:
    return WindowVerdict(device, window, False, ("late", "wrong_labels"))


def passed(device: str, window: int = 0) -> WindowVerdict:
    return WindowVerdict(device, window, True, ())


def test_a_window_vote_is_recorded_before_it_is_signed_and_recovers_in_the_module_domain(tmp_path):
    decision = to_window_decision(failed(), measurement(), POLICY, "run-1")
    assert not decision.valid and decision.reason == SpotReason.WRONG_LABELS == 800
    assert decision.window_key == compute_window_id("run-1", "evict-10pct", 0).to_bytes(32, "big")
    validator = Account.create()
    with Store(tmp_path, 31337, CONTRACT) as store:
        vote = process_sign_window(store, validator, 31337, CONTRACT, OPERATOR, decision)
        typed = compute_window_typed_data(31337, CONTRACT, OPERATOR, decision.run_key, decision.window_key,
                                          decision.measurement_root, False, 800, decision.policy_digest)
        assert Account.recover_message(encode_typed_data(full_message=typed), signature=vote.signature) == (
            validator.address)
        again = process_sign_window(store, validator, 31337, CONTRACT, OPERATOR, decision)
        assert again == vote  # the same decision re-signs to the same vote
        flipped = to_window_decision(passed("evict-10pct"), measurement(wrong_labels=0), POLICY, "run-1")
        with pytest.raises(ConflictingVerdict):
            process_sign_window(store, validator, 31337, CONTRACT, OPERATOR, flipped)  # never two decisions


def test_window_and_run_ids_separate_runs_devices_and_windows():
    ids = {compute_window_id(r, d, w) for r in ("a", "b") for d in ("x", "y") for w in (0, 1)}
    assert len(ids) == 8 and all(i < 2**256 for i in ids)
    assert compute_run_key("a") != compute_run_key("b") and len(compute_run_key("a")) == 32
    assert get_reason(WindowVerdict("d", 0, True, ())) is SpotReason.OK
    assert get_reason(WindowVerdict("d", 0, False, ("missing", "late"))) is SpotReason.LATE
    assert get_reason(WindowVerdict("d", 0, False, ("idle_capacity",))) is SpotReason.IDLE_CAPACITY == 808
    assert get_reason(WindowVerdict("d", 0, False, ("fabricated_step",))) is SpotReason.FABRICATED_STEP == 809
    # wrong answers before capacity before timing
    assert get_reason(WindowVerdict("d", 0, False, ("late", "idle_capacity", "fabricated_step"))) is (
        SpotReason.FABRICATED_STEP)
    assert get_reason(WindowVerdict("d", 0, False, ("late", "idle_capacity"))) is SpotReason.IDLE_CAPACITY


def test_spot_reasons_share_the_code_space_of_reason():
    from node.protocol.errors import Reason

    for r in SpotReason:
        if r is not SpotReason.OK:
            assert Reason(int(r)).name == f"SPOT_{r.name}"


def test_three_validators_vote_on_anvil_and_only_the_cheaters_operator_is_slashed(tmp_path):
    devices = ("honest", "cheater")
    with open_devnet(devices) as devnet:
        stakes = process_open_runs(devnet, "run-1")
        assert stakes == {d: OPERATOR_STAKE for d in devices}
        decisions = [DeviceVotes("honest", tuple(measurement("honest", w, 0) for w in (0, 1)),
                                 (passed("honest", 0), passed("honest", 1))),
            DeviceVotes("cheater", tuple(measurement("cheater", w) for w in (0, 1)),
                        (failed("cheater", 0), failed("cheater", 1)))]
        sent = [process_votes(devnet, v, decisions, POLICY, "run-1", tmp_path / v.address)
                for v in devnet.validators]
        assert sent == [4, 4, 0], "two votes settle each window; the third validator has nothing left to count"
        outcomes = {o.device_id: o for o in get_outcomes(devnet, "run-1", stakes, {
            "honest": decisions[0].verdicts, "cheater": decisions[1].verdicts})}
        assert outcomes["cheater"].windows == (2, 2) and outcomes["cheater"].jailed
        assert outcomes["cheater"].stake_after == OPERATOR_STAKE // 2, "slashed once per run (the hub's 50 %)"
        assert outcomes["honest"].windows == (1, 1) and not outcomes["honest"].slashed
        assert not outcomes["honest"].jailed
        assert is_chain_ok(tuple(outcomes.values()), {"honest": False, "cheater": True})
        assert not is_chain_ok(tuple(outcomes.values()), {"honest": True, "cheater": True})

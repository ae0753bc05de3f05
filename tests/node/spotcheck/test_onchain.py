"""A failed window goes through the existing EIP-712 signer and the slashing-protection store unchanged."""

import pytest
from eth_account import Account

from chain.eip712 import recover_verdict_signer, sign_verdict
from node.spotcheck.onchain import SpotReason, compute_window_id, get_reason, to_verdict, to_verdict_record
from node.spotcheck.verify import SpotcheckPolicy, WindowMeasurement, WindowVerdict
from node.store.leveldb import ConflictingVerdict, Store

CONTRACT = "0x" + "11" * 20
POLICY = SpotcheckPolicy(x_ms=400, capacity_slack_bytes=16384)


def measurement(wrong_labels: int = 1) -> WindowMeasurement:
    return WindowMeasurement("evict-10pct", 0, 20, 10, 10, 0, 0, wrong_labels, 0, 0, (5.0,) * 20, (0,) * 10,
                             64 << 20, 64 << 20, (64 << 20) - 16384)


def test_a_failed_window_signs_and_recovers_like_an_inference_verdict(tmp_path):
    failed = WindowVerdict("evict-10pct", 0, False, ("late", "wrong_labels"))
    verdict = to_verdict(failed, measurement(), POLICY, "run-1", deadline=10**9)
    assert not verdict.valid and verdict.reason == SpotReason.WRONG_LABELS == 800
    account = Account.create()
    signature = sign_verdict(account, verdict, 31337, CONTRACT)
    assert recover_verdict_signer(verdict, signature, 31337, CONTRACT) == account.address
    with Store(tmp_path, 31337, CONTRACT) as store:
        assert store.record_verdict(to_verdict_record(verdict)).valid is False
        passed = to_verdict(WindowVerdict("evict-10pct", 0, True, ()), measurement(0), POLICY, "run-1", 10**9)
        with pytest.raises(ConflictingVerdict):
            store.record_verdict(to_verdict_record(passed))  # never two decisions for one window


def test_window_ids_separate_runs_devices_and_windows():
    ids = {compute_window_id(r, d, w) for r in ("a", "b") for d in ("x", "y") for w in (0, 1)}
    assert len(ids) == 8 and all(i < 2**256 for i in ids)
    assert get_reason(WindowVerdict("d", 0, True, ())) is SpotReason.OK
    assert get_reason(WindowVerdict("d", 0, False, ("missing", "late"))) is SpotReason.LATE


def test_spot_reasons_share_the_code_space_of_reason():
    from node.protocol.errors import Reason

    for r in SpotReason:
        if r is not SpotReason.OK:
            assert Reason(int(r)).name == f"SPOT_{r.name}"

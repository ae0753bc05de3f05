"""The training devnet end to end (tiny llama): anvil, three auditor processes, the honest run and both cheaters."""

import pytest

from node.protocol.ledger import TrainingReason


@pytest.mark.e2e
def test_the_devnet_slashes_both_cheaters_and_the_honest_run_keeps_its_bond(tmp_path):
    from node.training.devnet import BOND, get_devnet_plan, run_devnet

    summary = run_devnet(tmp_path, get_devnet_plan("tiny"), timeout_s=900.0, k=1)
    runs = summary["final"]["runs"]
    assert summary["ok"], runs
    assert not runs["honest"]["slashed"] and runs["honest"]["bond"] == BOND
    assert all(a["valid"] for a in runs["honest"]["audits"]), runs["honest"]["audits"]
    hidden = [a for a in runs["hidden-state"]["audits"] if not a["valid"]]
    assert runs["hidden-state"]["slashed"] and runs["hidden-state"]["bond"] == 0
    assert [a["reason"] for a in hidden] == [int(TrainingReason.STATE_ROOT_MISMATCH)], hidden
    assert runs["cheater"]["slashed"] and summary["nonce_replay"] == "NonceReplayed"

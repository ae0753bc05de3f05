"""Durable jobs and known votes in the node's LevelDB (issue 15, findings 3 and 7)."""

from __future__ import annotations

from pathlib import Path

import pytest

from node.store.leveldb import Store

CONTRACT = "0x5FbDB2315678afecb367f032d93F642f64180aa3"
A, B = "0x90F79bf6EB2c4f870365E785982E1f101E93b906", "0x9965507D1a55bcC2695C58ba16FB37d819B0A4dc"


def test_a_job_moves_through_its_states_and_survives_a_restart(tmp_path: Path) -> None:
    with Store(tmp_path, 31337, CONTRACT) as store:
        assert store.add_job(7, {"job": 1})
        assert not store.add_job(7, {"job": 2})  # a re-delivered event does not reset it
        store.move_job(7, "verified", {"job": 1, "record": "r"})
        assert not store.add_job(7, {"job": 3})
    with Store(tmp_path, 31337, CONTRACT) as store:
        assert store.get_job(7) == ("verified", {"job": 1, "record": "r"})
        assert store.jobs("pending") == [] and store.jobs("verified") == [(7, {"job": 1, "record": "r"})]
        store.move_job(7, "submitted", {"job": 1})
        assert [s for s in ("pending", "verified", "submitted") if store.jobs(s)] == ["submitted"]
        with pytest.raises(ValueError):
            store.move_job(7, "done", {})
        store.finish_job(7)
        assert store.get_job(7) is None
        assert not store.add_job(7, {"job": 4})  # finished for good


def test_votes_are_kept_per_signer_until_the_inference_is_forgotten(tmp_path: Path) -> None:
    with Store(tmp_path, 31337, CONTRACT) as store:
        assert store.put_vote(7, A, {"valid": True})
        assert not store.put_vote(7, A, {"valid": False})  # the first one stays
        assert store.put_vote(7, B, {"valid": True})
        assert store.put_vote(8, A, {"valid": True})
        store.add_job(7, {"job": 1})
    with Store(tmp_path, 31337, CONTRACT) as store:
        assert store.votes(7) == {A: {"valid": True}, B: {"valid": True}}
        assert store.voted_inferences() == [7, 8]
        store.finish_job(7)
        assert store.votes(7)  # the votes wait for the inference to settle
        store.forget_inference(7)
        assert store.votes(7) == {} and store.voted_inferences() == [8] and store.get_job(7) is None
        with pytest.raises(ValueError):
            store.put_vote(9, "0x1234", {})

"""Issue 30, finding 1: the hidden-state cheats against the real gloo job, and the state root that catches them.

The cheater continues from a cheated Z(s) — trained on undeclared data, or stolen weights swapped in at step 1 —
whose named positions it restored to the honest update's values; it logs the declared batch's sketches and loss,
serves the honest Z(s) to an audit of s and the cheated Z(s) as "before s+1" to an audit of s+1. With the named
positions alone (the checks before issue 30) every audit passes; the ledger's state root catches each cheated step.
"""

import numpy as np
import pytest
import torch

from node.protocol.ledger import TrainingReason
from node.training import auditor
from node.training.auditor import load_tolerance
from node.training.calibration import audit_job, run_audited_job
from node.training.job import Cheat
from node.training.report import compute_stolen_init
from node.training.spec import RunSpec

SPEC = RunSpec(steps=16, anchor_every=4, keep_checkpoints=8)
STOLEN_AT, UNDECLARED = 1, range(2, 15)  # stolen weights at step 1, then 13 steps on undeclared data


@pytest.fixture(scope="module")
def cheater(tmp_path_factory):
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("swap")
    stolen = out / "stolen.npy"
    np.save(stolen, compute_stolen_init(SPEC, steps=100, lr=0.1, reset_norms=True))
    cheats = (Cheat("swap-stolen", STOLEN_AT), *(Cheat("swap", s) for s in UNDECLARED))
    run_audited_job(SPEC, out / "job", cheats=cheats, init_vector=stolen)
    return out / "job"


@pytest.mark.e2e
def test_the_hidden_state_cheats_pass_the_named_positions_alone(cheater, monkeypatch):
    monkeypatch.setattr(auditor, "verify_state_root", lambda *a: None)  # the auditor as it was on 404c0a8
    verdicts = audit_job(SPEC, cheater, load_tolerance())
    assert [v.step for v in verdicts] == list(range(SPEC.steps + 1))
    assert all(v.valid for v in verdicts), [(v.step, v.detail) for v in verdicts if not v.valid]


@pytest.mark.e2e
def test_every_cheated_step_fails_its_state_root_and_the_honest_steps_pass(cheater):
    verdicts = {v.step: v for v in audit_job(SPEC, cheater, load_tolerance())}
    for s in (STOLEN_AT, *UNDECLARED):
        assert verdicts[s].reason == TrainingReason.STATE_ROOT_MISMATCH, verdicts[s]
    # the init (KS and moments), and the honest steps after the cheats: served from the bound state, re-executed
    assert all(verdicts[s].valid for s in (0, 15, 16)), verdicts
    # the state served as "before 15" is the one bound at 14 and is the one served "after 14": the served Z(14)
    # of the audit of 14 (the honest one) is refused, never both
    served_after = np.load(cheater / "responses" / "00000014" / "state.npy")
    served_before = np.load(cheater / "responses" / "00000015" / "state_prev.npy")
    assert not np.array_equal(served_after, served_before)

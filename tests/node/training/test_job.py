"""The real gloo job (2 workers + shadow) audited end to end: honest steps pass, every attack is caught."""

import json

import numpy as np
import pytest
import torch

from node.protocol.ledger import TrainingReason
from node.training.auditor import load_tolerance
from node.training.calibration import audit_job, run_audited_job
from node.training.job import Cheat
from node.training.report import ATTACKS, compute_stolen_init
from node.training.spec import RunSpec

SPEC = RunSpec(steps=6, anchor_every=3, keep_checkpoints=5)


@pytest.fixture(scope="module")
def honest(tmp_path_factory):
    out = tmp_path_factory.mktemp("honest")
    run_audited_job(SPEC, out)
    return out


def test_every_honest_step_is_accepted_with_the_calibrated_tolerance(honest):
    verdicts = audit_job(SPEC, honest, load_tolerance())
    assert [v.step for v in verdicts] == list(range(SPEC.steps + 1))
    assert all(v.valid for v in verdicts), [(v.step, v.detail) for v in verdicts if not v.valid]
    assert verdicts[0].detail.startswith("init KS")


def test_the_shadow_serves_the_workers_exact_state(honest):
    entries = [json.loads(line) for line in (honest / "ledger.jsonl").read_text().splitlines()]
    z = np.load(honest / "responses" / "00000004" / "state.npy")
    assert z.dtype == np.float32
    assert z[entries[4]["positions"]].tolist() == entries[4]["values"]
    prev = np.load(honest / "responses" / "00000004" / "state_prev.npy")
    assert np.array_equal(prev, np.load(honest / "responses" / "00000003" / "state.npy"))


def test_the_ledger_is_signed_and_refuses_tampering(honest, tmp_path):
    from eth_account import Account

    from node.protocol.ledger import InvalidTraining
    from node.training.auditor import read_published_ledger
    from node.training.calibration import PROVER_KEY

    path = honest / "ledger.jsonl"
    prover = Account.from_key(PROVER_KEY).address
    assert len(read_published_ledger(path, SPEC.run_id(), prover)) == SPEC.steps + 1
    lines = path.read_text().splitlines()
    d = json.loads(lines[3])
    d["values"][0] += 1.0
    bad = tmp_path / "ledger.jsonl"
    bad.write_text("\n".join([*lines[:3], json.dumps(d), *lines[4:]]) + "\n")
    with pytest.raises(InvalidTraining) as e:
        read_published_ledger(bad, SPEC.run_id(), prover)
    assert e.value.training_reason == TrainingReason.LEDGER_NOT_CHAINED
    with pytest.raises(InvalidTraining):
        read_published_ledger(path, SPEC.run_id(), Account.from_key(b"\x09" * 32).address)


@pytest.mark.e2e
def test_every_attack_is_caught_and_the_honest_steps_around_it_pass(tmp_path):
    torch.set_num_threads(1)
    spec = RunSpec(steps=12, anchor_every=4, response_deadline_s=7.5)  # the late cheat answers ≥ 8 s after
    stolen = tmp_path / "stolen.npy"
    np.save(stolen, compute_stolen_init(spec, steps=100, lr=0.1, reset_norms=False))
    run_audited_job(spec, tmp_path / "job", cheats=(Cheat("stolen-init", 0), *(c for c, _ in ATTACKS)),
                    init_vector=stolen)
    verdicts = {v.step: v for v in audit_job(spec, tmp_path / "job", load_tolerance())}
    assert verdicts[0].reason == TrainingReason.INIT_DISTRIBUTION
    for cheat, reason in ATTACKS:
        v = verdicts[cheat.step]
        assert not v.valid and v.reason.name == reason, (cheat, v)
    assert verdicts[1].valid and verdicts[12].valid  # before and after the cheats: no false rejection


def test_the_run_is_recorded_in_the_workload_record(honest, tmp_path):
    import time as _time

    from node.training.model import get_run_param_count
    from node.training.record import record_run
    from node.workload.store import WorkloadRecord

    verdicts = audit_job(SPEC, honest, load_tolerance())
    audits = [{"step": v.step, "valid": v.valid, "reason": int(v.reason), "reason_name": v.reason.name,
               "at": _time.time()} for v in verdicts]
    n = get_run_param_count(SPEC)
    with WorkloadRecord.open(tmp_path / "rec") as rec:
        trace_id = record_run(rec, SPEC, honest, n, audits)
    with WorkloadRecord.open(tmp_path / "rec", readonly=True) as rec:
        trace = rec.get_trace(trace_id)
        kinds = {e.kind for e in trace.events}
        assert {"step", "collective", "commitment", "challenge", "checkpoint", "response"} <= kinds
        assert sum(e.kind == "step" for e in trace.events) == SPEC.steps * SPEC.workers
        graph = rec.get_graph(trace.graph_id)
        assert graph.kind == "distributed" and "stablehlo.all_reduce" in graph.mlir
        assert {d.device_id for d in rec.devices()} == {"worker-0", "worker-1", "shadow"}
        refs = [r for r in rec.tensor_refs() if r.name == "Z(4)"]
        served = np.load(honest / "responses" / "00000004" / "state.npy")
        assert refs and np.array_equal(rec.get_tensor(refs[0]), served)


def test_off_chain_requests_are_taken_once_and_malformed_ones_dropped(tmp_path):
    from node.training.job import get_request_dir, take_requests

    folder = get_request_dir(tmp_path)
    folder.mkdir()
    (folder / "00000003.json").write_text(json.dumps({"step": 3}))
    (folder / "00000009.json").write_text(json.dumps({"step": 9}))  # past the anchored step: later
    (folder / "bad.json").write_text("{")
    assert take_requests(tmp_path, 5) == [3]
    assert take_requests(tmp_path, 5) == []
    assert take_requests(tmp_path, 10) == [9]
    assert not (folder / "bad.json").exists()

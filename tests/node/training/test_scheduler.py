"""The auditor's scheduler: a newer drawn audit interrupts a running recomputation, as compute_completed_audits says."""

import time
from pathlib import Path

import numpy as np
import pytest

from node.protocol.ledger import InvalidTraining
from node.protocol.lsh import compute_completed_audits
from node.training.scheduler import AuditSchedule, CancellableWorker


def slow_recompute(marker: str, seconds: float, value: int) -> int:
    """Stand in for a recomputation that takes `seconds`; leaves a file when it starts and when it ends."""
    Path(marker + ".started").write_text("1")
    time.sleep(seconds)
    Path(marker + ".done").write_text("1")
    return value


def test_the_schedule_follows_the_pure_policy_window_by_window():
    rng = np.random.default_rng(7)
    for _ in range(50):
        mask = (rng.random(40) < 0.3).tolist()
        k, m = int(rng.integers(0, 4)), int(rng.integers(1, 8))
        schedule = AuditSchedule(k=k)
        for last in range(m, 40 + m, m):
            last = min(last, 39)
            schedule.on_draw(last, [t for t in range(schedule.known_until + 1, last + 1) if mask[t]])
        assert schedule.get_pending() == compute_completed_audits(mask, k)
        assert sorted(schedule.interrupted) == sorted(set(t for t, a in enumerate(mask) if a)
                                                      - set(compute_completed_audits(mask, k)))


def test_a_finished_audit_stands_and_draws_must_come_in_order():
    schedule = AuditSchedule(k=2)
    assert schedule.on_draw(5, [5]) == []
    schedule.on_finished(5)
    assert schedule.on_draw(10, [6]) == []  # 6 would interrupt 5, but 5 finished first
    assert schedule.get_pending() == [6]
    with pytest.raises(InvalidTraining):
        schedule.on_draw(8, [])


def test_a_newer_draw_kills_the_running_recomputation_and_the_newest_completes(tmp_path):
    schedule = AuditSchedule(k=2)
    worker = CancellableWorker()
    try:
        schedule.on_draw(5, [3, 5])  # 3 is interrupted by 5 at once (5 − 3 ≤ k)
        assert schedule.get_pending() == [5] and schedule.interrupted == {3}
        slow = str(tmp_path / "audit-5")
        worker.submit(5, slow_recompute, slow, 60.0, 5)
        deadline = time.monotonic() + 60
        while not Path(slow + ".started").exists():  # the child (spawned: imports torch) is recomputing
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert worker.poll() is None
        interrupted = schedule.on_draw(10, [6])
        assert interrupted == [5]
        assert worker.cancel() == 5  # the service kills what the schedule interrupted
        quick = str(tmp_path / "audit-6")
        worker.submit(6, slow_recompute, quick, 0.1, 6)
        result = None
        while result is None:
            assert time.monotonic() < deadline
            result = worker.poll(0.5)
        assert result == (6, "ok", 6)
        schedule.on_finished(6)
        assert not Path(slow + ".done").exists()  # the abandoned recomputation never finished
        assert schedule.get_pending() == [] and not schedule.is_live(5)
    finally:
        worker.close()


def test_the_prover_cannot_predict_an_abandoned_audit_the_service_completes_every_drawn_one(tmp_path):
    """Issue 30, finding 8: the public policy said which drawn audits every auditor abandons (a newer draw within k:
    here 5 by 7, and 3 by 5 at once); the prover cheats exactly there. The service now abandons none."""
    from node.training.auditor import load_tolerance
    from node.training.service import AuditorService, WatchedRun
    from node.training.spec import RunSpec

    predicted = {3, 5, 7} - set(compute_completed_audits([t in (3, 5, 7) for t in range(12)], 2))
    assert predicted == {3, 5}, "what the public policy lets the prover predict"
    run = WatchedRun(out_dir=tmp_path, prover="0x" + "00" * 20, spec=RunSpec(steps=10), k=2)
    service = AuditorService(contract=None, validator=None, tolerance=load_tolerance(), trajectory=None,
                             journal=tmp_path / "journal.jsonl", worker=CancellableWorker())
    try:
        assert run.schedule.on_draw(5, [3, 5]) == []
        slow = str(tmp_path / "audit-3")
        service.worker.submit((run.run_id, 3), slow_recompute, slow, 1.0, 3)
        service.running = (run, 3)
        for t in run.schedule.on_draw(10, [7]):  # what on_anchor does with a window's draws
            service.on_interrupted(run, t)
        assert service.running == (run, 3), "the running audit of a predicted-abandoned step goes on"
        assert service.get_waiting(run) == [5, 7], "and the other predicted-abandoned step is still to audit"
        deadline = time.monotonic() + 60
        result = None
        while result is None:
            assert time.monotonic() < deadline
            result = service.worker.poll(0.5)
        assert result[2] == 3 and Path(slow + ".done").exists()
        assert not (tmp_path / "journal.jsonl").exists(), "nothing journaled as interrupted"
    finally:
        service.worker.close()

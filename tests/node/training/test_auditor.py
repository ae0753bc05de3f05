import math
from pathlib import Path

import numpy as np
import pytest

from node.protocol.hashing import keccak256
from node.protocol.ledger import InvalidTraining, LedgerEntry, TrainingReason, seal_entry
from node.protocol.lsh import compute_named_positions
from node.training.auditor import (
    AuditMeasurement,
    AuditTolerance,
    compute_relative_error,
    decide_audit,
    load_tolerance,
    verify_named_values,
)
from node.training.service import verify_anchor_head
from node.training.spec import RunSpec

TOL = AuditTolerance(rel_update_error=1e-5, named_rel_error=1e-5, lsh_rel_error=1e-4, init_alpha=0.01)


def measurement(**kw):
    base = dict(step=3, rel_param_error=1e-7, rel_momentum_error=1e-8, named_rel_error=1e-7, lsh_rel_error=1e-6,
                replica_lsh_rel_error=1e-6, recompute_s=0.1)
    return AuditMeasurement(**{**base, **kw})


@pytest.mark.parametrize("field,value,reason", [
    ("rel_param_error", 0.1, TrainingReason.RECOMPUTE_MISMATCH),
    ("rel_momentum_error", 2e-5, TrainingReason.RECOMPUTE_MISMATCH),
    ("named_rel_error", 0.5, TrainingReason.RECOMPUTE_MISMATCH),
    ("lsh_rel_error", 0.01, TrainingReason.LSH_MISMATCH),
    ("replica_lsh_rel_error", 0.01, TrainingReason.LSH_MISMATCH),
])
def test_each_measurement_past_its_threshold_rejects(field, value, reason):
    assert decide_audit(measurement(), TOL).valid
    v = decide_audit(measurement(**{field: value}), TOL)
    assert not v.valid and v.reason == reason


def test_relative_error_is_relative_to_the_step_update():
    before, mine = np.zeros(4), np.array([1.0, 0, 0, 0])
    assert compute_relative_error(mine, mine, before) == 0.0
    assert math.isclose(compute_relative_error(mine, np.array([1.1, 0, 0, 0]), before), 0.1)
    assert compute_relative_error(before, before, before) == 0.0  # nothing moved on either side


def test_the_committed_tolerance_is_calibrated_and_finite():
    tol = load_tolerance()
    assert 0 < tol.rel_update_error < 1e-3 and 0 < tol.lsh_rel_error < 1e-2 and tol.init_alpha == 1e-3


def test_named_values_must_match_bit_for_bit():
    beacon, z = b"\x01" * 32, np.arange(100, dtype=np.float32)
    pos = compute_named_positions(beacon, 4, z.size, 8)
    entry = LedgerEntry(run_id=b"\x00" * 32, step=4, prev_head=b"\x00" * 32, positions=tuple(pos.tolist()),
                        values=tuple(z[pos].tolist()), batch_roots=(), lsh=(), replica_lsh=())
    verify_named_values(z, entry, beacon, 8)
    doctored = z.copy()
    doctored[pos[3]] = np.nextafter(doctored[pos[3]], np.float32(1e9))
    with pytest.raises(InvalidTraining) as e:
        verify_named_values(doctored, entry, beacon, 8)
    assert e.value.training_reason == TrainingReason.CHECKPOINT_POSITIONS
    with pytest.raises(InvalidTraining):
        verify_named_values(z, entry, b"\x02" * 32, 8)  # positions the verifier did not name


def test_the_published_ledger_must_reach_the_anchored_head():
    e = seal_entry(LedgerEntry(run_id=b"\x00" * 32, step=0, prev_head=b"\x00" * 32, positions=(), values=(),
                               batch_roots=(), lsh=(), replica_lsh=()))
    verify_anchor_head([e], 0, e.head)
    with pytest.raises(InvalidTraining):
        verify_anchor_head([e], 0, keccak256(b"x"))
    with pytest.raises(InvalidTraining):
        verify_anchor_head([e], 5, e.head)


def test_arrival_is_stamped_by_the_auditor_not_by_the_provers_file_times(tmp_path):
    import os
    import time

    from node.training.service import wait_for_response

    np.save(tmp_path / "state.npy", np.zeros(4, dtype=np.float32))
    os.utime(tmp_path / "state.npy", (1.0, 1.0))  # a prover backdating its answer
    before = time.time()
    response = wait_for_response(tmp_path, 0, deadline=before + 5)
    assert response is not None and response.arrived_at >= before
    assert wait_for_response(tmp_path / "missing", 1, deadline=time.time() + 0.3, poll_s=0.1) is None


def test_each_step_is_checked_with_its_own_windows_beacon():
    from node.training.auditor import AuditContext
    from node.training.spec import RunSpec

    spec = RunSpec(steps=10, anchor_every=3)
    ctx = AuditContext(spec=spec, corpus=None, beacons=(b"\x00" * 32, b"\x01" * 32), entries=(), tolerance=TOL)
    assert ctx.get_step_beacon(3) == b"\x00" * 32 and ctx.get_step_beacon(4) == b"\x01" * 32
    with pytest.raises(InvalidTraining) as e:
        ctx.get_step_beacon(7)  # window 2 is not anchored yet: its positions cannot be checked
    assert e.value.training_reason == TrainingReason.CHECKPOINT_POSITIONS


def test_a_zero_sketch_spread_does_not_make_a_zero_sketch_threshold():
    from node.training.calibration import Spread, compute_tolerance

    spread = Spread(n=3, rel_param_error_max=2e-6, rel_momentum_error_max=1e-7, named_rel_error_max=1e-6,
                    lsh_rel_error_max=0.0, replica_lsh_rel_error_max=0.0, recompute_s_median=0.1)
    tol = compute_tolerance(spread, 10.0, 1e-3)
    assert tol.lsh_rel_error == tol.rel_update_error == pytest.approx(2e-5)
    wider = compute_tolerance(Spread(**{**spread.__dict__, "replica_lsh_rel_error_max": 5e-6}), 10.0, 1e-3)
    assert wider.lsh_rel_error == pytest.approx(5e-5)


def test_pooled_spread_takes_each_columns_largest_value(tmp_path):
    from node.training.calibration import Spread, compute_pooled_spread, load_spread, write_tolerance

    a = Spread(n=10, rel_param_error_max=1e-6, rel_momentum_error_max=0.0, named_rel_error_max=3e-7,
               lsh_rel_error_max=0.0, replica_lsh_rel_error_max=0.0, recompute_s_median=0.2)
    b = Spread(n=20, rel_param_error_max=2e-6, rel_momentum_error_max=1e-7, named_rel_error_max=1e-7,
               lsh_rel_error_max=1e-5, replica_lsh_rel_error_max=2e-6, recompute_s_median=0.9)
    pooled = compute_pooled_spread([a, b])
    assert pooled == Spread(n=30, rel_param_error_max=2e-6, rel_momentum_error_max=1e-7, named_rel_error_max=3e-7,
                            lsh_rel_error_max=1e-5, replica_lsh_rel_error_max=2e-6, recompute_s_median=0.2)
    from node.training.calibration import compute_tolerance

    write_tolerance(tmp_path / "t.json", compute_tolerance(b, 10.0, 1e-3), b, {"v": b}, 10.0)
    assert load_spread(tmp_path / "t.json") == (b, {"v": b})


def test_a_served_state_is_accepted_only_if_it_is_the_one_its_ledger_entry_binds():
    """Issue 30: for any state Z bound in an entry, that Z passes and every other (one entry changed, another
    step's state, the two halves swapped) is STATE_ROOT_MISMATCH — so "after t" and "before t + 1" are one state."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from node.protocol.training_state import compute_data_cursor, compute_state_root
    from node.training.auditor import verify_state_root

    spec = RunSpec()

    @settings(max_examples=40, deadline=None)
    @given(n=st.integers(1, 64), step=st.integers(0, 1000), index=st.integers(0, 127), seed=st.integers(0, 99))
    def check(n, step, index, seed):
        z = np.random.default_rng(seed).standard_normal(2 * n).astype(np.float32)
        root = compute_state_root(z[:n], z[n:], step, compute_data_cursor(step, spec.global_batch))
        entry = LedgerEntry(run_id=b"\x00" * 32, step=step, prev_head=b"\x00" * 32, positions=(), values=(),
                            batch_roots=(), lsh=(), replica_lsh=(), state_root=root)
        verify_state_root(z, entry, spec)
        other = z.copy()
        other[index % (2 * n)] = np.nextafter(other[index % (2 * n)], np.float32(np.inf))
        for bad, at in ((other, entry), (z, LedgerEntry(**{**entry.__dict__, "step": step + 1})),
                        (np.concatenate([z[n:], z[:n]]), entry)):
            if bad is not z and np.array_equal(bad, z):
                continue  # swapping equal halves is the same state
            with pytest.raises(InvalidTraining) as e:
                verify_state_root(bad, at, spec)
            assert e.value.training_reason == TrainingReason.STATE_ROOT_MISMATCH

    check()


def test_the_auditor_refuses_a_run_registered_at_another_rate_or_m_than_its_spec():
    """Issue 30, finding 3: a prover registering its own run below its declared rate is not audited (certified)."""
    from node.training.corpus import load_corpus
    from node.training.service import WatchedRun, is_declared_on_chain

    prover = "0x" + "11" * 20
    spec = RunSpec(prover=prover, audit_rate=0.4, anchor_every=5)
    run = WatchedRun(out_dir=Path("."), prover=prover, spec=spec)
    root = load_corpus(spec.corpus_files, spec.seq_len).data_root
    assert spec.audit_rate_wad == 4 * 10**17
    assert is_declared_on_chain(run, root, spec.procedure_hash(), prover, 4 * 10**17, 5)
    assert not is_declared_on_chain(run, root, spec.procedure_hash(), prover, 1, 5)  # 1e-18: never drawn
    assert not is_declared_on_chain(run, root, spec.procedure_hash(), prover, 10**17, 5)
    assert not is_declared_on_chain(run, root, spec.procedure_hash(), prover, 4 * 10**17, 1)
    assert spec.procedure_hash() != spec.model_copy(update={"audit_rate": 0.1}).procedure_hash()
    # issue 31, finding 6: the declaration names its prover (its run id and LSH seed depend on it)
    other = WatchedRun(out_dir=Path("."), prover=prover, spec=spec.model_copy(update={"prover": "0x" + "22" * 20}))
    assert not is_declared_on_chain(other, root, spec.procedure_hash(), prover, 4 * 10**17, 5)

"""Trajectory checks: the declared lr is exact, loss jumps and gradient-norm outliers only raise the audit rate."""

import math

import numpy as np
import pytest

from node.protocol.ledger import InvalidTraining, LedgerEntry, TrainingReason
from node.training.calibration import load_trajectory_policy
from node.training.trajectory import (
    TrajectoryPolicy,
    compute_extra_audit_probability,
    compute_raised_rate,
    compute_robust_z,
    compute_trajectory_measurement,
    decide_trajectory,
    verify_declared_schedule,
)

POLICY = TrajectoryPolicy(loss_jump_z=8.0, grad_norm_z=8.0, multiplier=4.0)


def entries(loss, grad_norm, lr=None):
    lr = lr if lr is not None else [0.01] * len(loss)
    out = [LedgerEntry(run_id=b"\x00" * 32, step=0, prev_head=b"\x00" * 32, positions=(), values=(), batch_roots=(),
                       lsh=(), replica_lsh=())]
    for t, (x, g, r) in enumerate(zip(loss, grad_norm, lr, strict=True), start=1):
        out.append(LedgerEntry(run_id=b"\x00" * 32, step=t, prev_head=b"\x00" * 32, positions=(), values=(),
                               batch_roots=(), lsh=(), replica_lsh=(), loss=x, grad_norm=g, lr=r))
    return out


def smooth_run(n=30, seed=0):
    rng = np.random.default_rng(seed)
    loss = 10.0 - 0.05 * np.arange(n) + rng.normal(0, 0.02, n)
    grad = np.exp(rng.normal(0, 0.05, n)) * 2.0
    return loss.tolist(), grad.tolist()


def test_a_smooth_run_does_not_raise_the_rate():
    loss, grad = smooth_run()
    m = compute_trajectory_measurement(entries(loss, grad))
    assert m.steps == tuple(range(1, 31))
    assert all(math.isnan(z) for z in m.loss_jump_z[:5])  # too little history: no score, no raise
    assert decide_trajectory(m, POLICY).multiplier == 1.0


@pytest.mark.parametrize("signal", ["loss", "grad"])
def test_a_spike_raises_the_rate_at_its_step(signal):
    loss, grad = smooth_run()
    if signal == "loss":
        loss[19] += 1.0  # step 20
    else:
        grad[19] *= 5.0
    d = decide_trajectory(compute_trajectory_measurement(entries(loss, grad)), POLICY)
    assert d.multiplier == 4.0 and 20 in d.flagged_steps


def test_robust_z_ignores_one_outlier_in_its_window_and_survives_a_flat_history():
    values = np.array([1.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    z = compute_robust_z(values, window=4, min_history=4)
    assert np.isnan(z[:4]).all() and z[4] == 0.0 and z[5] == 0.0  # flat: 0, not NaN or infinity
    values = np.array([1.0, 1.1, 0.9, 50.0, 1.0, 1.05, 0.95, 1.0])
    z = compute_robust_z(values, window=6, min_history=4)
    assert abs(z[6]) < 3 and abs(z[7]) < 3  # the outlier at index 3 does not hide its neighbours' normality


def test_the_declared_schedule_is_exact():
    loss, grad = smooth_run(6)
    declared = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
    verify_declared_schedule(entries(loss, grad, declared[1:]), declared)
    wrong = list(declared[1:])
    wrong[3] = float(np.nextafter(np.float32(wrong[3]), np.float32(1.0)))  # one float32 ulp off at step 4
    with pytest.raises(InvalidTraining) as e:
        verify_declared_schedule(entries(loss, grad, wrong), declared)
    assert e.value.training_reason == TrainingReason.SCHEDULE_MISMATCH and e.value.step == 4


def test_the_raised_rate_is_bounded_and_extra_audits_make_it_up():
    d = decide_trajectory(compute_trajectory_measurement(entries(*smooth_run())), POLICY)
    assert compute_raised_rate(0.2, d) == 0.2 and compute_extra_audit_probability(0.2, 0.2) == 0.0
    raised = decide_trajectory(compute_trajectory_measurement(entries(*smooth_run())),
                               TrajectoryPolicy(loss_jump_z=0.0, grad_norm_z=0.0, multiplier=4.0))
    assert compute_raised_rate(0.2, raised) == 0.8 and compute_raised_rate(0.4, raised) == 1.0
    q = compute_extra_audit_probability(0.2, 0.8)
    assert math.isclose(0.2 + 0.8 * q, 0.8)  # drawn on chain, or else drawn off-chain: total rate 0.8


def test_the_committed_policy_is_calibrated():
    policy = load_trajectory_policy()
    assert policy.loss_jump_z > 0 and policy.grad_norm_z > 0 and policy.multiplier > 1

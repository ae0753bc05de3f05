"""The detection report: every attack of issue 17 run as a real cheating job, audited with the calibrated tolerance.

Per attack: whether an audit of the cheated step caught it (and why), the chance that one audit
catches it (detection given audited × fraction of audited steps that are cheated), the expected
number of audits until detection, and the expected steps until detection at audit rate p with a
recomputation k steps long: no drawn audit is abandoned (issue 30), so a drawn step completes with q = p; the
earlier q = p(1 − p)^k of an interrupting policy was public to the prover.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from node.protocol.lsh import compute_catch_probability, compute_expected_audits_to_detection
from node.training.auditor import AuditTolerance, AuditVerdict
from node.training.calibration import audit_job, run_audited_job
from node.training.initcheck import (
    compute_init_measurement,
    compute_moment_measurement,
    is_init_accepted,
    is_moment_accepted,
)
from node.training.job import Cheat
from node.training.model import (
    TrainState,
    build_model,
    compute_local_gradient,
    compute_lr,
    compute_update,
    get_params_vector,
    set_params_vector,
)
from node.training.spec import RunSpec

log = logging.getLogger(__name__)

# (cheat, expected reason name) — one step each, spaced so that every audit is independent
ATTACKS: tuple[tuple[Cheat, str], ...] = (
    (Cheat("undeclared-sample", 2), "RECOMPUTE_MISMATCH"),
    (Cheat("undeclared-batch", 3), "RECOMPUTE_MISMATCH"),
    (Cheat("skip-step", 4), "RECOMPUTE_MISMATCH"),
    (Cheat("repeat-step", 5), "RECOMPUTE_MISMATCH"),
    (Cheat("wrong-lr", 6, factor=2.0), "RECOMPUTE_MISMATCH"),
    (Cheat("wrong-lr", 7, factor=1.1), "RECOMPUTE_MISMATCH"),
    (Cheat("doctor", 8), "CHECKPOINT_POSITIONS"),
    (Cheat("doctor-patched", 9), "STATE_ROOT_MISMATCH"),  # RECOMPUTE_MISMATCH before the state root (issue 30)
    (Cheat("forge-shadow", 10), "CHECKPOINT_POSITIONS"),
    (Cheat("late", 11, delay_s=8.0), "LATE_RESPONSE"),
)


@dataclass(frozen=True)
class AttackRow:
    """One attack's line in the detection report."""

    attack: str
    step: int
    caught: bool
    reason: str
    detail: str
    detect_given_audited: float
    cheated_fraction: float
    per_audit_catch: float
    expected_audits_to_detection: float
    expected_steps_to_detection: float


def compute_stolen_init(spec: RunSpec, steps: int, lr: float, reset_norms: bool) -> np.ndarray:
    """Return params pretrained by `steps` plain SGD steps from another seed (a stolen init); a careful thief
    resets the norm weights to one, so that only the KS test of the matrices is left to see it."""
    from node.training.corpus import load_corpus

    other = spec.model_copy(update={"init_seed": spec.init_seed + 1})
    model = build_model(other)
    state = TrainState(0, get_params_vector(model), get_params_vector(model) * 0)
    samples = load_corpus(spec.corpus_files, spec.seq_len).samples
    for t in range(1, steps + 1):
        _, grad = compute_local_gradient(model, samples[(t * 8) % len(samples):(t * 8) % len(samples) + 8])
        state = compute_update(state, grad, lr, 0.0)
        set_params_vector(model, state.params)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1 and reset_norms:
                p.fill_(1.0)
    return get_params_vector(model).numpy()


def run_attack_job(spec: RunSpec, work_dir: Path, tolerance: AuditTolerance) -> list[AuditVerdict]:
    """Run one cheating job with every attack at its step (and a stolen init) and audit every step."""
    stolen = work_dir / "stolen-init.npy"
    work_dir.mkdir(parents=True, exist_ok=True)
    np.save(stolen, compute_stolen_init(spec, steps=100, lr=0.1, reset_norms=False))
    cheats = (Cheat("stolen-init", 0), *(c for c, _ in ATTACKS))
    run_audited_job(spec, work_dir / "job", cheats=cheats, init_vector=stolen)
    return audit_job(spec, work_dir / "job", tolerance)


def compute_attack_rows(spec: RunSpec, verdicts: list[AuditVerdict], p: float, k: float) -> list[AttackRow]:
    """Return the report rows from the verdicts of the cheating job (one cheated step per attack)."""
    by_step = {v.step: v for v in verdicts}
    rows = []
    for cheat, _ in ((Cheat("stolen-init", 0), "INIT_DISTRIBUTION"), *ATTACKS):
        v = by_step[cheat.step]
        name = cheat.kind if cheat.kind != "wrong-lr" else f"wrong-lr×{cheat.factor}"
        detect = 0.0 if v.valid else 1.0
        # a one-step cheat is caught by an audit only if the audit lands on it; the init is always audited
        fraction = 1.0 if cheat.kind == "stolen-init" else 1.0 / spec.steps
        catch = detect * fraction
        # no drawn audit is abandoned any more (issue 30, finding 8): every drawn step completes, q = p (k = 0);
        # k stays the measured recompute ÷ step, the auditor's load (p·k of the prover's pace), not a loss
        q = compute_catch_probability(p, 0.0)
        rows.append(AttackRow(
            attack=name, step=cheat.step, caught=not v.valid, reason=v.reason.name, detail=v.detail,
            detect_given_audited=detect, cheated_fraction=fraction, per_audit_catch=catch,
            expected_audits_to_detection=compute_expected_audits_to_detection(catch),
            # a cheater doing this in a fraction f of its steps: each step is audited to completion with prob. q
            expected_steps_to_detection=compute_expected_audits_to_detection(q * catch)))
    return rows


def measure_careful_thief(spec: RunSpec, tolerance: AuditTolerance) -> dict[str, Any]:
    """Return the step-0 check of a stolen init whose norms were reset (the auditor's own init check, no job)."""
    params = compute_stolen_init(spec, steps=100, lr=0.1, reset_norms=True)
    m = compute_init_measurement(spec, params, sample=200_000, seed=0)
    moments = compute_moment_measurement(spec, params)
    return {"min_p_value": m.min_p_value, "worst_tensor": m.worst_tensor, "tensors": m.tensors,
            "level": tolerance.init_alpha / m.tensors, "caught_by_ks": not is_init_accepted(m, tolerance.init_alpha),
            "moment_min_p_value": moments.min_p_value, "moment_worst": moments.worst, "moment_tests": moments.tests,
            "moment_level": tolerance.init_alpha / moments.tests,
            "caught": not (is_init_accepted(m, tolerance.init_alpha)
                           and is_moment_accepted(moments, tolerance.init_alpha))}


def measure_init_false_positives(spec: RunSpec, seeds: int, alpha: float) -> dict[str, Any]:
    """Return the KS check's rejections over honest inits of `seeds` seeds."""
    p_values, moment_p_values, rejected, moment_rejected = [], [], 0, 0
    for seed in range(seeds):
        s = spec.model_copy(update={"init_seed": 1000 + seed})
        params = get_params_vector(build_model(s)).numpy()
        m = compute_init_measurement(s, params, sample=200_000, seed=seed)
        moments = compute_moment_measurement(s, params)
        p_values.append(m.min_p_value)
        moment_p_values.append(moments.min_p_value)
        rejected += not is_init_accepted(m, alpha)
        moment_rejected += not is_moment_accepted(moments, alpha)
    return {"seeds": seeds, "alpha": alpha, "rejected": rejected, "false_positive_rate": rejected / seeds,
            "min_p_values": p_values, "moment_rejected": moment_rejected, "moment_min_p_values": moment_p_values}


def get_rows_json(rows: list[AttackRow]) -> list[dict[str, Any]]:
    """Return rows as JSON-ready dicts."""
    return [asdict(r) for r in rows]


__all__ = ["ATTACKS", "AttackRow", "compute_attack_rows", "compute_lr", "measure_init_false_positives",
           "run_attack_job"]

"""Calibration of the auditor's tolerance: honest spread across variations, attacks, the chosen thresholds.

An honest variation changes what may legitimately differ between a prover and an auditor: the
prover's thread count, its world size (2 × 2 vs 4 × 1 samples: another gloo reduction order) and the
auditor's own thread count. Every step of every run is audited (rate 1) with an infinite tolerance,
so only measurements come back; `compute_tolerance` then sets each threshold to a margin above the
honest maximum and the report checks that every attack lies above it.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from chain.devnet import find_free_port
from node.protocol.ledger import InvalidTraining, compute_window_index
from node.training.auditor import (
    AuditContext,
    AuditMeasurement,
    AuditTolerance,
    AuditVerdict,
    load_response,
    process_audit,
    read_published_ledger,
)
from node.training.corpus import load_corpus
from node.training.job import (
    Cheat,
    JobPlan,
    LocalAudits,
    compute_local_beacon,
    get_response_dir,
    remove_job_outputs,
    run_job,
)
from node.training.model import get_declared_schedule
from node.training.spec import RunSpec
from node.training.trajectory import (
    TrajectoryMeasurement,
    TrajectoryPolicy,
    compute_trajectory_measurement,
    decide_trajectory,
    verify_declared_schedule,
)

log = logging.getLogger(__name__)
PROVER_KEY = (0xB0B).to_bytes(32, "big")
SECRET = b"calibration"
OPEN_TOLERANCE = AuditTolerance(rel_update_error=math.inf, named_rel_error=math.inf, lsh_rel_error=math.inf,
                                init_alpha=0.01)


@dataclass(frozen=True)
class HonestVariant:
    """One legitimate difference between the prover and the auditor."""

    name: str
    workers: int
    batch_per_worker: int
    prover_threads: int
    auditor_threads: int


HONEST_VARIANTS = (
    HonestVariant("w2-t1-a1", 2, 2, 1, 1),
    HonestVariant("w2-t2-a1", 2, 2, 2, 1),
    HonestVariant("w4-t1-a2", 4, 1, 1, 2),
)


def run_audited_job(spec: RunSpec, out_dir: Path, threads: int = 1, cheats: tuple[Cheat, ...] = (),
                    init_vector: Path | None = None, rate_wad: int = 10**18) -> None:
    """Run the gloo job with every step audited and served (rate 1; rate 0 for a ledger alone)."""
    remove_job_outputs(out_dir)
    run_job(JobPlan(spec=spec, out_dir=out_dir, prover_key=PROVER_KEY,
                    audits=LocalAudits(secret=SECRET, rate_wad=rate_wad), port=find_free_port(),
                    threads=threads, cheats=cheats, init_vector=init_vector))


def get_local_beacons(spec: RunSpec) -> tuple[bytes, ...]:
    """Return the in-process verifier's beacon of every window of a run."""
    windows = compute_window_index(spec.steps, spec.anchor_every) + 1
    return tuple(compute_local_beacon(SECRET, i) for i in range(windows))


def get_announcements(out_dir: Path) -> dict[int, float]:
    """Return step → time the prover announced (drew) its audit."""
    lines = (out_dir / "announced.jsonl").read_text().splitlines()
    return {int(d["step"]): float(d["at"]) for d in map(json.loads, lines)}


def audit_job(spec: RunSpec, out_dir: Path, tolerance: AuditTolerance, auditor_threads: int = 1) -> list[AuditVerdict]:
    """Audit every announced step of a finished local job; return the verdicts in step order."""
    from eth_account import Account

    torch.set_num_threads(auditor_threads)
    entries = read_published_ledger(out_dir / "ledger.jsonl", spec.run_id(), Account.from_key(PROVER_KEY).address)
    ctx = AuditContext(spec=spec, corpus=load_corpus(spec.corpus_files, spec.seq_len), beacons=get_local_beacons(spec),
                       entries=tuple(entries), tolerance=tolerance)
    verdicts = []
    for step, at in sorted(get_announcements(out_dir).items()):
        verdict = process_audit(ctx, load_response(get_response_dir(out_dir, step), step), at)
        verdicts.append(verdict if verdict.step >= 0 else AuditVerdict(step, False, verdict.reason, verdict.detail))
    return verdicts


@dataclass(frozen=True)
class Spread:
    """The largest (and 99th-percentile) honest value of each measurement over n audited steps."""

    n: int
    rel_param_error_max: float
    rel_momentum_error_max: float
    named_rel_error_max: float
    lsh_rel_error_max: float
    replica_lsh_rel_error_max: float
    recompute_s_median: float


def compute_spread(measurements: list[AuditMeasurement]) -> Spread:
    """Return the spread of a set of honest measurements."""
    def col(name: str) -> np.ndarray:
        return np.asarray([getattr(m, name) for m in measurements], dtype=np.float64)

    return Spread(n=len(measurements), rel_param_error_max=float(col("rel_param_error").max()),
                  rel_momentum_error_max=float(col("rel_momentum_error").max()),
                  named_rel_error_max=float(col("named_rel_error").max()),
                  lsh_rel_error_max=float(col("lsh_rel_error").max()),
                  replica_lsh_rel_error_max=float(col("replica_lsh_rel_error").max()),
                  recompute_s_median=float(np.median(col("recompute_s"))))


def compute_pooled_spread(spreads: list[Spread]) -> Spread:
    """Return the spread of several calibration runs together: each column's largest value, the steps summed."""
    if not spreads:
        raise ValueError("no spread to pool")
    return Spread(n=sum(s.n for s in spreads),
                  **{f: max(getattr(s, f) for s in spreads) for f in Spread.__dataclass_fields__
                     if f.endswith("_max")},
                  recompute_s_median=spreads[0].recompute_s_median)


def load_spread(path: Path) -> tuple[Spread, dict[str, Spread]]:
    """Return the overall and per-variant spread a tolerance file was calibrated from."""
    data = json.loads(path.read_text())
    return Spread(**data["spread"]), {k: Spread(**v) for k, v in data["per_variant"].items()}


def compute_tolerance(spread: Spread, margin: float, init_alpha: float) -> AuditTolerance:
    """Return thresholds `margin` × the honest maximum; the sketch's is never below the update's.

    The sketch is linear in the gradient, so a re-execution whose update is within tolerance can move the
    sketch by the same relative amount: a sketch spread of 0 (a run whose replicas' gradients happened to
    reproduce bit for bit) must not make the threshold 0.
    """
    update = max(spread.rel_param_error_max, spread.rel_momentum_error_max)
    sketch = max(spread.lsh_rel_error_max, spread.replica_lsh_rel_error_max, update)
    return AuditTolerance(rel_update_error=margin * update, named_rel_error=margin * spread.named_rel_error_max,
                          lsh_rel_error=margin * sketch, init_alpha=init_alpha)


def run_honest_calibration(base: RunSpec, work_dir: Path, drop_responses: bool = False,
                           ) -> tuple[Spread, dict[str, Spread], list[AuditVerdict]]:
    """Run every honest variant fully audited; return the overall and per-variant spread and all verdicts
    (drop_responses: delete a variant's served checkpoints once it is audited)."""
    per_variant: dict[str, Spread] = {}
    all_measurements: list[AuditMeasurement] = []
    verdicts: list[AuditVerdict] = []
    for v in HONEST_VARIANTS:
        spec = base.model_copy(update={"workers": v.workers, "batch_per_worker": v.batch_per_worker})
        started = time.perf_counter()
        run_audited_job(spec, work_dir / v.name, threads=v.prover_threads)
        job_s = time.perf_counter() - started
        vs = audit_job(spec, work_dir / v.name, OPEN_TOLERANCE, auditor_threads=v.auditor_threads)
        if drop_responses:
            shutil.rmtree(work_dir / v.name / "responses", ignore_errors=True)
        verdicts.extend(vs)
        ms = [x.measurement for x in vs if x.measurement is not None]
        per_variant[v.name] = compute_spread(ms)
        all_measurements.extend(ms)
        log.info("variant %s: job %.1f s, %d audited steps, spread %s", v.name, job_s, len(ms), per_variant[v.name])
    return compute_spread(all_measurements), per_variant, verdicts


def write_tolerance(path: Path, tolerance: AuditTolerance, spread: Spread, per_variant: dict[str, Spread],
                    margin: float, shape: str | None = None) -> None:
    """Write the calibrated tolerance with the spread it came from; with a shape other than tiny, as that shape's
    `per_shape` entry of the file (the rest of the file unchanged)."""
    entry = {"tolerance": asdict(tolerance), "margin": margin, "spread": asdict(spread),
             "per_variant": {k: asdict(v) for k, v in per_variant.items()}}
    if shape is not None and shape != "tiny":
        doc = json.loads(path.read_text()) if path.exists() else {}
        doc.setdefault("per_shape", {})[shape] = entry
        entry = doc
    elif path.exists() and "per_shape" in (old := json.loads(path.read_text())):
        entry["per_shape"] = old["per_shape"]
    path.write_text(json.dumps(entry, indent=1) + "\n")


# --- trajectory checks: thresholds from honest ledgers, checked on one-cheat runs -------------------------------


TRAJECTORY_FILE = Path(__file__).with_name("trajectory.json")
TRAJECTORY_ATTACKS = (Cheat("undeclared-sample", 0), Cheat("undeclared-batch", 0), Cheat("skip-step", 0),
                      Cheat("repeat-step", 0), Cheat("wrong-lr", 0, factor=2.0), Cheat("wrong-lr", 0, factor=1.1),
                      Cheat("wrong-lr", 0, factor=10.0), Cheat("wrong-lr-logged", 0, factor=2.0))


@dataclass(frozen=True)
class TrajectoryRun:
    """One run's trajectory scores, and whether its ledger follows the declared schedule."""

    name: str
    measurement: TrajectoryMeasurement
    schedule_error: str  # "" when every lr is the declared one


def measure_trajectory_job(spec: RunSpec, out_dir: Path, name: str, threads: int = 1,
                           cheats: tuple[Cheat, ...] = ()) -> TrajectoryRun:
    """Run a job with no audits (the ledger alone) and return its trajectory scores and schedule check."""
    from eth_account import Account

    run_audited_job(spec, out_dir, threads=threads, cheats=cheats, rate_wad=0)
    entries = read_published_ledger(out_dir / "ledger.jsonl", spec.run_id(), Account.from_key(PROVER_KEY).address)
    try:
        verify_declared_schedule(entries, get_declared_schedule(spec))
        error = ""
    except InvalidTraining as e:
        error = str(e)
    return TrajectoryRun(name, compute_trajectory_measurement(entries), error)


def compute_trajectory_policy(honest: list[TrajectoryRun], margin: float, multiplier: float) -> TrajectoryPolicy:
    """Return thresholds `margin` × the largest honest |z| of each score."""
    return TrajectoryPolicy(loss_jump_z=margin * max(r.measurement.max_abs_loss_jump_z for r in honest),
                            grad_norm_z=margin * max(r.measurement.max_abs_grad_norm_z for r in honest),
                            multiplier=multiplier)


def load_trajectory_policy(path: Path = TRAJECTORY_FILE) -> TrajectoryPolicy:
    """Return the calibrated trajectory policy."""
    d = json.loads(path.read_text())["policy"]
    return TrajectoryPolicy(loss_jump_z=float(d["loss_jump_z"]), grad_norm_z=float(d["grad_norm_z"]),
                            multiplier=float(d["multiplier"]))


def get_honest_trajectory_variants(seeds: range) -> list[tuple[str, HonestVariant, int]]:
    """Return (name, variant, data seed) of every honest trajectory run."""
    return [(f"{v.name}-seed{s}", v, s) for s in seeds for v in HONEST_VARIANTS]


def run_trajectory_calibration(base: RunSpec, work_dir: Path, fit_seeds: range, held_out_seeds: range,
                               attack_step: int, margin: float, multiplier: float) -> dict[str, object]:
    """Fit thresholds on honest runs of fit_seeds, count false raises on held-out seeds, run each attack once."""
    def honest_runs(seeds: range) -> list[TrajectoryRun]:
        out = []
        for name, v, seed in get_honest_trajectory_variants(seeds):
            spec = base.model_copy(update={"workers": v.workers, "batch_per_worker": v.batch_per_worker,
                                           "data_seed": seed})
            out.append(measure_trajectory_job(spec, work_dir / name, name, threads=v.prover_threads))
            log.info("honest %s: max |z| loss %.2f, grad norm %.2f", name, out[-1].measurement.max_abs_loss_jump_z,
                     out[-1].measurement.max_abs_grad_norm_z)
        return out

    fit = honest_runs(fit_seeds)
    policy = compute_trajectory_policy(fit, margin, multiplier)
    held_out = honest_runs(held_out_seeds)
    attacks = []
    for cheat in TRAJECTORY_ATTACKS:
        name = f"{cheat.kind}x{cheat.factor}" if cheat.kind in ("wrong-lr", "wrong-lr-logged") else cheat.kind
        run = measure_trajectory_job(base.model_copy(update={"data_seed": fit_seeds[0]}), work_dir / f"attack-{name}",
                                     name, cheats=(Cheat(cheat.kind, attack_step, cheat.factor),))
        attacks.append(run)
    return {"policy": policy, "fit": fit, "held_out": held_out, "attacks": attacks, "attack_step": attack_step}


def get_trajectory_row(run: TrajectoryRun, policy: TrajectoryPolicy, near: tuple[int, int] | None) -> dict[str, Any]:
    """Return one run's report row: its scores, whether it raised the rate, and (attacks) near the cheat."""
    m = run.measurement
    decision = decide_trajectory(m, policy)
    row: dict[str, Any] = {"run": run.name, "max_abs_loss_jump_z": m.max_abs_loss_jump_z,
                           "max_abs_grad_norm_z": m.max_abs_grad_norm_z, "raised": decision.multiplier > 1.0,
                           "flagged_steps": list(decision.flagged_steps), "schedule_error": run.schedule_error}
    if near is not None:
        lo, hi = near
        idx = [i for i, t in enumerate(m.steps) if lo <= t <= hi]
        row["near_loss_jump_z"] = max((abs(m.loss_jump_z[i]) for i in idx if np.isfinite(m.loss_jump_z[i])),
                                      default=0.0)
        row["near_grad_norm_z"] = max((abs(m.grad_norm_z[i]) for i in idx if np.isfinite(m.grad_norm_z[i])),
                                      default=0.0)
        row["raised_near_cheat"] = any(lo <= t <= hi for t in decision.flagged_steps)
    return row


def write_trajectory_policy(path: Path, result: dict[str, Any], margin: float) -> None:
    """Write the calibrated trajectory policy with the rows it came from."""
    policy: TrajectoryPolicy = result["policy"]
    step = int(result["attack_step"])
    doc = {"policy": asdict(policy), "margin": margin, "window": 8, "min_history": 4,
           "fit": [get_trajectory_row(r, policy, None) for r in result["fit"]],
           "held_out": [get_trajectory_row(r, policy, None) for r in result["held_out"]],
           "attacks": [get_trajectory_row(r, policy, (step, step + 2)) for r in result["attacks"]]}
    path.write_text(json.dumps(doc, indent=1) + "\n")

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
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from chain.devnet import find_free_port
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
from node.training.job import Cheat, JobPlan, LocalAudits, get_response_dir, remove_job_outputs, run_job
from node.training.spec import RunSpec

log = logging.getLogger(__name__)
PROVER_KEY = (0xB0B).to_bytes(32, "big")
BEACON = b"verinfer-calibration-beacon-0001"
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
                    init_vector: Path | None = None, beacon: bytes = BEACON) -> None:
    """Run the gloo job with every step audited and served (rate 1)."""
    remove_job_outputs(out_dir)
    run_job(JobPlan(spec=spec, out_dir=out_dir, beacon=beacon, prover_key=PROVER_KEY,
                    audits=LocalAudits(secret=b"calibration", rate_wad=10**18), port=find_free_port(),
                    threads=threads, cheats=cheats, init_vector=init_vector))


def get_announcements(out_dir: Path) -> dict[int, float]:
    """Return step → time the prover announced (drew) its audit."""
    lines = (out_dir / "announced.jsonl").read_text().splitlines()
    return {int(d["step"]): float(d["at"]) for d in map(json.loads, lines)}


def audit_job(spec: RunSpec, out_dir: Path, tolerance: AuditTolerance, auditor_threads: int = 1,
              beacon: bytes = BEACON) -> list[AuditVerdict]:
    """Audit every announced step of a finished local job; return the verdicts in step order."""
    from eth_account import Account

    torch.set_num_threads(auditor_threads)
    entries = read_published_ledger(out_dir / "ledger.jsonl", spec.spec_hash(), Account.from_key(PROVER_KEY).address)
    ctx = AuditContext(spec=spec, corpus=load_corpus(spec.corpus_files, spec.seq_len), beacon=beacon,
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


def compute_tolerance(spread: Spread, margin: float, init_alpha: float) -> AuditTolerance:
    """Return thresholds `margin` × the honest maximum (the LSH one covers replica and all-reduced sketches)."""
    return AuditTolerance(rel_update_error=margin * max(spread.rel_param_error_max, spread.rel_momentum_error_max),
                          named_rel_error=margin * spread.named_rel_error_max,
                          lsh_rel_error=margin * max(spread.lsh_rel_error_max, spread.replica_lsh_rel_error_max),
                          init_alpha=init_alpha)


def run_honest_calibration(base: RunSpec, work_dir: Path) -> tuple[Spread, dict[str, Spread], list[AuditVerdict]]:
    """Run every honest variant fully audited; return the overall and per-variant spread and all verdicts."""
    per_variant: dict[str, Spread] = {}
    all_measurements: list[AuditMeasurement] = []
    verdicts: list[AuditVerdict] = []
    for v in HONEST_VARIANTS:
        spec = base.model_copy(update={"workers": v.workers, "batch_per_worker": v.batch_per_worker})
        started = time.perf_counter()
        run_audited_job(spec, work_dir / v.name, threads=v.prover_threads)
        job_s = time.perf_counter() - started
        vs = audit_job(spec, work_dir / v.name, OPEN_TOLERANCE, auditor_threads=v.auditor_threads)
        verdicts.extend(vs)
        ms = [x.measurement for x in vs if x.measurement is not None]
        per_variant[v.name] = compute_spread(ms)
        all_measurements.extend(ms)
        log.info("variant %s: job %.1f s, %d audited steps, spread %s", v.name, job_s, len(ms), per_variant[v.name])
    return compute_spread(all_measurements), per_variant, verdicts


def write_tolerance(path: Path, tolerance: AuditTolerance, spread: Spread, per_variant: dict[str, Spread],
                    margin: float) -> None:
    """Write the calibrated tolerance with the spread it came from."""
    path.write_text(json.dumps({"tolerance": asdict(tolerance), "margin": margin, "spread": asdict(spread),
                                "per_variant": {k: asdict(v) for k, v in per_variant.items()}}, indent=1) + "\n")

"""`verinfer training …`: the auditor role, the calibration of its tolerance, the attack report and the devnet."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.live import Live
from rich.table import Table

console = Console(soft_wrap=True)
training_app = typer.Typer(help="Training verification: audit runs, calibrate, report attacks, devnet.",
                           no_args_is_help=True)


@training_app.command("audit")
def audit(config: Path = typer.Option(..., help="JSON: rpc, contract, journal, timeout_s, runs[dir, prover, spec]; "
                                             "optional spool (kept responses), recompute_lock (a shared lock file)."),
          key_env: str = typer.Option("VERINFER_PRIVATE_KEY", help="Env variable holding the validator's hex key."),
          tolerance: Path = typer.Option(None, help="Tolerance JSON (default: the calibrated one)."),
          trajectory: Path = typer.Option(None, help="Trajectory policy JSON (default: the calibrated one)."),
          verbose: bool = typer.Option(True)) -> None:
    """Follow the configured runs on chain, audit the drawn steps (a newer draw within k steps interrupts an older
    audit), sign and submit this validator's votes."""
    from node.training.auditor import TOLERANCE_FILE, load_shape_tolerances, load_tolerance
    from node.training.calibration import TRAJECTORY_FILE, load_trajectory_policy
    from node.training.service import WatchedRun, run_auditor
    from node.training.spec import RunSpec

    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    key = os.environ.get(key_env, "")
    if not key:
        raise typer.BadParameter(f"set {key_env} to the validator's hex private key")
    cfg = json.loads(config.read_text())
    k = int(cfg.get("k", 1))
    runs = [WatchedRun(out_dir=Path(r["dir"]), prover=r["prover"], spec=RunSpec.model_validate(r["spec"]), k=k)
            for r in cfg["runs"]]  # the declaration as registered, never the prover's copy
    policy = load_trajectory_policy(trajectory) if trajectory is not None else (
        load_trajectory_policy() if TRAJECTORY_FILE.exists() else None)
    run_auditor(runs, rpc_url=cfg["rpc"], contract_address=cfg["contract"], validator_key=bytes.fromhex(
        key.removeprefix("0x")), tolerance=load_tolerance(tolerance or TOLERANCE_FILE), trajectory=policy,
        journal=Path(cfg["journal"]), timeout_s=float(cfg["timeout_s"]),
        spool=Path(cfg["spool"]) if cfg.get("spool") else None,
        recompute_lock=Path(cfg["recompute_lock"]) if cfg.get("recompute_lock") else None,
        shape_tolerances=load_shape_tolerances(tolerance or TOLERANCE_FILE))


@training_app.command("calibrate")
def calibrate(work: Path = typer.Option(Path("bench-results/training-calibration"), help="Scratch folder."),
              steps: int = typer.Option(70, help="Steps per honest variant (3 variants, every step audited)."),
              margin: float = typer.Option(10.0, help="Threshold = margin × honest maximum."),
              write: bool = typer.Option(False, help="Write node/training/tolerance.json."),
              pool: list[Path] = typer.Option([], help="Earlier runs' tolerance files whose honest spread is "
                                                       "pooled with this run's (each column's largest value)."),
              shape: str = typer.Option("tiny", help="Model shape: tiny or smollm2 (SmolLM2-135M's architecture)."),
              anchor_every: int = typer.Option(5, help="m: steps per anchor (every step is drawn and served at its "
                                                       "window's anchor, so the shadow keeps K = m states)."),
              drop_responses: bool = typer.Option(False, help="Delete each variant's served checkpoints once audited "
                                                              "(smollm2: 1.08 GB per state)."),
              ) -> None:
    """Measure the honest spread across thread counts, world sizes and reduction orders; set the tolerance."""
    from node.training.auditor import TOLERANCE_FILE
    from node.training.calibration import (
        compute_pooled_spread,
        compute_tolerance,
        load_spread,
        run_honest_calibration,
        write_tolerance,
    )
    from node.training.spec import RunSpec, UnknownShape, compute_keep_checkpoints, get_shape

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        model_shape = get_shape(shape)
    except UnknownShape as e:
        raise typer.BadParameter(str(e), param_hint="--shape") from e
    base = RunSpec(shape=model_shape, steps=steps, anchor_every=anchor_every,
                   keep_checkpoints=compute_keep_checkpoints(anchor_every, offchain=False))
    spread, per_variant, verdicts = run_honest_calibration(base, work, drop_responses=drop_responses)
    for i, path in enumerate(pool, start=1):  # honest data of earlier runs (another day, another load) counts too
        earlier, earlier_variants = load_spread(path)
        spread = compute_pooled_spread([spread, earlier])
        per_variant.update({f"pool{i}:{name}": v for name, v in earlier_variants.items()})
    # α of the KS test: 1e-3 (Bonferroni over the matrices) gave 0 of 50 honest inits rejected, 1e-2 gave 1 of 50
    tolerance = compute_tolerance(spread, margin, init_alpha=1e-3)
    table = Table("variant", "steps", "param err", "momentum err", "named err", "lsh err", "replica lsh", "recompute s")
    for name, s in per_variant.items():
        table.add_row(name, str(s.n), f"{s.rel_param_error_max:.3g}", f"{s.rel_momentum_error_max:.3g}",
                      f"{s.named_rel_error_max:.3g}", f"{s.lsh_rel_error_max:.3g}",
                      f"{s.replica_lsh_rel_error_max:.3g}", f"{s.recompute_s_median:.3f}")
    console.print(table)
    console.print(f"honest audited steps: {spread.n}; init audits: {sum(v.step == 0 for v in verdicts)}; "
                  f"tolerance: {asdict(tolerance)}")
    work.mkdir(parents=True, exist_ok=True)
    write_tolerance(work / "tolerance.json", tolerance, spread, per_variant, margin)
    if write:  # tiny: the file's default; another shape: its own entry under per_shape
        write_tolerance(TOLERANCE_FILE, tolerance, spread, per_variant, margin, shape=shape)


@training_app.command("trajectory")
def trajectory(work: Path = typer.Option(Path("bench-results/training-trajectory"), help="Scratch folder."),
               steps: int = typer.Option(30, help="Steps per run."),
               fit_seeds: int = typer.Option(2, help="Data seeds per honest variant the thresholds are fit on."),
               held_out_seeds: int = typer.Option(2, help="Further data seeds per variant: the false-raise check."),
               attack_step: int = typer.Option(20, help="The step each one-cheat attack run cheats at."),
               margin: float = typer.Option(1.5, help="Threshold = margin × the largest honest |z|."),
               multiplier: float = typer.Option(4.0, help="Audit-rate multiplier when a score passes its threshold."),
               write: bool = typer.Option(False, help="Write node/training/trajectory.json.")) -> None:
    """Calibrate the trajectory checks (loss jumps, gradient-norm outliers) on honest runs; run each attack once."""
    from node.training.calibration import TRAJECTORY_FILE, run_trajectory_calibration, write_trajectory_policy
    from node.training.spec import RunSpec

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    base = RunSpec(steps=steps, anchor_every=5)
    result = run_trajectory_calibration(base, work, range(fit_seeds), range(fit_seeds, fit_seeds + held_out_seeds),
                                        attack_step, margin, multiplier)
    work.mkdir(parents=True, exist_ok=True)
    write_trajectory_policy(work / "trajectory.json", result, margin)
    if write:
        write_trajectory_policy(TRAJECTORY_FILE, result, margin)
    doc = json.loads((work / "trajectory.json").read_text())
    table = Table("set", "run", "max |z| loss jump", "max |z| grad norm", "raised", "near cheat", "lr check")
    for part in ("fit", "held_out", "attacks"):
        for r in doc[part]:
            near = (f"{r['near_loss_jump_z']:.1f} / {r['near_grad_norm_z']:.1f} "
                    f"{'RAISED' if r['raised_near_cheat'] else '-'}") if part == "attacks" else ""
            table.add_row(part, r["run"], f"{r['max_abs_loss_jump_z']:.2f}", f"{r['max_abs_grad_norm_z']:.2f}",
                          "yes" if r["raised"] else "no", near, "FAIL" if r["schedule_error"] else "ok")
    console.print(table)
    console.print(f"policy: {doc['policy']}; honest false raises (held out): "
                  f"{sum(r['raised'] for r in doc['held_out'])} of {len(doc['held_out'])} runs")


@training_app.command("attacks")
def attacks(work: Path = typer.Option(Path("bench-results/training-attacks"), help="Scratch folder."),
            steps: int = typer.Option(14, help="Steps of the cheating job."),
            p: float = typer.Option(0.25, help="Audit rate for the expected-detection columns."),
            k: float = typer.Option(3.0, help="Measured recompute ÷ step ratio (scripts/bench_training.py)."),
            init_seeds: int = typer.Option(50, help="Honest inits for the KS false-positive rate.")) -> None:
    """Run every attack as a real cheating job, audit it with the calibrated tolerance, print the report."""
    from node.training.auditor import load_tolerance
    from node.training.report import (
        compute_attack_rows,
        get_rows_json,
        measure_careful_thief,
        measure_init_false_positives,
        run_attack_job,
    )
    from node.training.spec import RunSpec

    logging.basicConfig(level=logging.WARNING)
    spec = RunSpec(steps=steps, anchor_every=4, response_deadline_s=5.0)
    tolerance = load_tolerance()
    verdicts = run_attack_job(spec, work, tolerance)
    rows = compute_attack_rows(spec, verdicts, p, k)
    fpr = measure_init_false_positives(RunSpec(), init_seeds, tolerance.init_alpha)
    careful = measure_careful_thief(spec, tolerance)
    table = Table("attack", "step", "caught", "reason", "P(catch | audited)", "per-audit catch", "E[audits]",
                  "E[steps] at p")
    for r in rows:
        table.add_row(r.attack, str(r.step), "yes" if r.caught else "NO", r.reason, f"{r.detect_given_audited:.2f}",
                      f"{r.per_audit_catch:.3f}", f"{r.expected_audits_to_detection:.1f}",
                      f"{r.expected_steps_to_detection:.0f}")
    console.print(table)
    honest = [v for v in verdicts if v.step not in {r.step for r in rows}]
    console.print(f"honest steps of the cheating job rejected: {sum(not v.valid for v in honest)} of {len(honest)}; "
                  f"KS init false positives: {fpr['rejected']} of {fpr['seeds']}, moment tests: "
                  f"{fpr['moment_rejected']} of {fpr['seeds']}; careful thief (norms reset): KS min p "
                  f"{careful['min_p_value']:.2e} vs level {careful['level']:.2e}, moments min p "
                  f"{careful['moment_min_p_value']:.2e} ({careful['moment_worst']}) vs level "
                  f"{careful['moment_level']:.2e}, caught: {careful['caught']}")
    work.mkdir(parents=True, exist_ok=True)
    (work / "attacks.json").write_text(json.dumps({"rows": get_rows_json(rows), "init_false_positives": fpr,
                                                   "careful_thief": careful,
                                                   "p": p, "k": k, "tolerance": asdict(tolerance)}, indent=1))


def _state_table(state: dict[str, Any]) -> Table:
    table = Table("run", "anchors", "last step", "audits", "failed", "bond (ETH)", "slashed")
    for name, r in state["runs"].items():
        table.add_row(name, str(r["anchors"]), str(r["last_step"]), str(len(r["audits"])),
                      str(sum(not a["valid"] for a in r["audits"])), f"{r['bond'] / 1e18:.2f}", str(r["slashed"]))
    return table


@training_app.command("devnet")
def devnet(out: Path = typer.Option(Path("bench-results/training-devnet"), help="Output folder."),
           shape: str = typer.Option("smollm2", help="Model shape: smollm2 (SmolLM2-135M's architecture, the demo) "
                                                     "or tiny (the tests' llama)."),
           steps: int = typer.Option(None, help="Steps per run (default: the shape's demo plan)."),
           anchor_every: int = typer.Option(None, help="m: steps per anchor (default: the shape's demo plan)."),
           audit_rate: float = typer.Option(None, help="p: audit rate (default: the shape's demo plan, 0.4)."),
           timeout: float = typer.Option(1800.0, help="Seconds before giving up."),
           k: int = typer.Option(1, help="Measured recompute ÷ step (the auditors abandon no drawn audit).")) -> None:
    """Anvil + contracts, an honest and two cheating gloo jobs (undeclared data; the hidden-state cheater), three
    validators each running its own auditor process; exit 0 iff both cheaters are slashed and the honest run is
    not."""
    from node.training.devnet import compute_catch_probability, get_devnet_plan, run_devnet
    from node.training.spec import UnknownShape

    logging.basicConfig(level=logging.WARNING)
    try:
        plan = get_devnet_plan(shape, steps, anchor_every, audit_rate)
    except UnknownShape as e:
        raise typer.BadParameter(str(e), param_hint="--shape") from e
    console.print(f"shape {plan.shape}: {plan.steps} steps, m = {plan.anchor_every}, K = {plan.keep_checkpoints}, "
                  f"p = {plan.audit_rate}; P(a cheating step is audited) = {compute_catch_probability(plan):.3f}")
    with Live(Table(), console=console, refresh_per_second=2) as live:
        summary = run_devnet(out, plan, timeout, k=k, on_state=lambda s: live.update(_state_table(s)))
        live.update(_state_table(summary["final"]))
    console.print(f"votes counted per validator: {summary['votes']}; auditors: {summary['journals']}")
    console.print(f"nonce replay: {summary['nonce_replay']}; gas per anchored step: "
                  f"{summary['gas_per_anchored_step']:.0f}; outputs in {out}")
    mem = summary["memory"]
    console.print(f"peak memory (RSS of the process tree, every {mem['period_s']} s): {mem['peak_rss_gb']} GB at "
                  f"{mem['peak_at_s']} s {mem['peak_by_role_gb']}; wall {summary['wall_s']} s; "
                  f"step times {summary['step_times']}")
    console.print("[green]both cheaters slashed, honest run kept its bond[/green]" if summary["ok"]
                  else "[red]devnet FAILED[/red]")
    raise typer.Exit(0 if summary["ok"] else 1)

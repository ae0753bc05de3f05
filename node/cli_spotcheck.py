"""`verinfer spotcheck`: the memory spot-check simulation (issue 18)."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import typer
from rich.console import Console
from rich.live import Live
from rich.table import Table

if TYPE_CHECKING:  # the simulation pulls in torch and transformers: only when the command runs
    from node.spotcheck.sim import SimConfig, SimResult

spotcheck_app = typer.Typer(help="Memory spot checks: stuffed device memory, a pinger, a verifier.",
                            no_args_is_help=True)
console = Console()
if not console.is_terminal:  # logs and CI: do not squeeze the table into 80 columns
    console = Console(width=140)


@spotcheck_app.callback()
def spotcheck() -> None:
    """Memory spot checks (issue 18): simulated devices, memory stuffing, a pinger and a verifier."""


class LiveBoard:
    """Per-device counters shown while the simulation runs."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.phase = ""
        self.rows: dict[str, dict[str, Any]] = {d.device_id: {"behaviour": d.behaviour, "lat": [], "errors": 0,
                                                              "missing": 0, "fill": None, "verdict": ""}
                                                for d in config.devices}

    def on_event(self, kind: str, payload: dict[str, Any]) -> None:
        """Fold one event of the run into the counters."""
        if kind == "phase":
            self.phase = str(payload["text"])
            return
        row = self.rows.get(str(payload.get("device_id")))
        if row is None:
            return
        if kind == "ready":
            row["fill"] = payload["fill_s"]
        elif kind == "exchange":
            if payload["received_ns"] is None:
                row["missing"] += 1
            else:
                row["lat"].append((payload["received_ns"] - payload["sent_ns"]) / 1e6)
            row["errors"] += payload["error"] is not None
        elif kind == "verdict":
            row["verdict"] = ", ".join(payload["failures"]) or "passed"

    def render(self) -> Table:
        """Return the table of the run so far."""
        table = Table(title=f"spot checks — {self.phase}", title_justify="left")
        for col in ("device", "behaviour", "fill s", "answers", "p50 ms", "max ms", f"> X={self.config.x_ms:g} ms",
                    "missing", "errors", "verdict"):
            table.add_column(col)
        for device_id, row in self.rows.items():
            lat = row["lat"]
            table.add_row(device_id, row["behaviour"], "" if row["fill"] is None else f"{row['fill']:.2f}",
                          str(len(lat)), f"{np.median(lat):.1f}" if lat else "", f"{max(lat):.1f}" if lat else "",
                          str(sum(x > self.config.x_ms for x in lat)), str(row["missing"]), str(row["errors"]),
                          row["verdict"])
        return table


def render_chain(result: SimResult) -> Table:
    """Return the table of what the chain did to each device's operator."""
    ok = "exactly the cheaters' operators slashed" if result.chain_ok else "WRONG operators slashed"
    table = Table(title=f"on chain (SpotCheck, 3 validators): {ok}", title_justify="left")
    for col in ("device", "cheats", "operator", "stake before", "stake after", "jailed", "windows"):
        table.add_column(col)
    cheats = {d.device_id: d.cheats for d in result.devices}
    names = {0: "open", 1: "passed", 2: "failed"}
    for o in result.chain or ():
        table.add_row(o.device_id, str(cheats[o.device_id]), o.operator[:10] + "…", f"{o.stake_before / 1e18:g}",
                      f"{o.stake_after / 1e18:g}", str(o.jailed), ", ".join(names[w] for w in o.windows))
    return table


def write_outputs(result: SimResult, config: SimConfig, out: Path) -> tuple[Path, Path]:
    """Write the result JSON and the detection plot; return their paths."""
    from node.spotcheck.report import compute_detection_curves, write_detection_plot
    from node.spotcheck.sim import get_result_json

    out.mkdir(parents=True, exist_ok=True)
    data = get_result_json(result)
    n_blocks = ((config.arena_mib << 20) - config.state_tokens * 128 * 4) // config.block_bytes
    rates = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
    curves = compute_detection_curves(n_blocks, config.labels_count, config.labels_share, config.window_s,
                                      (0.001, 0.01, 0.10, 0.50), rates, trials=200)
    observed = [(spec.evict_fraction, config.rate_hz, float(np.mean([not v.passed for v in d.verdicts])))
                for spec, d in zip(config.devices, result.devices, strict=True) if spec.behaviour == "evict"]
    data["detection_curves"] = [{"fraction": c.fraction, "rates_hz": c.rates_hz, "analytic": c.analytic,
                                 "monte_carlo": c.monte_carlo} for c in curves]
    json_path = out / "spotcheck-sim.json"
    json_path.write_text(json.dumps(data, indent=1))
    plot_path = out / "detection.png"
    write_detection_plot(curves, observed, plot_path,
                         f"{n_blocks} blocks, {config.labels_count} per labels challenge, "
                         f"{config.labels_share:.0%} labels challenges, {config.window_s:g} s windows")
    return json_path, plot_path


@spotcheck_app.command("sim")
def sim(
    out: Path = typer.Option(Path("bench-results/spotcheck"), help="Folder for the record, JSON and plot."),
    run_s: float = typer.Option(40.0, min=1.0, help="Seconds of challenges."),
    window_s: float = typer.Option(20.0, min=1.0, help="Verdict window length in seconds."),
    rate_hz: float = typer.Option(2.0, min=0.01, help="Challenges per second per device (Poisson)."),
    x_ms: float = typer.Option(500.0, min=1.0, help="Latency bound X in milliseconds."),
    arena_mib: int = typer.Option(64, min=1, help="Proximal memory Y per device in MiB."),
    cpu_hog: bool = typer.Option(True, help="Run a CPU-burning process beside the devices."),
    chain: bool = typer.Option(False, help="Run anvil: bonded operators, 3 validators voting, slashing on chain."),
) -> None:
    """Run honest and cheating devices, the pinger and the verifier; exit 0 only if exactly the cheaters fail."""
    from node.spotcheck.sim import SimConfig, run_sim

    config = SimConfig(run_s=run_s, window_s=window_s, rate_hz=rate_hz, x_ms=x_ms, arena_mib=arena_mib,
                       cpu_hog=cpu_hog)
    board = LiveBoard(config)
    with Live(board.render(), console=console, refresh_per_second=4) as live:
        def on_event(kind: str, payload: dict[str, Any]) -> None:
            board.on_event(kind, payload)
            live.update(board.render())
        result = run_sim(config, out, on_event, chain=chain)
        board.phase = "done: " + ("every cheater caught, no honest device flagged" if result.ok else "FAILED")
        live.update(board.render())
    json_path, plot_path = write_outputs(result, config, out)
    caught = defaultdict(list)
    for d in result.devices:
        caught["flagged" if d.flagged else "passed"].append(d.device_id)
    console.print(f"flagged: {', '.join(caught['flagged']) or '-'}; passed: {', '.join(caught['passed']) or '-'}")
    f = result.feasibility
    if f:
        m = f["margins"]
        console.print(f"(X, Y, Z) = ({config.x_ms:g} ms, {config.arena_mib} MiB, {f['inputs']['z_min_s']:.2f} s): "
                      f"X/honest max {m['x_over_honest']:.2f}, Z/X {m['z_over_x']:.1f}, far/X {m['far_over_x']:.2f}, "
                      f"undeclared/free {m['undeclared_over_free']:.0f} → {'sound' if f['sound'] else 'NOT sound'}")
        if "throughput" in f:
            t = f["throughput"]
            console.print(f"declared throughput: honest utilisation {t['honest_utilisation_min']:.2f}–"
                          f"{t['honest_utilisation_max']:.2f} vs least {t['min_utilisation']:.2f} "
                          f"(margin {t['margin']:.2f})")
    if result.chain is not None:
        console.print(render_chain(result))
    console.print(f"{result.elapsed_s:.0f} s; JSON {json_path}, plot {plot_path}, record {result.record_path}")
    raise typer.Exit(compute_sim_exit_code(result.ok, f))


def compute_sim_exit_code(ok: bool, feasibility: dict[str, Any] | None) -> int:
    """Return the sim's exit code: 0 only if exactly the cheaters failed and the measured (X, Y, Z) are sound."""
    sound = feasibility is None or bool(feasibility["sound"])  # None: no feasibility measured in this run
    return 0 if ok and sound else 1

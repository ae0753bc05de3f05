"""Run every benchmark and write one table: the dashboard of verinfer's numbers.

Each benchmark runs as its own process (scripts/bench_*.py; the engine benchmark from .venv-vllm when it
exists, so both backends are measured in one run) and writes its JSON to bench-results/; this script
reads those files and prints one table of headline numbers, with the goal each is held to, and writes it
as bench-results/bench_all.json and bench-results/bench_all.md. A benchmark that fails is reported as
failed (and makes the exit code 1); the others still run.
Usage: python scripts/bench_all.py [--quick] [--only stage1 gas ...] [--from-existing] [--readme]
With --readme the README's numbers table (between its bench_all markers) is replaced by this run's
bench_all.md and the line that says when and under what load it was measured: the README's table is
generated, never typed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench-results"
Row = tuple[str, str, str, str]  # metric, value, goal, verdict

# name -> (arguments for a full run, arguments for --quick)
BENCHMARKS: dict[str, tuple[list[str], list[str]]] = {
    "stage1": ([], ["--repeats", "5"]),
    "stage2": ([], ["--positions", "64"]),
    "engine": ([], ["--tokens", "64", "--repeats", "1"]),
    "daemon": (["--repeats", "7"], ["--tokens", "64", "--repeats", "2", "--batches", "1", "4"]),
    "p2p": ([], ["--fetches", "10"]),
    "gas": ([], []),
    "payload": ([], ["--tokens", "64", "256"]),
}


def _python_for(name: str) -> str:
    vllm = ROOT / ".venv-vllm" / "bin" / "python"
    return str(vllm) if name == "engine" and vllm.exists() else sys.executable


def _goal(value: float, goal: float, higher_is_better: bool = True) -> str:
    ok = value >= goal if higher_is_better else value <= goal
    return "met" if ok else "missed"


def rows_stage1(d: dict[str, Any]) -> list[Row]:
    """Headline rows of bench_stage1.json."""
    return [(f"stage 1, {r['tokens']} tokens, full check", f"{r['full_positions_per_s']:,.0f} positions/s",
             f"≥ {d['target']:,} positions/s", _goal(r["full_positions_per_s"], d["target"])) for r in d["results"]]


def rows_stage2(d: dict[str, Any]) -> list[Row]:
    """Headline rows of bench_stage2.json."""
    return [(f"stage 2 per position, {name}", f"{r['fast_ms']:.2f} ms ({r['speedup']:.1f}× the reference)", "-", "-")
            for name, r in d["results"].items()]


def rows_engine(d: dict[str, Any]) -> list[Row]:
    """Headline rows of bench_engine.json: generation vs validation, measured in one run."""
    out: list[Row] = []
    for r in d["results"]:
        out.append((f"{r['backend']}: decode, {r['tokens']} tokens", f"{r['decode_tok_per_s']:.1f} tok/s", "-", "-"))
        out.append((f"{r['backend']}: generation ÷ validation prefill (one run)", f"{r['generate_over_prefill']:.1f}×",
                    "-", "-"))
        out.append((f"{r['backend']}: executer overhead (per-token step + artifact + fingerprints)",
                    f"{100 * r['overhead_share']:.1f} % of generation",
                    "≤ 2 %", _goal(100 * r["overhead_share"], 2, higher_is_better=False)))
        if "batch_overhead_share" in r:
            out.append((f"{r['backend']}: executer overhead at batch {r['batch']} "
                        f"({r['batch_decode_tok_per_s']:.0f} tok/s together)",
                        f"{100 * r['batch_overhead_share']:.1f} % of generation", "≤ 2 %",
                        _goal(100 * r["batch_overhead_share"], 2, higher_is_better=False)))
        if "prefill_peak_fraction" in r:
            out.append((f"{r['backend']}: validation prefill, share of the fp32 matmul peak "
                        f"({r['matmul_peak_gflops']:.0f} GFLOP/s)", f"{100 * r['prefill_peak_fraction']:.0f} %",
                        "≥ 60 %", _goal(r["prefill_peak_fraction"], 0.6)))
    return out


def rows_daemon(d: dict[str, Any]) -> list[Row]:
    """Headline rows of bench_daemon.json."""
    rows = [(f"validator: inferences/h, {d['tokens']} tokens", f"{d['inferences_per_hour']:,.0f}", "-", "-"),
            ("validator: share of the prefill bound", f"{100 * d['fraction_of_bound']:.1f} %", "≥ 90 %",
             _goal(d["fraction_of_bound"], 0.9))]
    if "generate_over_verify" in d:  # measured in the same run as the validation
        rows += [("generation ÷ whole validation path (÷ prefill alone), one run",
                  f"{d['generate_over_verify']:.1f}× ({d['generate_over_prefill']:.1f}×)", "-", "-"),
                 ("stage-2 measurement + decision, share of the prefill",
                  f"{100 * d['stage2_share_of_prefill']:.1f} %", "≤ 10 %",
                  _goal(d["stage2_share_of_prefill"], 0.10, higher_is_better=False))]
    if "batched_per_hour_per_core" in d:
        per = d["batched_per_hour_per_core"]
        best = str(d["best_batch"])
        rows.append((f"validator: inferences/h/core, batch 1 → best batch {best}",
                     f"{per.get('1', 0):,.0f} → {per[best]:,.0f}", "-", "-"))
    return rows


def rows_p2p(d: dict[str, Any]) -> list[Row]:
    """Headline rows of bench_p2p.json."""
    out: list[Row] = []
    for name, r in d["results"].items():
        # issue 21: a warm 256-token fetch within 2 ms from a peer, i.e. a host in another process (the
        # same-process row shares one GIL between both hosts, which no deployment does: docs/performance.md)
        goal = name == "libp2p 256 tokens, server in another process"
        out.append((f"payload fetch, {name}", f"{r['median_ms']:.2f} ms", "≤ 2 ms" if goal else "-",
                    _goal(r["median_ms"], 2, higher_is_better=False) if goal else "-"))
    return out


def rows_gas(d: dict[str, Any]) -> list[Row]:
    """Headline rows of bench_gas.json, with the issue's gas targets where one applies."""
    gas, targets = d["gas"], {"commitInference": 80_000, "submitVerdicts (1 signature": 120_000,
                              "proveFraud": 150_000}
    out: list[Row] = []
    for name, used in gas.items():
        goal = next((t for prefix, t in targets.items() if name.startswith(prefix)), None)
        out.append((f"gas: {name}", f"{used:,}", f"≤ {goal:,}" if goal else "-",
                    _goal(used, goal, higher_is_better=False) if goal else "-"))
    return out


def rows_payload(d: dict[str, Any]) -> list[Row]:
    """Headline rows of bench_payload.json: bytes per token of the whole payload, raw and compressed."""
    out: list[Row] = []
    for r in d["results"]:
        t, goal = r["per_token"], d["goal_bytes_per_token_256"] if r["tokens"] == 256 else None
        versions = [v for v in ("wire_v1", "wire_v2", "wire_v3") if v in t]  # v3 from issue 21 on
        best = min(t[v] for v in versions)
        names = " / ".join(v.replace("_", " ") for v in versions)
        out.append((f"payload bytes/token, {r['tokens']} tokens (raw / {names})",
                    " / ".join(f"{x:.1f}" for x in [t["raw"], *(t[v] for v in versions)]),
                    f"≤ {goal}" if goal else "-", _goal(best, goal, higher_is_better=False) if goal else "-"))
    return out


README = ROOT / "README.md"
README_BEGIN = "<!-- bench_all:begin (scripts/bench_all.py --readme writes this) -->"
README_END = "<!-- bench_all:end -->"


def write_readme_table(table_md: str, provenance: str) -> None:
    """Replace the README's generated numbers table (between the markers) with this run's."""
    text = README.read_text()
    pattern = re.compile(re.escape(README_BEGIN) + ".*?" + re.escape(README_END), re.S)
    if not pattern.search(text):
        raise SystemExit(f"README.md has no {README_BEGIN!r} … {README_END!r} block")
    block = f"{README_BEGIN}\n{provenance}\n\n{table_md.rstrip()}\n{README_END}"
    README.write_text(pattern.sub(lambda _: block, text))


EXTRACT: dict[str, Callable[[dict[str, Any]], list[Row]]] = {
    "stage1": rows_stage1, "stage2": rows_stage2, "engine": rows_engine, "daemon": rows_daemon, "p2p": rows_p2p,
    "gas": rows_gas, "payload": rows_payload,
}


def main() -> int:
    """Run the benchmarks, print and write the dashboard."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats and tokens (minutes, noisier)")
    parser.add_argument("--only", nargs="+", choices=list(BENCHMARKS), default=list(BENCHMARKS))
    parser.add_argument("--from-existing", action="store_true", help="only tabulate the JSON already there")
    parser.add_argument("--readme", action="store_true", help="write the table into README.md's generated block")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    RESULTS.mkdir(exist_ok=True)
    console = Console(width=140) if not Console().is_terminal else Console()
    status: dict[str, dict[str, Any]] = {}
    for name in args.only:
        json_path = RESULTS / f"bench_{name}.json"
        if not args.from_existing:
            full, quick = BENCHMARKS[name]
            cmd = [_python_for(name), str(ROOT / "scripts" / f"bench_{name}.py"), *(quick if args.quick else full),
                   "--out", str(json_path)]
            console.print(f"[bold]bench_{name}[/bold]: {' '.join(cmd[1:])}")
            start = time.monotonic()
            done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
            status[name] = {"seconds": round(time.monotonic() - start, 1), "exit": done.returncode}
            if done.returncode != 0:
                console.print(f"[red]bench_{name} failed ({done.returncode}):[/red]\n{done.stderr[-2000:]}")
                continue
        if not json_path.exists():
            status.setdefault(name, {})["missing"] = True
            continue
        status.setdefault(name, {})["rows"] = EXTRACT[name](json.loads(json_path.read_text()))

    table = Table(title="verinfer benchmarks" + (" (quick)" if args.quick else ""))
    for column in ("benchmark", "metric", "value", "goal", ""):
        table.add_column(column, justify="right" if column == "value" else "left")
    lines = ["| benchmark | metric | value | goal | |", "|---|---|---:|---|---|"]
    for name, s in status.items():
        for metric, value, goal, verdict in s.get("rows", [("-", "failed" if s.get("exit") else "no result", "-",
                                                               "-")]):
            mark = {"met": "[green]met[/green]", "missed": "[red]missed[/red]"}.get(verdict, "")
            table.add_row(name, metric, value, goal, mark)
            lines.append(f"| {name} | {metric} | {value} | {goal} | {verdict if verdict != '-' else ''} |")
    console.print(table)
    (RESULTS / "bench_all.md").write_text("\n".join(lines) + "\n")
    if args.readme:
        provenance = (f"Generated by `python scripts/bench_all.py{' --quick' if args.quick else ''} --readme` on "
                      f"{datetime.date.today().isoformat()}, {os.cpu_count()} CPUs, load average "
                      f"{load_before:.1f} at the start and {os.getloadavg()[0]:.1f} at the end.")
        write_readme_table("\n".join(lines), provenance)
    (RESULTS / "bench_all.json").write_text(json.dumps({"quick": args.quick, "benchmarks": status}, indent=1) + "\n")
    console.print(f"wrote {RESULTS / 'bench_all.md'} and {RESULTS / 'bench_all.json'}")
    return 1 if any(s.get("exit") or s.get("missing") for s in status.values()) else 0


if __name__ == "__main__":
    sys.exit(main())

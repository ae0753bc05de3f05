"""Benchmark MoE checks: memory and time of one expert's check, one router's, the link duty's, vs a full prefill.

Each mode runs in its own subprocess (so peak RSS is its own): it loads only what that duty loads, then
checks one teacher-forced sequence (chat prompt + a fixed response) recorded by the executer. Also reports
the bytes per token of the per-expert commitments and of the payload rows. Prints a table and writes JSON
(default bench-results/bench_moe.json).
Usage: python scripts/bench_moe.py [--model smollm2-moe-4x135m] [--expert layer3.e1] [--repeat 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

RESPONSE = ("The capital of France is Paris. It lies on the Seine in the north of the country, and it has been "
            "the centre of French political, economic and cultural life for centuries. Its museums, such as the "
            "Louvre, and its monuments, such as the Eiffel Tower, draw millions of visitors every year.")
PROMPT = "What is the capital of France? Tell me a little about it."
MODES = ("baseline", "expert", "router", "link", "full")


def _status_mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _rss_mib() -> float:
    # VmHWM (peak RSS of this process image): getrusage's ru_maxrss survives exec, so a child started by a
    # parent that held the full model would report the parent's peak.
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _sequence(folder: Path) -> list[int]:
    from node.engines.tokenizer import ModelTokenizer

    tok = ModelTokenizer(folder, True)
    return [*tok.encode_chat([{"role": "user", "content": PROMPT}]), *tok.encode_response(RESPONSE)]


def _best(fn: Any, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def run_mode(mode: str, model: str, expert: str, repeat: int) -> dict[str, Any]:
    """Load what one duty loads, check the recorded sequence, return time, weight bytes and peak RSS."""
    import torch

    torch.set_num_threads(1)
    from node.moe.model import materialise_moe
    from node.moe.trace import build_commitment, record_trace
    from node.moe.validate import load_expert, load_router, load_shared, verify_expert, verify_link, verify_router
    from node.protocol.moe import ExpertKey

    folder = materialise_moe(model)
    ids = _sequence(folder)
    trace_file = Path(f"/tmp/bench_moe_trace_{model}.pt")
    trace, commitment = torch.load(trace_file, weights_only=False)  # the executer's payload, recorded once
    base = _rss_mib()
    now = _status_mib("VmRSS")
    key = ExpertKey.parse(expert)
    out: dict[str, Any] = {"mode": mode, "tokens": len(ids), "rss_before_load_mib": round(base, 1)}
    if mode == "expert":
        start = time.perf_counter()
        weights = load_expert(folder, key)
        out["load_s"] = time.perf_counter() - start
        leaves = commitment.leaves_of(key)
        inputs = trace.get_expert_inputs(key)
        out["check_s"] = _best(lambda: verify_expert(weights, leaves, inputs), repeat)
        out["weight_bytes"] = weights.nbytes()
        out["rows"] = len(leaves)
    elif mode == "router":
        start = time.perf_counter()
        router = load_router(folder, key.layer)
        out["load_s"] = time.perf_counter() - start
        rl = [r for r in commitment.router if r.layer == key.layer]
        rows = trace.inputs[key.layer, [r.position for r in rl]]
        out["check_s"] = _best(lambda: verify_router(router, rl, rows), repeat)
        out["weight_bytes"] = int(router.nbytes)
    elif mode == "link":
        start = time.perf_counter()
        shared = load_shared(folder)
        out["load_s"] = time.perf_counter() - start
        out["check_s"] = _best(lambda: verify_link(shared, ids, commitment, trace), repeat)
        out["weight_bytes"] = sum(int(p.nbytes) for n, p in shared.named_parameters() if ".experts." not in n)
    elif mode == "full":
        from transformers import AutoModelForCausalLM

        start = time.perf_counter()
        full: Any = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
        full.eval()
        out["load_s"] = time.perf_counter() - start
        with torch.inference_mode():
            out["check_s"] = _best(lambda: full(torch.tensor([ids]), use_cache=False), repeat)
        out["weight_bytes"] = sum(int(p.nbytes) for p in full.parameters())
    out["peak_rss_mib"] = round(_rss_mib(), 1)
    out["rss_growth_mib"] = round(_status_mib("VmRSS") - now, 1)  # resident now vs before loading: what stays
    if mode == "full":  # the executer's extra cost: trace + commitment of the same sequence (after the memory)
        out["record_s"] = _best(lambda: build_commitment(record_trace(full, ids)), 1)
    return out


def prepare(model: str) -> dict[str, Any]:
    """Record the executer's trace once (saved for the mode subprocesses) and return the commitment sizes."""
    import torch
    from transformers import AutoModelForCausalLM

    from node.moe.model import materialise_moe
    from node.moe.trace import build_commitment, record_trace
    from node.protocol.moe import FP_K, expert_leaf_size

    torch.set_num_threads(1)
    folder = materialise_moe(model)
    ids = _sequence(folder)
    full: Any = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    full.eval()
    trace = record_trace(full, ids)
    commitment = build_commitment(trace)
    torch.save((trace, commitment), f"/tmp/bench_moe_trace_{model}.pt")
    layers, top_k, hidden = trace.num_layers, trace.experts.shape[2], trace.inputs.shape[2]
    router_leaf = 2 + 4 + top_k * 6 + 32
    return {"layers": layers, "experts": trace.num_experts, "top_k": top_k, "hidden": hidden,
            "expert_leaf_bytes": expert_leaf_size(), "fingerprint_bytes": FP_K * 6,
            "commitment_bytes_per_token": layers * (router_leaf + top_k * expert_leaf_size()),
            "fingerprint_bytes_per_token": layers * top_k * FP_K * 6,
            "payload_bytes_per_token": layers * (1 + top_k) * hidden * 4,
            "expert_check_payload_bytes_per_routed_row": hidden * 4 + expert_leaf_size()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-moe-4x135m")
    parser.add_argument("--expert", default="layer3.e1")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--mode", choices=MODES)
    parser.add_argument("--out", type=Path, default=Path("bench-results/bench_moe.json"))
    args = parser.parse_args()
    if args.mode:
        print(json.dumps(run_mode(args.mode, args.model, args.expert, args.repeat)))
        return
    sizes = prepare(args.model)
    rows = []
    for mode in MODES[1:]:
        done = subprocess.run([sys.executable, __file__, "--mode", mode, "--model", args.model, "--expert",
                               args.expert, "--repeat", str(args.repeat)], capture_output=True, text=True, check=True)
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    _print(rows, sizes, args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"benchmark": "moe", "model": args.model, "expert": args.expert,
                                    "machine": platform.machine(), "python": platform.python_version(),
                                    "threads": 1, "modes": rows, "sizes": sizes}, indent=1) + "\n")


def _print(rows: list[dict[str, Any]], sizes: dict[str, Any], args: argparse.Namespace) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{args.model}: one check of {rows[0]['tokens']} tokens, one thread (best of {args.repeat})")
    for column in ("duty", "weights loaded", "load", "check", "RSS growth", "peak RSS", "RSS before load"):
        table.add_column(column, justify="right")
    for r in rows:
        table.add_row(r["mode"], f"{r['weight_bytes'] / 2**20:.2f} MiB", f"{r['load_s']:.3f} s",
                      f"{r['check_s'] * 1000:.1f} ms", f"{r['rss_growth_mib']:.1f} MiB", f"{r['peak_rss_mib']:.0f} MiB",
                      f"{r['rss_before_load_mib']:.0f} MiB")
    console = Console()
    console.print(table)
    console.print(sizes)


if __name__ == "__main__":
    main()

"""Benchmark stage 2's per-position measurements: the reference (full sort) vs the validator's fast path.

Synthetic float32 logits over SmolLM2's 49,152-token vocabulary, 256 positions, one core pinned.
Prints a table and writes JSON (default bench-results/bench_stage2.json).
Usage: python scripts/bench_stage2.py [--positions 256] [--vocab 49152] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from node.checks.stage2 import measure_position, measure_position_fast
from node.protocol.sampler import SamplingParams, sample_position

PARAMS = {"T=1.0": SamplingParams(1.0), "T=0.7 top_p=0.9": SamplingParams(0.7, 0.9),
          "T=0 (greedy)": SamplingParams(0.0), "T=0.8 top_k=40": SamplingParams(0.8, 1.0, 40)}


def time_rows(fn, rows: list[tuple]) -> float:  # type: ignore[type-arg]
    """Return seconds per row (best of 3 passes)."""
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for r in rows:
            fn(*r)
        best = min(best, (time.perf_counter() - start) / len(rows))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--positions", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=49_152)
    parser.add_argument("--out", type=Path, default=Path("bench-results/bench_stage2.json"))
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    rng = np.random.default_rng(0)
    table = Table(title=f"stage 2 per position, vocab {args.vocab}, {args.positions} positions, one core")
    for column in ("params", "reference (full sort)", "fast path", "speed-up", f"{args.positions} positions"):
        table.add_column(column, justify="right")
    results = {}
    for name, params in PARAMS.items():
        rows = []
        for _ in range(args.positions):
            logits = (rng.standard_normal(args.vocab) * 3).astype(np.float32)
            v = int(rng.integers(0, 2**32))
            s = sample_position(logits, params, 5, v)
            rows.append((logits, params, v, s.chosen, np.array(s.token_ids), np.array(s.weights, dtype=np.int64),
                         np.array(s.raw_logprobs, dtype=np.float32)))
        ref, fast = time_rows(measure_position, rows), time_rows(measure_position_fast, rows)
        results[name] = {"reference_ms": ref * 1e3, "fast_ms": fast * 1e3, "speedup": ref / fast,
                         "total_fast_s": fast * args.positions}
        table.add_row(name, f"{ref * 1e3:.2f} ms", f"{fast * 1e3:.2f} ms", f"{ref / fast:.1f}×",
                      f"{fast * args.positions:.3f} s")
    Console().print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"benchmark": "stage2", "positions": args.positions, "vocab": args.vocab,
                                    "machine": platform.machine(), "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()

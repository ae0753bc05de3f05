"""Benchmark stage 1 (the sequence check): positions per second on one core, K = 5.

Prints a table and writes JSON (default bench-results/bench_stage1.json). Three timings per size:
  positions  - the per-position rules only (sha256 uniforms + vectorised checks)
  full       - sequence_check: header, output hash, artifact root (keccak Merkle tree), positions
  from wire  - zstd decode + canonical decoder + full check, what a validator does with fetched bytes
Usage: python scripts/bench_stage1.py [--sizes 256 4096] [--repeats 15] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from node.checks.stage1 import check_positions, sequence_check
from node.executer.synthetic import SyntheticRequest, make_onchain, make_synthetic_artifact
from node.protocol.artifact import decode_artifact_wire, encode_artifact_wire
from node.protocol.sampler import SamplingParams

TARGET = 200_000


def pin_to_one_core() -> str:
    """Pin this process to one CPU so the number is per core."""
    if hasattr(os, "sched_setaffinity"):
        cpu = min(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpu})
        return f"cpu{cpu}"
    return "unpinned"


def median_seconds(fn, repeats: int) -> float:
    """Return the median wall time of fn over repeats runs (after one warm-up)."""
    fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def bench_size(n: int, repeats: int) -> dict[str, float]:
    """Return positions/s of each stage-1 path for an n-token, K=5 artifact."""
    # Stage 1 never looks at the vocabulary beyond id bounds, so a smaller synthetic vocab only
    # makes building the artifact faster; it does not change what is measured.
    req = SyntheticRequest(inference_id=2**200 + n, user_seed=99, params=SamplingParams(0.8, 0.95, 0, n),
                           vocab_size=8192, output_length=n, k=5)
    art = make_synthetic_artifact(req, logits_seed=n)
    onchain = make_onchain(req, art)
    wire = encode_artifact_wire(art)

    def full() -> None:
        assert sequence_check(art.header, art.positions, onchain).valid

    def positions() -> None:
        assert check_positions(art.header.run_seed, art.positions, req.vocab_size).valid

    def from_wire() -> None:
        decoded = decode_artifact_wire(wire)
        assert sequence_check(decoded.header, decoded.positions, onchain).valid

    result = {"tokens": n, "k": 5, "wire_bytes": len(wire)}
    for name, fn in (("positions", positions), ("full", full), ("from_wire", from_wire)):
        seconds = median_seconds(fn, repeats)
        result[f"{name}_ms"] = seconds * 1e3
        result[f"{name}_positions_per_s"] = n / seconds
    return result


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print the table and write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 4096])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--out", type=Path, default=Path("bench-results/bench_stage1.json"))
    args = parser.parse_args(argv)
    core = pin_to_one_core()
    rows = [bench_size(n, args.repeats) for n in args.sizes]
    table = Table(title=f"stage 1 on one core ({core}), K=5, median of {args.repeats}; target {TARGET:,} pos/s")
    for col in ("tokens", "wire KiB", "positions only", "full check", "from wire", "full ms"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(str(r["tokens"]), f"{r['wire_bytes'] / 1024:.1f}", f"{r['positions_positions_per_s']:,.0f}",
                      f"{r['full_positions_per_s']:,.0f}", f"{r['from_wire_positions_per_s']:,.0f}",
                      f"{r['full_ms']:.2f}")
    Console(width=120).print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"benchmark": "stage1", "unit": "positions/s", "target": TARGET, "core": core,
            "python": sys.version.split()[0], "machine": platform.machine(), "processor": platform.processor()}
    args.out.write_text(json.dumps({**meta, "results": rows}, indent=1) + "\n")
    Console(width=120).print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

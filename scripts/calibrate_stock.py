"""Run the stock-sampler campaign (node.calibrate.stock) and fit the "stock sampler" profile.

Phase ``record`` (in .venv-vllm: it runs stock vLLM) appends to docs/calibration/stock-sampler/runs.jsonl,
resumable. Phase ``fit`` (either venv) chooses thresholds on the calibration half, measures the held-out
half and writes the profile and the report.
Usage: OMP_NUM_THREADS=1 nice -n 10 .venv-vllm/bin/python scripts/calibrate_stock.py record --honest 200 --per-attack 25
       .venv/bin/python scripts/calibrate_stock.py fit
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "calibration" / "stock-sampler"
MODEL = "smollm2-135m-instruct"


def record(args: argparse.Namespace) -> None:
    """Build the lab and run the campaign into OUT/runs.jsonl."""
    import torch

    torch.set_num_threads(1)
    from node.calibrate.models import load_engine, make_int8_engine, make_noisy_engine
    from node.calibrate.runs import load_prompts
    from node.calibrate.stock import StockLab, plan, run_campaign
    from node.engines.models import get_model_spec, materialise_model
    from node.engines.tokenizer import ModelTokenizer
    from node.engines.vllm_engine import VllmEngine, VllmOptions

    spec = get_model_spec(MODEL)
    files = materialise_model(spec)
    # vLLM first: its KV-cache budget is a share of host memory minus what this process already holds
    vllm = VllmEngine(files.path, MODEL, VllmOptions(max_model_len=1024, memory_fraction=args.memory_fraction))
    validator = load_engine(files.path, MODEL)
    tiny = materialise_model(get_model_spec("tiny-llama"))
    cheaters = {"int8": make_int8_engine(validator), "bf16": load_engine(files.path, MODEL, dtype="bfloat16"),
                "weight-noise-1pct": make_noisy_engine(validator, 0.01, seed=1),
                "other-model-tiny": load_engine(tiny.path, "tiny-llama")}
    lab = StockLab(ModelTokenizer(files.path, spec.chat), validator, vllm, cheaters, load_prompts(), args.tokens)
    runs = list(plan(args.honest, args.per_attack, args.start))
    started = time.monotonic()

    def progress(done: int, total: int) -> None:
        rate = (time.monotonic() - started) / done
        logging.info("stock campaign: %d/%d runs, %.1f s/run, %.0f s left", done, total, rate, rate * (total - done))

    ran = run_campaign(lab, OUT / args.file, runs, progress)
    logging.info("stock campaign: %d runs recorded in %s", ran, OUT / args.file)


def fit(args: argparse.Namespace) -> None:
    """Fit thresholds on the calibration half and write the profile and the report."""
    from node.calibrate.runs import read_records
    from node.calibrate.stock_fit import write_profile_and_report

    records = [r for path in sorted(OUT.glob("runs*.jsonl")) for r in read_records(path)]
    profile = ROOT / "config" / "profiles" / "smollm2-135m-instruct-vllm-stock.float32.toml"
    seeded = ROOT / "docs" / "calibration" / "smollm2-135m-instruct.float32"
    canonical = [r for path in sorted(seeded.glob("runs*.jsonl")) if path.name != "runs-sweep.jsonl"
                 for r in read_records(path)]
    write_profile_and_report(records, OUT, profile, " ".join(sys.argv[1:]), canonical)


def main() -> None:
    """Parse the phase and run it."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="phase", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("--honest", type=int, default=200)
    rec.add_argument("--per-attack", type=int, default=25)
    rec.add_argument("--start", type=int, default=0)
    rec.add_argument("--tokens", type=int, default=64)
    rec.add_argument("--file", default="runs.jsonl")
    rec.add_argument("--memory-fraction", type=float, default=0.12)
    sub.add_parser("fit")
    args = parser.parse_args()
    record(args) if args.phase == "record" else fit(args)


if __name__ == "__main__":
    main()

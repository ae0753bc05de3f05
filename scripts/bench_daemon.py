"""Benchmark the validator's work per inference against the pure prefill bound (real SmolLM2, fp32, CPU).

One honest 256-token inference is generated once; then, repeated, the daemon's verification path
(payload hash checks against the commitment, wire decode, stage 1, one prefill, fingerprint check,
the stage-2 signals the profile decides on, decision) and the prefill alone. Inferences per hour =
3600 / seconds per inference; the goal is ≥ 0.9 of the prefill bound. Also the cheap stages alone
(hash checks and decoding), as inferences per second a validator can triage. Prints a table and writes JSON
(default bench-results/bench_daemon.json). Batched validation: the same path for B queued inferences whose
prefills share one pass (--batches; B copies of the inference, so equal lengths and no padding: mixed
lengths pay for their padding), as inferences per hour per core.
Usage: python scripts/bench_daemon.py [--tokens 256] [--repeats 3] [--threads 2] [--batches 1 2 4 8] [--out FILE]
"""

from __future__ import annotations

import argparse
import base64
import json
import platform
import statistics
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from node.checks.decision import decide_stage2
from node.checks.stage2 import measure_stage2_decision
from node.engines.base import prefill_many
from node.engines.models import get_model_spec, materialise_model
from node.engines.tokenizer import ModelTokenizer
from node.engines.transformers_engine import TransformersEngine, TransformersOptions
from node.executer.api import InferencePayload
from node.executer.service import ExecuterService
from node.profiles import load_profile
from node.protocol.fingerprint import encode_fingerprint_base64
from node.protocol.prompt import compute_prompt_hash, normalise_messages
from node.protocol.sampler import SamplingParams
from node.validator.verify import (
    ChainFacts,
    PreparedCheck,
    decode_payload_artifact,
    find_payload_mismatch,
    finish_verification,
    prepare_verification,
    verify_payload,
)

MODEL = "smollm2-135m-instruct"


def timed(fn, repeats: int) -> float:  # type: ignore[no-untyped-def]
    """Return the median seconds of `repeats` calls."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def timed_alternately(first, second, repeats: int) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """Return the median seconds of `first` and of `second`, called in turn `repeats` times each."""
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        for fn, samples in zip((first, second), times, strict=True):
            start = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - start)
    return statistics.median(times[0]), statistics.median(times[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--out", type=Path, default=Path("bench-results/bench_daemon.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    spec = get_model_spec(MODEL)
    files = materialise_model(spec)
    _, profile = load_profile(spec)
    tokenizer = ModelTokenizer(files.path, spec.chat)
    engine = TransformersEngine(files.path, MODEL, TransformersOptions(threads=args.threads))
    service = ExecuterService(files, tokenizer, engine, profile.fingerprint_thresholds())
    messages = normalise_messages([{"role": "user", "content": "Write a long story about a lighthouse keeper."}])
    params = SamplingParams(1.0, 1.0, 0, args.tokens)
    prompt_ids = tokenizer.encode_chat(messages)
    prompt_hash = compute_prompt_hash(files.model_id, messages=messages)
    started = time.perf_counter()
    served = service.infer(prompt_ids, prompt_hash, params, 7, 7, {"messages": messages})
    t_generate = time.perf_counter() - started  # the executer's whole path (one run: tens of seconds)
    payload = InferencePayload(model=MODEL, model_id="0x" + files.model_id.hex(), inference_id="7", user_seed="7",
                               request={"messages": messages},
                               artifact=base64.b64encode(served.wire).decode(),
                               verification_proofs=encode_fingerprint_base64(served.fingerprint))
    facts = ChainFacts(7, 7, files.model_id, params.temperature_bits, params.top_p_bits, 0, args.tokens, prompt_hash,
                       served.output_hash, served.artifact.root, served.fingerprint_hash)
    thresholds = profile.stage2_thresholds()
    n = len(served.generation.output_ids)
    output_ids = list(served.generation.output_ids)

    def full() -> None:
        assert find_payload_mismatch(payload, facts).name == "OK"
        report = verify_payload(payload, files, tokenizer, engine, thresholds, facts, decision_only=True)
        assert report.valid, report.reason

    def cheap() -> None:
        assert find_payload_mismatch(payload, facts).name == "OK"
        decode_payload_artifact(payload)

    # alternated, so that a slow spell of this shared machine weighs on both sides of the ratio alike
    t_full, t_prefill = timed_alternately(full, lambda: engine.prefill(prompt_ids, output_ids), args.repeats)
    t_cheap = timed(cheap, max(args.repeats, 10))
    art = decode_payload_artifact(payload)
    logits = engine.prefill(prompt_ids, output_ids).logits

    def stage2() -> None:  # what follows the prefill on the daemon's path: measurement + decision
        decide_stage2(measure_stage2_decision(art.header, art.positions, logits), thresholds)

    t_stage2 = timed(stage2, max(args.repeats, 10))

    def batched(b: int) -> None:  # the daemon's path for b queued inferences: one prefill pass for all
        checks = [prepare_verification(payload, files, tokenizer, facts) for _ in range(b)]
        ready = [c for c in checks if isinstance(c, PreparedCheck)]
        prefills = prefill_many(engine, [(c.prompt_ids, c.output_ids) for c in ready])
        assert all(finish_verification(c, p, thresholds, files, engine, True).valid
                   for c, p in zip(ready, prefills, strict=True))

    per_hour_per_core = {b: 3600 * b / timed(lambda b=b: batched(b), args.repeats) / args.threads
                         for b in args.batches}
    best = max(per_hour_per_core, key=lambda b: per_hour_per_core[b])
    results = {"tokens": n, "prompt_tokens": len(prompt_ids), "threads": args.threads,
               "verify_s": t_full, "prefill_s": t_prefill, "cheap_s": t_cheap,
               "inferences_per_hour": 3600 / t_full, "prefill_bound_per_hour": 3600 / t_prefill,
               "fraction_of_bound": t_prefill / t_full, "cheap_per_second": 1 / t_cheap,
               "generate_s": t_generate, "generate_over_verify": t_generate / t_full,
               "generate_over_prefill": t_generate / t_prefill, "stage2_decision_s": t_stage2,
               "stage2_share_of_prefill": t_stage2 / t_prefill,
               "batched_per_hour_per_core": {str(b): v for b, v in per_hour_per_core.items()}, "best_batch": best}
    table = Table(title=f"validator per inference: SmolLM2 fp32, {n} generated tokens, {args.threads} threads")
    table.add_column("stage")
    table.add_column("seconds", justify="right")
    table.add_column("inferences / hour", justify="right")
    table.add_row("prefill alone (the bound)", f"{t_prefill:.3f}", f"{3600 / t_prefill:,.0f}")
    table.add_row("full verification", f"{t_full:.3f}", f"{3600 / t_full:,.0f}")
    table.add_row("cheap stages (hash checks + decode)", f"{t_cheap:.4f}", f"{3600 / t_cheap:,.0f}")
    table.add_row("stage-2 measurement + decision (after the prefill)", f"{t_stage2:.4f}", "")
    table.add_row("generation (the executer, same inference)", f"{t_generate:.2f}", "")
    Console().print(table)
    batch_table = Table(title="batched validation (the daemon's verify_batch)")
    batch_table.add_column("batch", justify="right")
    batch_table.add_column("inferences / hour / core", justify="right")
    batch_table.add_column("vs batch 1", justify="right")
    base = per_hour_per_core.get(1, per_hour_per_core[min(per_hour_per_core)])
    for b, v in per_hour_per_core.items():
        batch_table.add_row(str(b), f"{v:,.0f}", f"{v / base:.2f}×")
    Console().print(batch_table)
    Console().print(f"full verification reaches {100 * t_prefill / t_full:.1f} % of the prefill bound (goal 90 %); "
                    f"generation ÷ whole validation {t_generate / t_full:.1f}× (÷ prefill alone "
                    f"{t_generate / t_prefill:.1f}×); stage 2 + decision {100 * t_stage2 / t_prefill:.1f} % of the "
                    "prefill (goal ≤ 10 %)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"benchmark": "daemon", "machine": platform.machine(), **results}, indent=2) + "\n")


if __name__ == "__main__":
    main()

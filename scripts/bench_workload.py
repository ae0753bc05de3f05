"""Benchmark the workload record on the real SmolLM2-135M: recording overhead, export, IREE replay vs eager.

* recording overhead ÷ generation time (recorder on, graph export off: the serving-path cost);
* export time (torch-mlir, weights as inputs) of one decoder layer and of the whole verification prefill;
* IREE replay time ÷ torch eager for one layer slice and for the whole verification prefill (goal ≤ 2×);
* the canonical sampler graph on IREE vs node.protocol on real logits: agreement and time per position.
Prints a table and writes JSON (default bench-results/bench_workload.json).
Usage: python scripts/bench_workload.py [--tokens 32] [--inferences 3] [--length 64] [--sampler-positions 16]
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from node.checks.fingerprint import FingerprintThresholds
from node.engines.models import get_model_spec, materialise_model
from node.engines.tokenizer import ModelTokenizer
from node.engines.transformers_engine import TransformersEngine
from node.executer.service import ExecuterService
from node.protocol.prompt import compute_prompt_hash
from node.protocol.sampler import SamplingParams
from node.protocol.seed import compute_sampler_uniforms
from node.workload.export import export_module
from node.workload.inference import export_verification_graph
from node.workload.model import Device
from node.workload.recorder import InferenceRecorder
from node.workload.replay import CompiledGraph, compile_graph
from node.workload.sampler_graph import compile_sampler, export_sampler_graph, measure_sampler_agreement
from node.workload.store import WorkloadRecord

MODEL = "smollm2-135m-instruct"
console = Console()


def best_of(fn: Any, repeats: int) -> float:
    """Return the best wall time of repeats calls."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


class TimedRecorder:
    """Times each on_served call of a real recorder."""

    def __init__(self, inner: InferenceRecorder) -> None:
        self.inner, self.seconds = inner, 0.0

    def on_served(self, served: Any, started_ns: int, ended_ns: int) -> str:
        t0 = time.perf_counter()
        out = self.inner.on_served(served, started_ns, ended_ns)
        self.seconds += time.perf_counter() - t0
        return out


def bench_recording(engine: TransformersEngine, files: Any, tokenizer: ModelTokenizer, tokens: int,
                    inferences: int) -> dict[str, float]:
    """Serve inferences with the recorder on, inline and in the background; return the times."""
    out: dict[str, float] = {}
    for mode in ("inline", "background"):
        with tempfile.TemporaryDirectory() as tmp, WorkloadRecord.open(Path(tmp) / "rec") as rec:
            recorder = InferenceRecorder(rec, MODEL, Device("bench/cpu", "bench", "cpu", 0),
                                         background=mode == "background")
            timed = TimedRecorder(recorder)
            service = ExecuterService(files, tokenizer, engine, FingerprintThresholds(2, 1.0, 1.0, 0), recorder=timed)
            total = 0.0
            for i in range(inferences):
                messages = [{"role": "user", "content": f"Write a short story about the number {i}."}]
                t0 = time.perf_counter()
                service.infer(tokenizer.encode_chat(messages), compute_prompt_hash(files.model_id, messages=messages),
                              SamplingParams(0.8, 1.0, 0, tokens), 1000 + i, None, {"messages": messages})
                total += time.perf_counter() - t0
            recorder.close()
            generation = total - timed.seconds
            out |= {f"{mode}_generation_s": generation, f"{mode}_serving_path_s": timed.seconds,
                    f"{mode}_writer_s": recorder.write_s, f"{mode}_serving_ratio": timed.seconds / generation,
                    f"{mode}_writer_ratio": recorder.write_s / generation}
    return out


def bench_layer(model: Any, length: int, repeats: int) -> dict[str, float]:
    """Export, compile and replay one decoder layer at a length; compare with eager."""
    decoder = model.get_decoder()
    layer = decoder.layers[-1]
    ids = torch.randint(0, 49152, (1, length), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        hidden = decoder(input_ids=ids, output_hidden_states=True, use_cache=False).hidden_states[-2]
        cos, sin = decoder.rotary_emb(hidden, torch.arange(length)[None])
    inputs = {"hidden": hidden, "cos": cos, "sin": sin}

    def call(run: Any, x: dict[str, torch.Tensor]) -> torch.Tensor:
        out: torch.Tensor = run(x["hidden"], position_embeddings=(x["cos"], x["sin"]), attention_mask=None)
        return out

    t0 = time.perf_counter()
    exported = export_module(layer, inputs, call, name="layer", output_names=["out"])
    export_s = time.perf_counter() - t0
    return _compare(exported.graph, exported.values, lambda: call(lambda *a, **k: layer(*a, **k), inputs),
                    repeats) | {"export_s": export_s}


def bench_prefill(model: Any, length: int, repeats: int) -> dict[str, float]:
    """Export, compile and replay the whole verification prefill at a length; compare with eager."""
    t0 = time.perf_counter()
    exported = export_verification_graph(model, length, MODEL)
    export_s = time.perf_counter() - t0
    ids = torch.randint(0, 49152, (1, length), generator=torch.Generator().manual_seed(1))
    values = {**exported.values, "input_ids": ids}

    def eager() -> Any:
        out = model(input_ids=ids, use_cache=False, output_hidden_states=True)
        return out.hidden_states[-1][0], out.logits[0]

    return _compare(exported.graph, values, eager, repeats) | {"export_s": export_s, "ops": len(exported.graph.ops)}


def _compare(graph: Any, values: dict[str, torch.Tensor], eager: Any, repeats: int) -> dict[str, float]:
    t0 = time.perf_counter()
    compiled = CompiledGraph(compile_graph(graph))
    compile_s = time.perf_counter() - t0
    args = compiled.upload([values[s.name].numpy() for s in graph.inputs])  # weights on the device once
    outs = compiled.run(args)
    with torch.no_grad():
        ref = eager()
    ref = ref if isinstance(ref, tuple) else (ref,)
    max_err = max(float(np.abs(o - r.numpy()).max()) for o, r in zip(outs, ref, strict=True))
    iree_s = best_of(lambda: compiled.run(args), repeats)
    with torch.no_grad():
        eager_s = best_of(eager, repeats)
    return {"compile_s": compile_s, "iree_s": iree_s, "eager_s": eager_s, "ratio": iree_s / eager_s,
            "max_abs_error": max_err}


def bench_sampler(engine: TransformersEngine, tokenizer: ModelTokenizer, positions: int) -> dict[str, Any]:
    """The sampler graph on IREE vs node.protocol on real SmolLM2 logits at seeded positions."""
    t0 = time.perf_counter()
    exported = export_sampler_graph(engine.vocab_size, 5)
    export_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    compiled = compile_sampler(exported)
    compile_s = time.perf_counter() - t0
    prompt = tokenizer.encode_chat([{"role": "user", "content": "Tell me about the sea."}])
    output = list(range(1000, 1000 + positions))
    logits = engine.prefill(prompt, output).logits
    uniforms = compute_sampler_uniforms(b"\x01" * 32, positions)
    rows = [(logits[i], int(uniforms[i])) for i in range(positions)]
    results: dict[str, Any] = {"export_s": export_s, "compile_s": compile_s}
    for name, params in {"T=0.7 top_p=0.9": SamplingParams(0.7, 0.9), "T=1.0": SamplingParams(1.0),
                         "T=0.8 top_k=40": SamplingParams(0.8, 1.0, 40)}.items():
        t0 = time.perf_counter()
        agreement = measure_sampler_agreement(compiled, rows, params, 5)
        results[name] = {**agreement.__dict__, "s_per_position": (time.perf_counter() - t0) / positions}
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--inferences", type=int, default=3)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sampler-positions", type=int, default=16)
    parser.add_argument("--skip-prefill", action="store_true", help="Skip the whole-model export (minutes).")
    parser.add_argument("--out", type=Path, default=Path("bench-results/bench_workload.json"))
    args = parser.parse_args()
    files = materialise_model(get_model_spec(MODEL))
    engine = TransformersEngine(files.path, MODEL)
    tokenizer = ModelTokenizer(files.path, True)
    results: dict[str, Any] = {"machine": platform.processor() or platform.machine(),
                               "torch_threads": torch.get_num_threads(), "length": args.length}
    results["recording"] = bench_recording(engine, files, tokenizer, args.tokens, args.inferences)
    console.print(results["recording"])
    results["layer"] = bench_layer(engine.model, args.length, args.repeats)
    console.print(results["layer"])
    if not args.skip_prefill:
        results["prefill"] = bench_prefill(engine.model, args.length, args.repeats)
        console.print(results["prefill"])
    if args.sampler_positions:
        results["sampler"] = bench_sampler(engine, tokenizer, args.sampler_positions)
    table = Table(title=f"workload record on SmolLM2-135M ({args.length} tokens, fp32, CPU)")
    for column in ("metric", "value", "goal"):
        table.add_column(column)
    rec = results["recording"]
    for mode in ("inline", "background"):
        table.add_row(f"recording ({mode}) ÷ generation", f"{rec[f'{mode}_serving_ratio']:.3%} on the serving path, "
                      f"writer {rec[f'{mode}_writer_ratio']:.3%}", "≤ 1 %")
    for part in ("layer", "prefill"):
        if part in results:
            r = results[part]
            table.add_row(f"{part}: export", f"{r['export_s']:.1f} s", "")
            table.add_row(f"{part}: IREE compile", f"{r['compile_s']:.1f} s", "cached by graph id")
            table.add_row(f"{part}: IREE ÷ eager", f"{r['ratio']:.2f}× ({r['iree_s'] * 1e3:.1f} / "
                          f"{r['eager_s'] * 1e3:.1f} ms)", "≤ 2×")
            table.add_row(f"{part}: max |Δ|", f"{r['max_abs_error']:.1e}", "")
    for name, r in results.get("sampler", {}).items():
        if isinstance(r, dict):
            table.add_row(f"sampler {name}", f"chosen {r['chosen_equal']}/{r['positions']}, weights equal "
                          f"{r['weights_equal']}/{r['positions']}, {r['s_per_position']:.2f} s/pos", "picks equal")
    console.print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

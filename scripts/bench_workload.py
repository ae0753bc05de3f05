"""Benchmark the workload record on the real SmolLM2-135M: recording overhead, export, IREE replay vs eager.

* recording overhead ÷ generation time (recorder on, graph export off: the serving-path cost);
* serving with graphs: generation while the recorder's export thread exports the graph pair vs after it,
  the export time, and a second recorder start on the same record (re-use: nothing exported);
* stage 2 from the record (node.checks.stage2_record): honest inferences and cheaters (weight noise 1 %
  and 0.1 %, a skipped layer) served into one record, replayed by a verifier with its own export;
  IREE vs committed log-probabilities, IREE vs torch eager prefill logits (the calibrated spread), the
  tolerance calibrated from the honest ones, the decisions;
* export time (torch-mlir, weights as inputs) of one decoder layer and of the whole verification prefill;
* IREE replay time ÷ torch eager for one layer slice and for the whole verification prefill (goal ≤ 2×);
* the canonical sampler graph on IREE vs node.protocol on real logits: agreement and time per position.
Prints a table and writes JSON (default bench-results/bench_workload.json).
Usage: python scripts/bench_workload.py [--tokens 32] [--inferences 3] [--length 64] [--sampler-positions 16]
       [--record-only]  (only the serving-with-graphs and stage-2-from-the-record parts)
"""

from __future__ import annotations

import argparse
import copy
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

from node.calibrate.models import make_noisy_engine, make_skip_layer_engine
from node.checks.fingerprint import FingerprintThresholds
from node.checks.stage2_record import (
    Stage2RecordMeasurement,
    calibrate_record_tolerance,
    decide_stage2_record,
    measure_stage2_record,
    verify_recorded_inference,
)
from node.engines.models import get_model_spec, materialise_model
from node.engines.tokenizer import ModelTokenizer
from node.engines.transformers_engine import TransformersEngine
from node.executer.service import ExecuterService
from node.profiles import load_profile
from node.protocol.prompt import compute_prompt_hash
from node.protocol.sampler import SamplingParams, compute_raw_logprobs
from node.protocol.seed import compute_sampler_uniforms
from node.workload.export import export_module, get_module_state
from node.workload.inference import CausalLmGraphExporter, ProcessGraphExporter, export_verification_graph
from node.workload.model import Device
from node.workload.recorder import InferenceRecorder, get_trace_id
from node.workload.replay import CompiledGraph, compile_graph
from node.workload.sampler_graph import compile_sampler, export_sampler_graph, measure_sampler_agreement
from node.workload.stage2_replay import IreeRecordReplayer
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


STAGE2_PARAMS = [SamplingParams(0.8, 1.0, 0, 0), SamplingParams(0.7, 0.9, 0, 0), SamplingParams(1.0, 1.0, 40, 0),
                 SamplingParams(0.0, 1.0, 0, 0)]


def _serve_batch(service: ExecuterService, files: Any, tokenizer: ModelTokenizer, tag: str, count: int,
                 tokens: int) -> list[tuple[Any, float]]:
    """Serve count short requests; return (served, generation seconds) per request."""
    out = []
    for i in range(count):
        messages = [{"role": "user", "content": f"Tell me about {tag} number {i}."}]
        p = STAGE2_PARAMS[i % len(STAGE2_PARAMS)]
        params = SamplingParams(p.temperature, p.top_p, p.top_k, tokens)
        t0 = time.perf_counter()
        served = service.infer(tokenizer.encode_chat(messages), compute_prompt_hash(files.model_id, messages=messages),
                               params, 5000 + i, None, {"messages": messages})
        out.append((served, time.perf_counter() - t0))
    return out


def bench_serving_with_graphs(engine: TransformersEngine, files: Any, tokenizer: ModelTokenizer, tokens: int,
                              inferences: int, root: Path, exporter: str, cheat: bool = True) -> dict[str, Any]:
    """Serve honest inferences while the pair is exported (in a thread or a niced child), after it, then cheaters."""
    thresholds = FingerprintThresholds(2, 1.0, 1.0, 0)
    graphs = (ProcessGraphExporter(files.path, MODEL, files.model_id.hex(), "float32") if exporter == "process"
              else CausalLmGraphExporter(lambda: copy.deepcopy(engine.model), MODEL, files.model_id.hex(), "float32"))
    cheaters = {"weight-noise-1pct": make_noisy_engine(engine, 0.01, seed=1),
                "weight-noise-0.1pct": make_noisy_engine(engine, 0.001, seed=2),
                "skip-layer": make_skip_layer_engine(engine, 15)} if cheat else {}
    with WorkloadRecord.open(root / "prover") as rec:
        recorder = InferenceRecorder(rec, MODEL, Device("bench/cpu", "bench", "cpu", 0), graphs=graphs, background=True)
        service = ExecuterService(files, tokenizer, engine, thresholds, recorder=recorder)
        during = _serve_batch(service, files, tokenizer, "the sea", inferences, tokens)
        exporting_while_served = recorder.exporting is not None
        while recorder.exporting is not None and len(during) < 20 * inferences:  # keep serving while it exports
            during += _serve_batch(service, files, tokenizer, f"the sea {len(during)}", 1, tokens)
        recorder.wait_for_graphs()
        after = _serve_batch(service, files, tokenizer, "the sky", inferences, tokens)
        served = {"honest": [s for s, _ in during + after]}
        for name, cheater in cheaters.items():
            cheat_service = ExecuterService(files, tokenizer, cheater, thresholds, recorder=recorder)
            served[name] = [s for s, _ in _serve_batch(cheat_service, files, tokenizer, name, inferences, tokens)]
        recorder.close()
        lengths = sorted({len(s.artifact.header.prompt_token_ids) + len(s.generation.output_ids) - 1
                          for group in served.values() for s in group})
        exported, export_s, failures = list(recorder.exported), recorder.export_s, recorder.export_failures
    with WorkloadRecord.open(root / "prover") as rec:  # a second executer start: graphs re-used, nothing exported
        again = InferenceRecorder(rec, MODEL, Device("bench/cpu", "bench", "cpu", 0), graphs=graphs, background=True)
        _serve_batch(ExecuterService(files, tokenizer, engine, thresholds, recorder=again), files, tokenizer,
                     "a tree", 1, tokens)
        again.close()
        second_start_exports = len(again.exported)
    gen_during = sum(t for _, t in during) / sum(len(s.generation.output_ids) for s, _ in during)
    gen_after = sum(t for _, t in after) / sum(len(s.generation.output_ids) for s, _ in after)
    return {"served": served, "exported_keys": exported, "export_s": export_s, "export_failures": failures,
            "fed_lengths": lengths, "exporting_while_served": exporting_while_served,
            "s_per_token_during_export": gen_during, "s_per_token_after_export": gen_after,
            "slowdown_during_export": gen_during / gen_after - 1, "second_start_exports": second_start_exports,
            "exporter": exporter}


def bench_stage2_record(engine: TransformersEngine, files: Any, served: dict[str, list[Any]],
                        root: Path) -> dict[str, Any]:
    """A verifier with its own export replays every recorded inference with IREE; calibrate on the honest ones."""
    own = CausalLmGraphExporter(lambda: copy.deepcopy(engine.model), MODEL, files.model_id.hex(),
                                "float32")
    thresholds = load_profile(files.spec)[1].stage2_thresholds()
    measured: dict[str, list[Stage2RecordMeasurement]] = {}
    spread: list[dict[str, float]] = []
    with WorkloadRecord.open(root / "verifier") as cache, WorkloadRecord.open(root / "prover", readonly=True) as rec:
        replayer = IreeRecordReplayer(rec, get_module_state(engine.model), cache=cache, own_graphs=own)
        t0 = time.perf_counter()
        first = replayer.load_inference(get_trace_id(served["honest"][0].inference_id))
        replayer.replay_logits(first)  # the verifier's own export + compile, timed once
        setup_s = time.perf_counter() - t0
        run_s = []
        for name, group in served.items():
            for s in group:
                inference = replayer.load_inference(get_trace_id(s.inference_id))
                replayed = replayer.replay_logits(inference)
                run_s.append(replayed.run_s)
                m = measure_stage2_record(inference, verify_recorded_inference(inference, s.artifact.root), replayed)
                measured.setdefault(name, []).append(m)
                if name == "honest":
                    eager = engine.prefill(list(inference.prompt_ids), list(inference.output_ids)).logits
                    ids = s.artifact.positions.token_ids.astype(np.int64)
                    lp_iree = np.stack([compute_raw_logprobs(r) for r in replayed.logits])
                    lp_eager = np.stack([compute_raw_logprobs(np.asarray(r, np.float32)) for r in eager])
                    spread.append({"logit_max_abs": float(np.abs(replayed.logits - eager).max()),
                                   "candidate_logprob_max_abs": float(np.abs(
                                       np.take_along_axis(lp_iree - lp_eager, ids, axis=1)).max())})
    tolerance = calibrate_record_tolerance(measured["honest"])
    rows: dict[str, Any] = {}
    for name, ms in measured.items():
        decisions = [decide_stage2_record(m, tolerance).reason.name for m in ms]
        with_profile = [decide_stage2_record(m, tolerance, thresholds).reason.name for m in ms]
        rows[name] = {"inferences": len(ms), "positions": sum(m.positions for m in ms),
                      "logprob_error_max": max(m.logprob_error_max for m in ms),
                      "logprob_error_min_of_max": min(m.logprob_error_max for m in ms),
                      "top_k_agreement_min": min(m.top_k_agreement for m in ms),
                      "stage2_weight_error_max": max(m.stage2.weight_error_max for m in ms),
                      "graph_is_own_export": sorted({str(m.graph_is_own_export) for m in ms}),
                      "decisions": decisions, "decisions_with_profile": with_profile,
                      "caught": sum(d != "OK" for d in decisions)}
    return {"tolerance": tolerance.__dict__, "iree_vs_torch_eager": {
                "logit_max_abs": max(x["logit_max_abs"] for x in spread),
                "candidate_logprob_max_abs": max(x["candidate_logprob_max_abs"] for x in spread)},
            "verifier_export_and_compile_s": setup_s, "replay_run_s_mean": float(np.mean(run_s)), "rows": rows}


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
    parser.add_argument("--record-only", action="store_true",
                        help="Only serving with graphs and stage 2 from the record.")
    parser.add_argument("--stage2-tokens", type=int, default=24, help="Tokens per inference in the stage-2 part.")
    parser.add_argument("--exporter", choices=["process", "thread"], default="process",
                        help="Where the recorder exports graphs (the executer uses a niced child process).")
    parser.add_argument("--serving-only", action="store_true", help="Skip stage 2 from the record.")
    parser.add_argument("--out", type=Path, default=Path("bench-results/bench_workload.json"))
    args = parser.parse_args()
    files = materialise_model(get_model_spec(MODEL))
    engine = TransformersEngine(files.path, MODEL)
    tokenizer = ModelTokenizer(files.path, True)
    results: dict[str, Any] = {"machine": platform.processor() or platform.machine(),
                               "torch_threads": torch.get_num_threads(), "length": args.length}
    results["recording"] = bench_recording(engine, files, tokenizer, args.tokens, args.inferences)
    console.print(results["recording"])
    with tempfile.TemporaryDirectory() as tmp:
        serving = bench_serving_with_graphs(engine, files, tokenizer, args.stage2_tokens, args.inferences, Path(tmp),
                                            args.exporter, cheat=not args.serving_only)
        served = serving.pop("served")
        results["serving_with_graphs"] = serving
        console.print(serving)
        if not args.serving_only:
            results["stage2_record"] = bench_stage2_record(engine, files, served, Path(tmp))
            console.print(results["stage2_record"])
    if not args.record_only:
        results["layer"] = bench_layer(engine.model, args.length, args.repeats)
        console.print(results["layer"])
    if not args.skip_prefill and not args.record_only:
        results["prefill"] = bench_prefill(engine.model, args.length, args.repeats)
        console.print(results["prefill"])
    if args.sampler_positions and not args.record_only:
        results["sampler"] = bench_sampler(engine, tokenizer, args.sampler_positions)
    table = Table(title=f"workload record on SmolLM2-135M ({args.length} tokens, fp32, CPU)")
    for column in ("metric", "value", "goal"):
        table.add_column(column)
    rec = results["recording"]
    for mode in ("inline", "background"):
        table.add_row(f"recording ({mode}) ÷ generation", f"{rec[f'{mode}_serving_ratio']:.3%} on the serving path, "
                      f"writer {rec[f'{mode}_writer_ratio']:.3%}", "≤ 1 %")
    sg = results["serving_with_graphs"]
    table.add_row(f"graph pair export (recorder's export {sg['exporter']})",
                  f"{sg['export_s']:.1f} s for {len(sg['exported_keys'])} key(s), fed lengths {sg['fed_lengths']}",
                  "off the serving path")
    table.add_row("generation while exporting vs after", f"{sg['s_per_token_during_export'] * 1e3:.0f} / "
                  f"{sg['s_per_token_after_export'] * 1e3:.0f} ms per token ({sg['slowdown_during_export']:+.0%})", "")
    table.add_row("second start on the same record", f"{sg['second_start_exports']} exports", "0 (re-used)")
    sr = results.get("stage2_record", {"iree_vs_torch_eager": {"logit_max_abs": float("nan"),
                                                              "candidate_logprob_max_abs": float("nan")},
                                       "tolerance": {"max_logprob_error": float("nan"),
                                                     "min_top_k_agreement": float("nan")}, "rows": {}})
    spread, tol = sr["iree_vs_torch_eager"], sr["tolerance"]
    table.add_row("stage 2 from record: IREE vs torch eager", f"logits max |Δ| {spread['logit_max_abs']:.1e}, "
                  f"candidate logprobs {spread['candidate_logprob_max_abs']:.1e}", "")
    table.add_row("stage 2 from record: calibrated tolerance", f"max |Δ logprob| ≤ {tol['max_logprob_error']:.1e}, "
                  f"top-K agreement ≥ {tol['min_top_k_agreement']:.2f}", "10 × honest max")
    for name, row in sr["rows"].items():
        table.add_row(f"stage 2 from record: {name}", f"{row['caught']}/{row['inferences']} refused, max |Δ logprob| "
                      f"{row['logprob_error_min_of_max']:.1e}..{row['logprob_error_max']:.1e}, top-K ≥ "
                      f"{row['top_k_agreement_min']:.2f}", "0 honest, all cheaters")
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

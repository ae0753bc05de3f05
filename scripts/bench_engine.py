"""Benchmark the engines on the real SmolLM2-135M-Instruct (fp32): generation vs validation.

For each backend (transformers; vLLM when importable, i.e. run it with .venv-vllm/bin/python):
  decode tok/s        generating N tokens with the canonical sampler (stop tokens ignored)
  prefill s           one teacher-forced pass over prompt + N generated tokens (the validator's work)
  prefill / generate  the ratio the protocol's economy rests on
  executer overhead   the executer's per-token work clocked inside the engine while it generates (vLLM:
                      the logits processor — torch row to numpy, canonical sampler, forcing the chosen
                      token — and the hidden-state capture hook; transformers: the sampling step, logits
                      to CPU and the sampler), artifact (leaves, Merkle root, zstd), fingerprints, each
                      as a share of generation time; and the same over the time to generate --batch
                      requests together. `sampler ms` is the engines' sampler (sample_position_compiled)
                      alone on the prefill's rows, warm.
  prefill % of peak   the prefill's useful FLOP/s (linear layers, causal attention, the lm_head on the
                      response positions only, counted from the model's config) ÷ this machine's fp32
                      matmul peak (the best n×n torch.mm of n = 1024, 2048, 3072 at the same thread
                      count: a median of one size read below what the prefill's own matmuls reached)
Prints a table and writes JSON (default bench-results/bench_engine.json). Median of --repeats.
Usage: .venv-vllm/bin/python scripts/bench_engine.py [--tokens 256] [--repeats 3]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from node.engines.base import Engine, GenerationRequest
from node.engines.compiled_fingerprint import compute_interpolation_compiled
from node.engines.compiled_sampler import sample_position_compiled
from node.engines.models import get_model_spec, materialise_model
from node.engines.tokenizer import ModelTokenizer
from node.engines.transformers_engine import TransformersEngine
from node.protocol.artifact import Artifact, ArtifactHeader, encode_artifact_wire, positions_from_samples
from node.protocol.fingerprint import build_fingerprint
from node.protocol.sampler import SamplingParams
from node.protocol.seed import run_seed

MODEL = "smollm2-135m-instruct"
PROMPT = "Explain, step by step, how a bicycle's gears make climbing a hill easier. Use simple words."


def timed(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    """Return the median seconds of fn over repeats runs and the last result."""
    samples, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples), result


class StepClock:
    """Seconds spent in the engines' per-token executer hooks (wrapped once, before any engine is built)."""

    seconds = 0.0

    @classmethod
    def wrap(cls, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Return fn adding its wall time to the clock."""
        def clocked(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                cls.seconds += time.perf_counter() - start
        return clocked

    @classmethod
    @contextmanager
    def reading(cls) -> Iterator[list[float]]:
        """Yield a list that holds the seconds clocked inside the block once it ends."""
        out: list[float] = []
        start = cls.seconds
        yield out
        out.append(cls.seconds - start)


def install_step_clocks(with_vllm: bool) -> None:
    """Clock the per-token executer work of each backend where the engine calls it."""
    TransformersEngine._sample_step = StepClock.wrap(TransformersEngine._sample_step)  # type: ignore[method-assign]
    if with_vllm:
        from node.engines import vllm_engine

        vllm_engine.CanonicalSampler.apply = StepClock.wrap(vllm_engine.CanonicalSampler.apply)  # type: ignore[method-assign]
        vllm_engine._capture_hook = StepClock.wrap(vllm_engine._capture_hook)  # registered when an engine is built


def measure_matmul_peak(sizes: tuple[int, ...] = (1024, 2048, 3072), repeats: int = 5) -> float:
    """Return this machine's fp32 matmul FLOP/s: the best n×n torch.mm over sizes and repeats, current threads."""
    best = 0.0
    for n in sizes:
        a, b = torch.randn(n, n), torch.randn(n, n)
        torch.mm(a, b)  # warm-up
        for _ in range(repeats):
            start = time.perf_counter()
            torch.mm(a, b)
            best = max(best, 2 * n**3 / (time.perf_counter() - start))
    return best


def compute_prefill_flops(config: dict[str, Any], fed: int, logits: int) -> float:
    """Return the useful FLOPs of one prefill of `fed` tokens with the lm_head on `logits` positions."""
    d, ffn, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    kv = d * config.get("num_key_value_heads", config["num_attention_heads"]) // config["num_attention_heads"]
    linear = 2 * fed * layers * (2 * d * d + 2 * d * kv + 3 * d * ffn)  # q, o; k, v; gate, up, down
    attention = 2 * 2 * layers * d * fed * (fed + 1) / 2  # QKᵀ and AV over the causal half
    return float(linear + attention + 2 * d * config["vocab_size"] * logits)


def bench_backend(engine: Engine, model_id: bytes, prompt: tuple[int, ...], tokens: int,
                  repeats: int, config: dict[str, Any], peak: float, batch: int) -> dict[str, Any]:
    """Return the measurements for one backend."""
    params = SamplingParams(1.0, 1.0, 0, tokens)
    req = GenerationRequest(prompt, params, run_seed(1, 2), 5)  # no stop ids: always `tokens` tokens
    engine.generate([GenerationRequest(prompt, SamplingParams(1.0, 1.0, 0, 4), run_seed(0, 0), 5)])  # warm-up
    with StepClock.reading() as clocked:
        gen_s, gen = timed(lambda: engine.generate([req])[0], repeats)
    n = len(gen.output_ids)
    step_per_token = clocked[0] / (repeats * n)  # the executer's work inside generation, per token
    prefill_s, pre = timed(lambda: engine.prefill(prompt, gen.output_ids), repeats)
    header = ArtifactHeader(model_id, params.temperature_bits, params.top_p_bits, 0, tokens, 5, req.run_seed, prompt,
                            n)

    def artifact() -> bytes:
        art = Artifact(header, positions_from_samples(gen.samples, 5))
        return art.root + encode_artifact_wire(art)

    def fingerprint() -> object:
        return build_fingerprint(gen.hidden, len(prompt), compute_interpolation_compiled)

    artifact(), fingerprint()  # warm: a serving executer loaded the compiled code long ago
    artifact_s, _ = timed(artifact, repeats)
    fingerprint_s, _ = timed(fingerprint, repeats)
    rows = pre.logits[: min(64, n)]
    sampler_s, _ = timed(lambda: [sample_position_compiled(r, params, 5, 12345) for r in rows], repeats)
    sampler_per_token = sampler_s / len(rows)
    per_sequence_s = step_per_token * n + artifact_s + fingerprint_s  # the executer's own work per sequence
    # batch: `batch` requests (distinct seeds) generated together; the executer's work is per sequence
    reqs = [GenerationRequest(prompt, params, run_seed(1, 2 + i), 5) for i in range(batch)]
    batch_repeats = max(1, repeats // 2)
    with StepClock.reading() as batch_clocked:
        batch_s, batch_gen = timed(lambda: engine.generate(reqs), batch_repeats)
    batch_tokens = sum(len(g.output_ids) for g in batch_gen)
    batch_work_s = batch_clocked[0] / batch_repeats + batch * (artifact_s + fingerprint_s)
    flops = compute_prefill_flops(config, len(prompt) + n - 1, n)
    return {
        "backend": engine.info.backend, "tokens": n, "prompt_tokens": len(prompt),
        "generate_s": gen_s, "decode_tok_per_s": n / gen_s, "prefill_s": prefill_s,
        "prefill_over_generate": prefill_s / gen_s, "generate_over_prefill": gen_s / prefill_s,
        "sampler_ms_per_token": sampler_per_token * 1e3, "executer_step_ms_per_token": step_per_token * 1e3,
        "executer_step_share": step_per_token * n / gen_s,
        "artifact_ms": artifact_s * 1e3, "artifact_share": artifact_s / gen_s,
        "fingerprint_ms": fingerprint_s * 1e3, "fingerprint_share": fingerprint_s / gen_s,
        "prefill_gflop": flops / 1e9, "prefill_gflops": flops / prefill_s / 1e9, "matmul_peak_gflops": peak / 1e9,
        "prefill_peak_fraction": flops / prefill_s / peak,
        "overhead_share": per_sequence_s / gen_s, "batch": batch, "batch_generate_s": batch_s,
        "batch_decode_tok_per_s": batch_tokens / batch_s, "batch_overhead_share": batch_work_s / batch_s,
        "batch_executer_step_ms_per_token": batch_clocked[0] / (batch_repeats * batch_tokens) * 1e3,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print the table and write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch", type=int, default=8, help="requests generated together for the batched overhead")
    parser.add_argument("--out", type=Path, default=Path("bench-results/bench_engine.json"))
    args = parser.parse_args(argv)
    spec = get_model_spec(MODEL)
    files = materialise_model(spec)
    prompt = ModelTokenizer(files.path, True).encode_chat([{"role": "user", "content": PROMPT}])
    with_vllm = importlib.util.find_spec("vllm") is not None
    install_step_clocks(with_vllm)
    engines: list[Engine] = [TransformersEngine(files.path, MODEL)]
    if with_vllm:
        from node.engines.vllm_engine import VllmEngine

        engines.append(VllmEngine(files.path, MODEL))
    config = json.loads((Path(files.path) / "config.json").read_text())
    peak = measure_matmul_peak()
    rows = [bench_backend(e, files.model_id, prompt, args.tokens, args.repeats, config, peak, args.batch)
            for e in engines]
    console = Console(width=200)
    table = Table(title=f"{MODEL} fp32 on CPU ({torch.get_num_threads()} threads), prompt {len(prompt)} + "
                        f"{args.tokens} tokens, median of {args.repeats}")
    for col in ("backend", "decode tok/s", "generate s", "prefill s", "generate ÷ prefill", "sampler ms",
                "step ms/tok", "step %", "artifact ms", "artifact %", "fingerprint ms", "fingerprint %", "overhead %",
                f"batch {args.batch} tok/s", f"overhead % at batch {args.batch}", "prefill GFLOP/s", "% of peak"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(r["backend"], f"{r['decode_tok_per_s']:.1f}", f"{r['generate_s']:.2f}", f"{r['prefill_s']:.3f}",
                      f"{r['generate_over_prefill']:.1f}×", f"{r['sampler_ms_per_token']:.2f}",
                      f"{r['executer_step_ms_per_token']:.2f}", f"{100 * r['executer_step_share']:.2f}",
                      f"{r['artifact_ms']:.1f}", f"{100 * r['artifact_share']:.2f}",
                      f"{r['fingerprint_ms']:.1f}", f"{100 * r['fingerprint_share']:.2f}",
                      f"{100 * r['overhead_share']:.2f}", f"{r['batch_decode_tok_per_s']:.1f}",
                      f"{100 * r['batch_overhead_share']:.2f}", f"{r['prefill_gflops']:.1f}",
                      f"{100 * r['prefill_peak_fraction']:.0f}")
    console.print(table)
    console.print(f"fp32 matmul peak (2048² torch.mm, {torch.get_num_threads()} threads): {peak / 1e9:.1f} GFLOP/s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"benchmark": "engine", "model": MODEL, "dtype": "float32", "threads": torch.get_num_threads(),
            "machine": platform.machine(), "torch": torch.__version__}
    args.out.write_text(json.dumps({**meta, "results": rows}, indent=1) + "\n")
    console.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Bytes per token of the whole payload a validator fetches, on real SmolLM2-135M artifacts (issue 21 #5).

For each length N (default 64, 256, 4096) it generates N tokens with the transformers engine and the
canonical sampler (T 0.7, top-p 0.95, K 5, stop tokens ignored so that N is exact), builds the artifact
and the TOPLOC fingerprint, and reports, per generated token (header and prompt amortised):
  raw           header + leaves + fingerprint chunks, uncompressed
  wire v1       the v1 artifact frame (zstd level 3 of header ‖ leaves) + fingerprint chunks
  wire v2       the v2 artifact frame (columns, zstd level 19) + fingerprint chunks
  wire v3       the v3 artifact frame (columns, weights predicted from the logprobs, zstd 19) + fingerprint chunks
The fingerprint chunks (258 bytes per 32 tokens, polynomial coefficients) do not compress: they are
counted raw. Beside TOPLOC (kind 0) the table shows the projection fingerprint (kind 1, protocol v2) in
the configurations of PROJECTIONS: its blob raw and zstd-19, and the whole payload with it (wire v2, v3).
The JSON payload of the HTTP/libp2p exchange base64-encodes both (+33 %); the binary sizes are the floor
the table holds to (goal: ≤ 48 B/token at 256 tokens, compressed).
Usage: python scripts/bench_payload.py [--tokens 64 256 4096] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import zstandard
from rich.console import Console
from rich.table import Table

from node.engines.base import GenerationRequest
from node.engines.models import get_model_spec, materialise_model
from node.engines.tokenizer import ModelTokenizer
from node.engines.transformers_engine import TransformersEngine, TransformersOptions
from node.protocol.artifact import (
    Artifact,
    ArtifactHeader,
    encode_artifact_wire,
    encode_header,
    encode_leaves,
    positions_from_samples,
)
from node.protocol.fingerprint import build_fingerprint
from node.protocol.projection import LAST_HIDDEN, ProjectionSpec, build_projection_blob, compute_projection_seed
from node.protocol.sampler import SamplingParams
from node.protocol.seed import run_seed

MODEL = "smollm2-135m-instruct"
# kind-1 configurations measured: name → (sources, k, bits); "last" is the last hidden state
PROJECTIONS = {"v2 layers 0+28 1×16b": ProjectionSpec((0, 28), 1, 16),  # registered for the bf16 entry
               "v2 last 2×16b": ProjectionSpec((LAST_HIDDEN,), 2, 16),  # registered for the fp32 entry
               "v2 layer 7 4×8b": ProjectionSpec((7,), 4, 8),  # registered for bf16 until 2026-11-27
               "v2 last 16×2b": ProjectionSpec((LAST_HIDDEN,), 16, 2),
               "v2 last 32×1b": ProjectionSpec((LAST_HIDDEN,), 32, 1),
               "v2 last 8×4b": ProjectionSpec((LAST_HIDDEN,), 8, 4)}
RECORDED = (0, 7, 28)  # decoder layers the engine records for the projections above
PROMPT = "Write a long, detailed story about a lighthouse keeper who finds a message in a bottle."
GOAL_BYTES_PER_TOKEN = 48  # compressed, at 256 tokens


def measure(engine: TransformersEngine, model_id: bytes, prompt: tuple[int, ...], tokens: int) -> dict[str, Any]:
    """Return the payload sizes of one real generation of `tokens` tokens."""
    params = SamplingParams(0.7, 0.95, 0, tokens)
    request = GenerationRequest(prompt, params, run_seed(7, tokens), 5)
    started = time.perf_counter()
    gen = engine.generate([request])[0]
    generate_s = time.perf_counter() - started
    n = len(gen.output_ids)
    header = ArtifactHeader(model_id, params.temperature_bits, params.top_p_bits, 0, tokens, 5, request.run_seed,
                            prompt, n)
    art = Artifact(header, positions_from_samples(gen.samples, 5))
    fingerprint = sum(len(c) for c in build_fingerprint(gen.hidden, len(prompt)))
    started = time.perf_counter()
    v2 = len(encode_artifact_wire(art, version=2))
    encode_v2_ms = (time.perf_counter() - started) * 1e3
    started = time.perf_counter()
    v3 = len(encode_artifact_wire(art, version=3))
    encode_v3_ms = (time.perf_counter() - started) * 1e3
    sizes = {"header": len(encode_header(header)), "leaves": len(encode_leaves(art.positions)),
             "fingerprint": fingerprint, "wire_v1": len(encode_artifact_wire(art, version=1)), "wire_v2": v2,
             "wire_v3": v3}
    seed = compute_projection_seed(request.run_seed, bytes(32))
    projections = {}
    for name, spec in PROJECTIONS.items():
        layers = gen.layers if gen.layers is not None else np.zeros((0, 0, 0), dtype=np.float32)
        sources = [gen.hidden if s == LAST_HIDDEN else layers[RECORDED.index(s)] for s in spec.layers]
        blob = build_projection_blob([rows[len(prompt) - 1:] for rows in sources], spec, seed)
        packed = len(zstandard.ZstdCompressor(level=19).compress(blob))
        projections[name] = {"raw": len(blob) / n, "zstd": packed / n, "wire_v2": (v2 + min(len(blob), packed)) / n,
                             "wire_v3": (v3 + min(len(blob), packed)) / n}
    return {"tokens": n, "prompt_tokens": len(prompt), "generate_s": generate_s, "encode_v2_ms": encode_v2_ms,
            "encode_v3_ms": encode_v3_ms, "bytes": sizes,
            "per_token": {"raw": (sizes["header"] + sizes["leaves"] + fingerprint) / n,
                          "wire_v1": (sizes["wire_v1"] + fingerprint) / n,
                          "wire_v2": (v2 + fingerprint) / n,
                          "wire_v3": (v3 + fingerprint) / n,
                          "fingerprint": fingerprint / n},
            "projection_per_token": projections}


def main(argv: list[str] | None = None) -> int:
    """Run the measurement, print the table and write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[64, 256, 4096])
    parser.add_argument("--out", type=Path, default=Path("bench-results/bench_payload.json"))
    args = parser.parse_args(argv)
    files = materialise_model(get_model_spec(MODEL))
    prompt = ModelTokenizer(files.path, True).encode_chat([{"role": "user", "content": PROMPT}])
    engine = TransformersEngine(files.path, MODEL, TransformersOptions(record_layers=RECORDED))
    rows = [measure(engine, files.model_id, prompt, n) for n in args.tokens]
    table = Table(title=f"{MODEL}: payload bytes per generated token (K 5, prompt {len(prompt)} tokens amortised)")
    for col in ("tokens", "raw", "wire v1 (zstd 3)", "wire v2 (columns, zstd 19)", "wire v3 (predicted weights)",
                "of which fingerprint", "v2 ÷ v1", "v3 ÷ v2", "v2 / v3 encode ms"):
        table.add_column(col, justify="right")
    for r in rows:
        t = r["per_token"]
        table.add_row(str(r["tokens"]), f"{t['raw']:.1f}", f"{t['wire_v1']:.1f}", f"{t['wire_v2']:.1f}",
                      f"{t['wire_v3']:.1f}", f"{t['fingerprint']:.1f}", f"{t['wire_v2'] / t['wire_v1']:.3f}",
                      f"{t['wire_v3'] / t['wire_v2']:.3f}", f"{r['encode_v2_ms']:.1f} / {r['encode_v3_ms']:.1f}")
    console = Console(width=140)
    console.print(table)
    kinds = Table(title="fingerprint bytes per generated token by kind (whole payload: wire v2 or v3 + the "
                        "fingerprint, the smaller of raw and zstd)")
    for col in ("tokens", "kind", "fingerprint raw", "fingerprint zstd 19", "whole payload v2", "whole payload v3"):
        kinds.add_column(col, justify="right")
    for r in rows:
        t = r["per_token"]
        kinds.add_row(str(r["tokens"]), "v1 TOPLOC", f"{t['fingerprint']:.2f}", "(does not compress)",
                      f"{t['wire_v2']:.1f}", f"{t['wire_v3']:.1f}")
        for name, v in r["projection_per_token"].items():
            kinds.add_row(str(r["tokens"]), name, f"{v['raw']:.2f}", f"{v['zstd']:.2f}", f"{v['wire_v2']:.1f}",
                          f"{v['wire_v3']:.1f}")
    console.print(kinds)
    at256 = next((r for r in rows if r["tokens"] == 256), None)
    if at256 is not None:
        value = min(at256["per_token"]["wire_v2"], at256["per_token"]["wire_v3"])
        console.print(f"goal ≤ {GOAL_BYTES_PER_TOKEN} B/token compressed at 256 tokens (best wire): {value:.1f} "
                      f"({'met' if value <= GOAL_BYTES_PER_TOKEN else 'missed'})")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"benchmark": "payload", "model": MODEL, "machine": platform.machine(),
                                    "torch": torch.__version__, "goal_bytes_per_token_256": GOAL_BYTES_PER_TOKEN,
                                    "results": rows}, indent=1) + "\n")
    console.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Sensitivity sweep: how many generated tokens it takes to catch smaller lies (weight noise 0.1 / 0.3 / 1 %,
temperature +0.02 / +0.05 / +0.1, top_p 0.95 declared while 0.9 was used).

Each run records, besides the usual prefix summaries, the weight error of every position. With the
profile's weight-error threshold, q = the share of positions over it (pooled over a variant's runs);
if positions are independent, n tokens miss with probability (1 − q)^n, so 99.9 % detection needs
n = ln(0.001) / ln(1 − q). The run-level detection at 16/32/64 tokens is reported beside it as the
check on that assumption.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

from node.calibrate.models import make_noisy_engine
from node.calibrate.runs import Claim, Lab, RunSpec, claim_from_generation, generate, validate_claim
from node.checks.stage2 import measure_position_fast
from node.protocol.sampler import SamplingParams
from node.protocol.seed import compute_sampler_uniforms, run_seed

NOISE = {"noise-0.1pct": 0.001, "noise-0.3pct": 0.003, "noise-1pct": 0.01}
TEMPERATURE = {"temperature+0.02": 0.02, "temperature+0.05": 0.05, "temperature+0.1": 0.1}
TOP_P = ("top-p-0.95-claimed-for-0.9",)
SWEEP = (*NOISE, *TEMPERATURE, *TOP_P)
DECLARED_T = 0.7


def sweep_claim(lab: Lab, spec: RunSpec, engines: dict[str, Any]) -> tuple[Claim, tuple[int, ...], SamplingParams,
                                                                          int, int]:
    """Return a sweep variant's claim with the declared request it answers."""
    ids, params, user_seed, iid = lab.request(spec)
    declared = SamplingParams(DECLARED_T, 0.95 if spec.name in TOP_P else 1.0, 0, params.max_tokens)
    seed = run_seed(user_seed, iid)
    if spec.name in NOISE:
        gen = generate(engines[spec.name], lab, ids, declared, seed)
    elif spec.name in TEMPERATURE:
        gen = generate(lab.honest, lab, ids, replace(declared, temperature=DECLARED_T + TEMPERATURE[spec.name]),
                       seed)
    else:
        gen = generate(lab.honest, lab, ids, replace(declared, top_p=0.9), seed)
    return claim_from_generation(lab, ids, declared, seed, gen), ids, declared, user_seed, iid


def position_weight_errors(lab: Lab, claim: Claim, ids: tuple[int, ...], params: SamplingParams) -> list[float]:
    """Return the weight error at every position of a claim."""
    pre = lab.validator.prefill(ids, claim.output_ids)
    v = compute_sampler_uniforms(claim.header.run_seed, len(claim.positions))
    p = claim.positions
    return [measure_position_fast(pre.logits[i], params, int(v[i]), int(p.chosen[i]), p.token_ids[i], p.weights[i],
                                  p.raw_logprobs[i]).weight_error for i in range(len(p))]


def run_sweep(lab: Lab, path: Path, runs: int, progress: Any) -> int:
    """Run every sweep variant `runs` times (resumable), appending records; return how many ran."""
    done = set()
    if path.exists():
        done = {json.loads(line)["key"] for line in path.read_text().splitlines() if line.strip()}
    specs = [RunSpec("sweep", name, i) for i in range(runs) for name in SWEEP]
    todo = [s for s in specs if s.key not in done]
    engines = {name: make_noisy_engine(lab.honest, rel, seed=7) for name, rel in NOISE.items()} if todo else {}
    with path.open("a") as f:
        for n, spec in enumerate(todo):
            claim, ids, params, user_seed, iid = sweep_claim(lab, spec, engines)
            record = {"key": spec.key, "kind": "sweep", "name": spec.name, "temperature": params.temperature,
                      "top_p": params.top_p, "weight_errors": position_weight_errors(lab, claim, ids, params),
                      "lengths": validate_claim(lab, claim, ids, params, user_seed, iid)}
            f.write(json.dumps(record) + "\n")
            f.flush()
            progress(n + 1, len(todo))
    return len(todo)


def tokens_for(q: float, target: float = 0.999) -> float:
    """Return the tokens needed to catch with probability `target` when each position is over with probability q."""
    if q <= 0:
        return math.inf
    if q >= 1:
        return 1.0
    return math.ceil(math.log(1 - target) / math.log(1 - q))


def summarise_sweep(records: list[dict[str, Any]], thresholds: dict[str, float]) -> list[dict[str, Any]]:
    """Return per variant: runs, positions, q, tokens for 99.9 %, and run-level detection per prefix.

    ``detected`` counts runs with a position over the weight-error threshold (the per-position model);
    ``decided`` counts runs the profile's whole decision rejects (every signal kept, stage 1 included).
    """
    from node.calibrate.fit import first_violation, with_derived_signals

    threshold = thresholds["weight_error_max"]
    out = []
    for name in SWEEP:
        rows = [r for r in records if r["name"] == name]
        errors = [e for r in rows for e in r["weight_errors"]]
        q = sum(e > threshold for e in errors) / len(errors) if errors else 0.0
        detected = {n: sum(any(e > threshold for e in r["weight_errors"][: int(n)]) for r in rows)
                    for n in ("16", "32", "64")}
        decided = {n: sum(bool(first_violation(with_derived_signals(r["lengths"][n]), thresholds)) for r in rows
                          if n in r["lengths"])
                   for n in ("16", "32", "64")}
        out.append({"variant": name, "runs": len(rows), "positions": len(errors), "q": q,
                    "tokens_99_9": tokens_for(q), "detected": detected, "decided": decided})
    return out

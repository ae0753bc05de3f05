"""The stock-sampler campaign: honest stock-vLLM operators and cheaters, checked by Token-DiFR and surprisal.

Runs in .venv-vllm (scripts/calibrate_stock.py). Every run answers a request of the seeded campaign's
shape (node.calibrate.runs: the same prompts, parameter grid and run seeds), with the vLLM request
seed derived from the run seed (node.protocol.vllm_sampler.vllm_request_seed). The validator is the
transformers engine in float32: one prefill of prompt + output, then node.checks.stock at each prefix
length. Honest runs are stock vLLM (fp32, CPU); an honest vLLM run also replays vLLM's choices from
vLLM's own logits and records how many differ (the reproduction measured at scale). The cheaters:

- int8 / bf16 / weight-noise-1pct / other-model-tiny: another model or weights, sampled with vLLM's
  rule and the right seed (``generate_with_vllm_rule``; what a cheater would do to look stock);
- temperature-lie / top-p-lie: stock vLLM at other params than the declared ones, right seed;
- wrong-seed: stock vLLM, the real model and params, another seed (noise not the protocol's: what an
  operator ignoring the seed, or picking among several samples, produces).
Records are appended to a JSONL file as they finish; a rerun skips the keys already there.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from node.calibrate.runs import PARAM_GRID, drop_torn_tail, read_records
from node.checks.stock import measure_stock_positions, summarise_stock
from node.engines.tokenizer import ModelTokenizer
from node.engines.transformers_engine import TransformersEngine
from node.protocol.sampler import SamplingParams
from node.protocol.seed import run_seed
from node.protocol.vllm_sampler import (
    compute_gumbel_noise,
    compute_processed_logits,
    compute_step_seeds,
    is_greedy,
    vllm_request_seed,
)

log = logging.getLogger(__name__)

LENGTHS = (16, 32, 64)
HONEST = ("vllm",)
ATTACKS = ("int8", "bf16", "weight-noise-1pct", "other-model-tiny", "temperature-lie", "top-p-lie", "wrong-seed")
NO_OP_AT_GREEDY = ("top-p-lie", "wrong-seed")  # greedy decoding uses neither top_p nor noise


@dataclass(frozen=True)
class StockRun:
    """One campaign run: honest or attack, which variant, which request index."""

    kind: str
    name: str
    index: int

    @property
    def key(self) -> str:
        """Return the run's unique key (for resuming and the calibration/held-out split)."""
        return f"stock/{self.kind}/{self.name}/{self.index}"


@dataclass
class StockLab:
    """The claimed model (stock vLLM), the validator and the cheaters' engines."""

    tokenizer: ModelTokenizer
    validator: TransformersEngine
    vllm: Any  # node.engines.vllm_engine.VllmEngine (imported by the script: vLLM lives in .venv-vllm)
    cheaters: dict[str, TransformersEngine]
    prompts: list[str]
    tokens: int

    def request(self, run: StockRun) -> tuple[tuple[int, ...], SamplingParams, bytes]:
        """Return the prompt ids, declared params and run seed of a run (the seeded campaign's rule)."""
        prompt = self.prompts[run.index % len(self.prompts)]
        t, p = PARAM_GRID[(run.index // len(self.prompts) + run.index) % len(PARAM_GRID)]
        ids = self.tokenizer.encode_chat([{"role": "user", "content": prompt}])
        iid = int.from_bytes(hashlib.sha256(run.key.encode()).digest()[:8], "big")
        return ids, SamplingParams(t, p, 0, self.tokens), run_seed(run.index + 1, iid)


@torch.inference_mode()
def generate_with_vllm_rule(engine: TransformersEngine, prompt_ids: tuple[int, ...], params: SamplingParams,
                            request_seed: int) -> tuple[int, ...]:
    """Return the tokens vLLM's seeded CPU sampler would pick from this engine's logits, all max_tokens of them."""
    return engine.generate_with_vllm_rule(prompt_ids, params, request_seed)


def count_replay_mismatches(logits: np.ndarray, output_ids: tuple[int, ...], params: SamplingParams,
                            request_seed: int) -> int:
    """Return how many of vLLM's tokens the reproduction does not pick from vLLM's own logits."""
    processed = compute_processed_logits(logits, params)
    if is_greedy(params):
        return int((np.argmax(processed, axis=1) != np.asarray(output_ids)).sum())
    noise = compute_gumbel_noise(compute_step_seeds(request_seed, len(output_ids)), logits.shape[1])
    return int((np.argmax(processed.astype(np.float64) + noise, axis=1) != np.asarray(output_ids)).sum())


def produce(lab: StockLab, run: StockRun) -> tuple[tuple[int, ...], dict[str, Any]]:
    """Return the output tokens a run's operator serves and extra facts to record."""
    ids, params, seed = lab.request(run)
    request_seed = vllm_request_seed(seed)
    if run.kind == "honest":
        gen = lab.vllm.generate_stock(ids, params, request_seed, record_logits=True)
        return gen.output_ids, {"replay_mismatches": count_replay_mismatches(gen.logits, gen.output_ids, params,
                                                                              request_seed), "_logits": gen.logits}
    name = run.name
    if name in lab.cheaters:
        return generate_with_vllm_rule(lab.cheaters[name], ids, params, request_seed), {}
    if name == "temperature-lie":
        actual = replace(params, temperature=max(params.temperature, 0.7) + 0.1)
        return lab.vllm.generate_stock(ids, actual, request_seed).output_ids, {"actual_temperature": actual.temperature}
    if name == "top-p-lie":
        actual = replace(params, top_p=0.9 if params.top_p == 1.0 else 0.95)
        return lab.vllm.generate_stock(ids, actual, request_seed).output_ids, {"actual_top_p": actual.top_p}
    if name == "wrong-seed":
        return lab.vllm.generate_stock(ids, params, (request_seed + 1) % 2**63).output_ids, {}
    raise ValueError(f"unknown stock attack {name}")


def validate(lab: StockLab, run: StockRun,
             output_ids: tuple[int, ...]) -> tuple[np.ndarray, list[float], dict[str, dict[str, Any]]]:
    """Return the validator's logits (one prefill), the per-position margins and the signals at every prefix length."""
    ids, params, seed = lab.request(run)
    logits = lab.validator.prefill(ids, output_ids).logits
    positions = measure_stock_positions(logits, output_ids, params, vllm_request_seed(seed))
    margins = [float(f"{x:.7g}") for x in positions.difr.tolist()]
    return logits, margins, {str(n): summarise_stock(positions, n).as_dict() for n in LENGTHS if n <= len(output_ids)}


def run_one(lab: StockLab, run: StockRun) -> dict[str, Any]:
    """Return the record of one run."""
    _, params, _ = lab.request(run)
    started = time.monotonic()
    output_ids, extra = produce(lab, run)
    generated = time.monotonic()
    operator_logits = extra.pop("_logits", None)
    logits, margins, lengths = validate(lab, run, output_ids)
    if operator_logits is not None:  # how far two honest fp32 kernels' logits differ: the floor of honest margins
        extra["logit_noise_max"] = float(np.abs(operator_logits - logits).max())
    return {"key": run.key, "kind": run.kind, "name": run.name, "prompt": run.index % len(lab.prompts),
            "temperature": params.temperature, "top_p": params.top_p, **extra,
            "seconds": {"generate": round(generated - started, 3), "validate": round(time.monotonic() - generated, 3)},
            "margins": margins, "lengths": lengths}


def plan(honest: int, per_attack: int, start: int = 0) -> Iterator[StockRun]:
    """Yield honest runs with the attack rounds (one run of every attack) spread evenly among them.

    An interrupted campaign thus holds honest and attack runs in the planned proportion; keys do not
    depend on the counts, so a larger plan extends a smaller one.
    """
    rounds = 0
    for i in range(max(honest, 1)):
        if i < honest:
            yield StockRun("honest", HONEST[i % len(HONEST)], start + i)
        while rounds < per_attack and rounds * max(honest, 1) <= i * per_attack:
            for attack in ATTACKS:
                yield StockRun("attack", attack, start + rounds)
            rounds += 1
    for j in range(rounds, per_attack):
        for attack in ATTACKS:
            yield StockRun("attack", attack, start + j)


def run_campaign(lab: StockLab, path: Path, runs: list[StockRun], progress: Callable[[int, int], None]) -> int:
    """Run every run not yet recorded in the JSONL file, appending records; return how many ran."""
    path.parent.mkdir(parents=True, exist_ok=True)
    drop_torn_tail(path)
    done = {r["key"] for r in read_records(path)}
    todo = [r for r in runs if r.key not in done]
    with path.open("a") as f:
        for n, run in enumerate(todo):
            f.write(json.dumps(run_one(lab, run)) + "\n")
            f.flush()
            progress(n + 1, len(todo))
    return len(todo)

"""MoE calibration campaign: honest and attack traces, every duty's measurements, limits fit, held-out report.

Sequences are real generations of the MoE model (canonical sampler, chat prompts from
config/calibration/prompts.toml). Each sequence is traced honestly and under each attack; the target expert
rotates over layers and experts. Even-indexed sequences form the calibration split (limits are fit on
their honest measurements only), odd-indexed the held-out split (false positives and detection reported).
Honest validators recompute expert rows one at a time (another kernel path than the executer's batch) and
with another thread count, so the honest spread includes real floating-point noise.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from node.moe.attacks import cheap_router, forge_inputs, forge_inputs_consistently, int8_expert, swapped_expert
from node.moe.trace import MoeTrace, build_commitment, record_trace
from node.moe.validate import (
    ExpertCheck,
    ExpertWeights,
    LinkCheck,
    MoeLimits,
    RouterCheck,
    decide_expert,
    decide_link,
    decide_router,
    load_expert,
    load_router,
    verify_expert,
    verify_link,
    verify_router,
)
from node.protocol.moe import ExpertKey, MoeCommitment, MoeReason

log = logging.getLogger(__name__)
TARGET_LAYERS = (3, 10, 17, 24, 29)
CHEAP_EXPERTS = (0, 1)
# Limits sit this factor above the largest honest calibration measurement, and never below the floor: fp32
# noise between machines (other BLAS, other CPU) is larger than between two runs on this one.
LIMIT_FACTOR = 10.0
FLOORS = {"expert_rel_error": 1e-4, "router_weight_error": 1e-4, "link_rel_error": 1e-4}


@dataclass(frozen=True)
class CaseResult:
    """One sequence under one attack (or honest): the measurements of the duties that look at it."""

    sequence: int
    split: str
    attack: str
    target: str
    expert: ExpertCheck
    router_choice_mismatches: int
    router_weight_error: float
    router_hash_mismatches: int
    link: LinkCheck


@dataclass(frozen=True)
class TokenSequence:
    """A prompt + generated output of the MoE model (token ids)."""

    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]

    @property
    def fed(self) -> list[int]:
        """Return the token ids a teacher-forced pass feeds (the last output token is never fed)."""
        return [*self.prompt_ids, *self.output_ids[:-1]]


class Duties:
    """The validator side: expert weights and routers loaded on demand from the model folder, the shared model."""

    def __init__(self, model_dir: Path, shared: Any) -> None:
        self.model_dir = model_dir
        self.shared = shared
        self._experts: dict[ExpertKey, ExpertWeights] = {}
        self._routers: dict[int, torch.Tensor] = {}

    def expert(self, key: ExpertKey) -> ExpertWeights:
        """Return one expert's weights (cached)."""
        if key not in self._experts:
            self._experts[key] = load_expert(self.model_dir, key)
        return self._experts[key]

    def router(self, layer: int) -> torch.Tensor:
        """Return one layer's router (cached)."""
        if layer not in self._routers:
            self._routers[layer] = load_router(self.model_dir, layer)
        return self._routers[layer]


def compute_target(index: int, num_layers: int, num_experts: int) -> tuple[ExpertKey, int]:
    """Return the attacked expert and the expert whose weights replace it, for sequence index."""
    layer = TARGET_LAYERS[index % len(TARGET_LAYERS)] % num_layers
    expert = (index // len(TARGET_LAYERS) + index) % num_experts
    return ExpertKey(layer, expert), (expert + 1) % num_experts


def _attack_context(model: Any, attack: str, key: ExpertKey, source: int) -> AbstractContextManager[None]:
    if attack == "int8-expert":
        return int8_expert(model, key)
    if attack == "swapped-expert":
        return swapped_expert(model, key, source)
    if attack == "cheap-router":
        return cheap_router(model, CHEAP_EXPERTS)
    return nullcontext()


def trace_case(model: Any, seq: TokenSequence, attack: str, key: ExpertKey, source: int) -> MoeTrace:
    """Return the trace an executer running `attack` would send for seq."""
    if attack == "forged-inputs":
        return forge_inputs(model, seq.fed, key, source)
    if attack == "forged-consistent":
        return forge_inputs_consistently(model, seq.fed, key, source)
    with _attack_context(model, attack, key, source):
        return record_trace(model, seq.fed)


def measure_trace(duties: Duties, seq: TokenSequence, trace: MoeTrace, keys: Sequence[ExpertKey],
                  row_block: int | None) -> tuple[list[ExpertCheck], list[RouterCheck], LinkCheck]:
    """Return the given experts', every router's and the link duty's measurements of one trace."""
    c: MoeCommitment = build_commitment(trace)
    experts = [verify_expert(duties.expert(k), c.leaves_of(k), trace.get_expert_inputs(k), row_block=row_block)
               for k in keys]
    routers = []
    for layer in range(c.num_layers):
        rl = [r for r in c.router if r.layer == layer]
        routers.append(verify_router(duties.router(layer), rl, trace.inputs[layer, [r.position for r in rl]]))
    return experts, routers, verify_link(duties.shared, seq.fed, c, trace)


def run_campaign(model: Any, duties: Duties, sequences: Sequence[TokenSequence], attacks: Sequence[str],
                 progress: Callable[[str], None] | None = None) -> Iterator[CaseResult]:
    """Yield every (sequence, honest-or-attack, expert) case's measurements."""
    num_experts = int(model.config.num_local_experts)
    for i, seq in enumerate(sequences):
        key, source = compute_target(i, int(model.config.num_hidden_layers), num_experts)
        split = "calibration" if i % 2 == 0 else "held-out"
        for attack in ("honest", *attacks):
            trace = trace_case(model, seq, attack, key, source)
            keys = [ExpertKey(key.layer, e) for e in range(num_experts)] if attack == "honest" else [key]
            threads = torch.get_num_threads()
            torch.set_num_threads(1)  # the validator: another thread count, expert rows one at a time
            try:
                experts, routers, link = measure_trace(duties, seq, trace, keys, row_block=1)
            finally:
                torch.set_num_threads(threads)
            for k, expert in zip(keys, experts, strict=True):  # honest: every expert of the layer is a sample
                yield CaseResult(i, split, attack, str(k), expert, max(r.choice_mismatches for r in routers),
                                 max(r.max_weight_error for r in routers),
                                 sum(r.input_hash_mismatches for r in routers), link)
            if progress:
                progress(f"sequence {i} {attack} done")


def fit_limits(results: Sequence[CaseResult]) -> MoeLimits:
    """Return limits from the calibration split's honest measurements (LIMIT_FACTOR × max, at least the floor)."""
    honest = [r for r in results if r.split == "calibration" and r.attack == "honest"]
    if not honest:
        raise ValueError("no honest calibration cases")
    return MoeLimits(
        expert_rel_error=max(LIMIT_FACTOR * max(r.expert.max_rel_error for r in honest), FLOORS["expert_rel_error"]),
        expert_index_mismatches=max(r.expert.max_index_mismatches for r in honest),
        router_weight_error=max(LIMIT_FACTOR * max(r.router_weight_error for r in honest),
                                FLOORS["router_weight_error"]),
        link_rel_error=max(LIMIT_FACTOR * max(r.link.max_input_rel_error for r in honest), FLOORS["link_rel_error"]))


def decide_case(result: CaseResult, limits: MoeLimits) -> dict[str, MoeReason]:
    """Return each duty's decision on one case."""
    router = RouterCheck(-1, 0, result.router_hash_mismatches, result.router_choice_mismatches,
                         result.router_weight_error)
    return {"expert": decide_expert(result.expert, limits), "router": decide_router(router, limits),
            "link": decide_link(result.link, limits)}


def summarise(results: Sequence[CaseResult], limits: MoeLimits, split: str = "held-out") -> dict[str, Any]:
    """Return per attack and duty the fraction of cases rejected on one split (honest: false positives)."""
    table: dict[str, Any] = {}
    for attack in sorted({r.attack for r in results}):
        cases = [r for r in results if r.split == split and r.attack == attack]
        if not cases:
            continue
        decisions = [decide_case(r, limits) for r in cases]
        row: dict[str, Any] = {"cases": len(cases)}
        for duty in ("expert", "router", "link"):
            row[duty] = sum(1 for d in decisions if d[duty] != MoeReason.OK) / len(cases)
        row["any"] = sum(1 for d in decisions if any(v != MoeReason.OK for v in d.values())) / len(cases)
        row["expert_rel_error_min"] = min(r.expert.max_rel_error for r in cases)
        row["expert_rel_error_max"] = max(r.expert.max_rel_error for r in cases)
        row["link_rel_error_min"] = min(r.link.max_input_rel_error for r in cases)
        row["link_rel_error_max"] = max(r.link.max_input_rel_error for r in cases)
        table[attack] = row
    return table


def result_to_json(result: CaseResult) -> dict[str, Any]:
    """Return one case as plain JSON."""
    return asdict(result)


def generate_sequences(engine: Any, tokenizer: Any, prompts: Sequence[str], count: int, max_tokens: int,
                       stop_ids: frozenset[int]) -> list[TokenSequence]:
    """Return count real generations (prompt i mod len, temperature 0.7, run seed from the index)."""
    from node.engines.base import GenerationRequest
    from node.protocol.sampler import SamplingParams
    from node.protocol.seed import run_seed

    out = []
    for i in range(count):
        prompt_ids = tokenizer.encode_chat([{"role": "user", "content": prompts[i % len(prompts)]}])
        params = SamplingParams(temperature=0.7, top_p=0.95, max_tokens=max_tokens)
        request = GenerationRequest(tuple(prompt_ids), params, run_seed(20, i), 5, stop_ids)
        generation = engine.generate([request])[0]
        out.append(TokenSequence(tuple(prompt_ids), tuple(generation.output_ids)))
    return out

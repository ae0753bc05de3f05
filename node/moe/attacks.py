"""Cheating MoE executers: each changes the loaded model (restored on exit) or forges the recorded trace.

- int8 expert: one expert's weights rounded to symmetric per-row int8 (a cheaper, smaller expert);
- swapped expert: one expert runs another expert's weights (hold fewer experts);
- cheap router: every layer's router may only choose among a cheap subset (load and run fewer experts);
- forged inputs: one expert swapped as above, and its leaves forged so its holder's check passes: the
  input rows of its leaves are replaced by rows x' optimised so that the honest expert maps x' onto what
  the swapped expert produced, and the leaves commit the honest expert's output on x'. The router leaves
  and the other experts keep the true rows, so only the link duty sees that the hashes disagree.

Decode-only cheats (issue 30, finding 2): the served tokens and their leaves come from a cheaper decode, while
the per-expert trace is recorded honestly by the real model in the teacher-forced pass after decoding
(`DecodeOnlyEngine`, plugged in as the executer's engine). Every duty then passes: only the dense stage 1
and stage 2 on the served tokens (the hub committee's check, node.moe.dense) can see them.

- top-1 routing: every router keeps only its first expert (weight 1): half the expert work;
- top-1 in the last layer: the same in the last MoE layer only (the smallest change to the output);
- int8 experts: every expert of every layer rounded to symmetric per-row int8;
- dense parent: the tokens decoded by the dense model the MoE was upcycled from (a quarter of the weights).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from node.engines.base import ClaimsIdentityOf, Engine, Generation, GenerationRequest, Prefill
from node.moe.trace import ExpertRows, MoeTrace, compute_expert_output, record_trace
from node.protocol.moe import ExpertKey

ATTACKS = ("int8-expert", "swapped-expert", "cheap-router", "forged-inputs")
VARIANTS = ("forged-consistent",)  # measured separately (docs/moe.md), not in the campaign
# decode-only cheats: the served tokens from a cheaper decode, the trace from the real model (DecodeOnlyEngine)
DECODE_ONLY = ("moe-top1-routing", "moe-top1-last-layer", "moe-int8-experts", "moe-dense-parent")


def compute_int8_rows(w: torch.Tensor) -> torch.Tensor:
    """Return w rounded to symmetric per-row int8 and scaled back (what an int8 kernel computes with)."""
    scale = w.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / 127.0
    return torch.round(w / scale).clamp(-127, 127) * scale


@contextmanager
def _patched_expert(model: Any, key: ExpertKey, gate_up: torch.Tensor, down: torch.Tensor) -> Iterator[None]:
    experts = model.model.layers[key.layer].mlp.experts
    saved = (experts.gate_up_proj.data[key.expert].clone(), experts.down_proj.data[key.expert].clone())
    experts.gate_up_proj.data[key.expert] = gate_up
    experts.down_proj.data[key.expert] = down
    try:
        yield
    finally:
        experts.gate_up_proj.data[key.expert] = saved[0]
        experts.down_proj.data[key.expert] = saved[1]


@contextmanager
def int8_expert(model: Any, key: ExpertKey) -> Iterator[None]:
    """Run one expert with int8-rounded weights."""
    experts = model.model.layers[key.layer].mlp.experts
    with _patched_expert(model, key, compute_int8_rows(experts.gate_up_proj.data[key.expert]),
                         compute_int8_rows(experts.down_proj.data[key.expert])):
        yield


@contextmanager
def swapped_expert(model: Any, key: ExpertKey, source: int) -> Iterator[None]:
    """Run expert key with the weights of expert `source` of the same layer."""
    experts = model.model.layers[key.layer].mlp.experts
    with _patched_expert(model, key, experts.gate_up_proj.data[source].clone(),
                         experts.down_proj.data[source].clone()):
        yield


@contextmanager
def cheap_router(model: Any, cheap: Sequence[int]) -> Iterator[None]:
    """Let every router choose only among the cheap experts (the others' logits masked before top-k)."""
    gates = [layer.mlp.gate for layer in model.model.layers]
    allowed = torch.zeros(gates[0].num_experts, dtype=torch.bool)
    allowed[list(cheap)] = True
    originals = [g.forward for g in gates]

    def masked(gate: Any) -> Any:
        def forward(hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            hidden_states = hidden_states.reshape(-1, gate.hidden_dim)
            logits = torch.nn.functional.linear(hidden_states, gate.weight).masked_fill(~allowed, float("-inf"))
            probs = torch.softmax(logits.float(), dim=-1)
            top_v, top_i = torch.topk(probs, gate.top_k, dim=-1)
            return logits, top_v / top_v.sum(dim=-1, keepdim=True), top_i
        return forward

    for g in gates:
        g.forward = masked(g)
    try:
        yield
    finally:
        for g, f in zip(gates, originals, strict=True):
            g.forward = f


def forge_inputs(model: Any, token_ids: Sequence[int], key: ExpertKey, source: int, steps: int = 200) -> MoeTrace:
    """Return the trace of a swapped-expert run whose leaves of `key` are forged onto optimised inputs."""
    with swapped_expert(model, key, source):
        trace = record_trace(model, token_ids)
    rows = trace.outputs.get(key)
    if rows is None:
        return trace
    experts = model.model.layers[key.layer].mlp.experts
    gate_up, down = experts.gate_up_proj.data[key.expert], experts.down_proj.data[key.expert]
    target = torch.from_numpy(rows.outputs)  # what the swapped expert really produced
    x = torch.from_numpy(trace.inputs[key.layer, rows.positions]).clone().requires_grad_(True)
    opt = torch.optim.Adam([x], lr=0.02)
    with torch.enable_grad():
        for _ in range(steps):
            opt.zero_grad()
            loss = (compute_expert_output(gate_up, down, x, experts.act_fn) - target).pow(2).mean()
            loss.backward()  # type: ignore[no-untyped-call]
            opt.step()
    forged = x.detach()
    with torch.no_grad():
        y = compute_expert_output(gate_up, down, forged, experts.act_fn).numpy().copy()
    outputs = dict(trace.outputs)
    outputs[key] = ExpertRows(rows.positions, y)
    return dataclasses.replace(trace, outputs=outputs, expert_inputs={key: forged.numpy().copy()})


def forge_inputs_consistently(model: Any, token_ids: Sequence[int], key: ExpertKey, source: int) -> MoeTrace:
    """Return a forged-inputs trace whose router leaves and co-routed experts also commit the forged rows.

    Every leaf at the forged positions then names x' (no hash conflict); the other expert routed there
    commits its honest output on x'. What the forger cannot change is the link duty's own walk.
    """
    trace = forge_inputs(model, token_ids, key, source)
    forged = trace.expert_inputs.get(key)
    rows = trace.outputs.get(key)
    if forged is None or rows is None:
        return trace
    inputs = trace.inputs.copy()
    inputs[key.layer, rows.positions] = forged
    experts = model.model.layers[key.layer].mlp.experts
    outputs = dict(trace.outputs)
    for other in range(trace.num_experts):
        okey = ExpertKey(key.layer, other)
        orows = outputs.get(okey)
        if other == key.expert or orows is None:
            continue
        x = torch.from_numpy(inputs[key.layer, orows.positions])
        with torch.no_grad():
            y = compute_expert_output(experts.gate_up_proj.data[other], experts.down_proj.data[other], x,
                                      experts.act_fn).numpy().copy()
        outputs[okey] = ExpertRows(orows.positions, y)
    return dataclasses.replace(trace, inputs=inputs, outputs=outputs, expert_inputs={})


def is_attack(name: str) -> bool:
    """Check whether name is a known attack."""
    return name in ATTACKS or name in VARIANTS


def describe_forgery(trace: MoeTrace, key: ExpertKey) -> float:
    """Return max |forged input − true input| / max |true input| over the forged expert's rows (diagnostic)."""
    forged = trace.expert_inputs.get(key)
    rows = trace.outputs.get(key)
    if forged is None or rows is None:
        return 0.0
    true = trace.inputs[key.layer, rows.positions]
    return float(np.max(np.abs(forged - true)) / max(float(np.max(np.abs(true))), 1e-30))


@contextmanager
def top1_routing(model: Any, layers: Sequence[int] | None = None) -> Iterator[None]:
    """Let the routers of `layers` (all if None) keep only their first expert, with weight 1 (top-1 mixing)."""
    blocks = [layer.mlp for layer in model.model.layers]
    chosen = range(len(blocks)) if layers is None else layers
    gates = [blocks[i].gate for i in chosen]
    originals = [g.forward for g in gates]

    def top1(gate: Any) -> Any:
        def forward(hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            hidden_states = hidden_states.reshape(-1, gate.hidden_dim)
            logits = torch.nn.functional.linear(hidden_states, gate.weight)
            top_i = torch.argmax(logits, dim=-1, keepdim=True)
            return logits, torch.ones(top_i.shape, dtype=torch.float32), top_i
        return forward

    for g in gates:
        g.forward = top1(g)
    try:
        yield
    finally:
        for g, f in zip(gates, originals, strict=True):
            g.forward = f


@contextmanager
def int8_experts(model: Any) -> Iterator[None]:
    """Run every expert of every layer with int8-rounded weights (per row, symmetric)."""
    saved = []
    for layer in model.model.layers:
        experts = layer.mlp.experts
        saved.append((experts.gate_up_proj.data.clone(), experts.down_proj.data.clone()))
        experts.gate_up_proj.data.copy_(compute_int8_rows(experts.gate_up_proj.data))
        experts.down_proj.data.copy_(compute_int8_rows(experts.down_proj.data))
    try:
        yield
    finally:
        for layer, (gate_up, down) in zip(model.model.layers, saved, strict=True):
            layer.mlp.experts.gate_up_proj.data.copy_(gate_up)
            layer.mlp.experts.down_proj.data.copy_(down)


@dataclass
class DecodeOnlyEngine(ClaimsIdentityOf):
    """An executer engine that decodes cheaply and claims the real model: what an MoE operator cheats with.

    `generate` runs the cheap decode (`cheat(real model)` active around the real engine, or another engine
    such as the dense parent): its tokens and leaves are served. The hidden rows of the dense fingerprint come
    from one prefill of the real model over those tokens (the strongest variant: the fingerprint then passes),
    and the executer's MoE recorder traces the real model after `generate` returns, so every duty passes.
    """

    real: Engine
    cheat: Callable[[Any], AbstractContextManager[None]] | None = None
    cheap: Engine | None = None  # another engine decodes instead (the dense parent)

    @property
    def model(self) -> Any:
        """Return the real transformers model (the MoE recorder traces it)."""
        return self.real.model  # type: ignore[attr-defined]

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """Decode cheaply; keep its tokens and leaves, take the fingerprint rows from the real model's prefill."""
        if self.cheap is not None:
            gens = self.cheap.generate(requests)
        else:
            assert self.cheat is not None
            with self.cheat(self.model):
                gens = self.real.generate(requests)
        out = []
        for request, gen in zip(requests, gens, strict=True):
            pre = self.real.prefill(request.prompt_ids, gen.output_ids)
            out.append(dataclasses.replace(gen, hidden=pre.hidden))
        return out

    def prefill(self, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> Prefill:
        """Prefill with the real model."""
        return self.real.prefill(prompt_ids, output_ids)


def make_decode_only_engine(name: str, real: Engine, dense_parent: Engine | None = None) -> DecodeOnlyEngine:
    """Return the decode-only cheater `name` (one of DECODE_ONLY) over the real MoE engine."""
    if name == "moe-top1-routing":
        return DecodeOnlyEngine(real, top1_routing)
    if name == "moe-top1-last-layer":
        last = len(real.model.model.layers) - 1  # type: ignore[attr-defined]
        return DecodeOnlyEngine(real, lambda model: top1_routing(model, (last,)))
    if name == "moe-int8-experts":
        return DecodeOnlyEngine(real, int8_experts)
    if name == "moe-dense-parent":
        if dense_parent is None:
            raise ValueError("moe-dense-parent needs the dense parent's engine")
        return DecodeOnlyEngine(real, cheap=dense_parent)
    raise ValueError(f"unknown decode-only cheat {name!r}")

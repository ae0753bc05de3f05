"""Record what a Mixtral did per MoE layer (router inputs, routing, per-expert outputs) and commit to it.

The executer records the trace in one teacher-forced pass over prompt + output after generating (as the
dense fingerprint, docs/protocol.md: in fp32 decode and prefill agree to ~1e-5). Hooks on every sparse-MoE
block capture the block's input (the post-attention-norm row, the router's and every expert's input) and
its output (the weighted mix). Routing is read from the block's own router; each routed expert's unweighted
output is recomputed on the rows routed to it with the same torch operations as the block, so the values
are the ones the model mixed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from node.protocol.moe import (
    ExpertKey,
    ExpertLeaf,
    MoeCommitment,
    RouterLeaf,
    compute_vector_hash,
    make_expert_leaf,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, eq=False)
class ExpertRows:
    """One expert's routed positions and its unweighted outputs on them."""

    positions: np.ndarray  # (n,) int64, ascending
    outputs: np.ndarray  # (n, hidden) float32


@dataclass(frozen=True, eq=False)
class MoeTrace:
    """What the executer recorded for one sequence (the payload validators fetch, hash-checked)."""

    inputs: np.ndarray  # (layers, T, hidden) float32 post-attention-norm rows
    experts: np.ndarray  # (layers, T, top_k) int64 router choices
    weights: np.ndarray  # (layers, T, top_k) float32 normalised router weights
    outputs: dict[ExpertKey, ExpertRows]
    mixed: np.ndarray  # (layers, T, hidden) float32: the block's output (not committed; diagnostics)
    num_experts: int
    # An expert's own input rows where they are not the layer's rows (only a forging executer sends these;
    # an honest payload has none, and the link duty flags any leaf whose input hash is not its layer's).
    expert_inputs: dict[ExpertKey, np.ndarray] = field(default_factory=dict)

    def get_expert_inputs(self, key: ExpertKey) -> np.ndarray:
        """Return the input rows of one expert's routed positions, as the payload carries them."""
        if key in self.expert_inputs:
            return self.expert_inputs[key]
        rows = self.outputs.get(key)
        if rows is None:
            return np.zeros((0, self.inputs.shape[2]), dtype=np.float32)
        picked: np.ndarray = self.inputs[key.layer, rows.positions]
        return picked

    @property
    def num_layers(self) -> int:
        """Return the number of MoE layers."""
        return int(self.inputs.shape[0])


def compute_expert_output(gate_up: torch.Tensor, down: torch.Tensor, x: torch.Tensor,
                          act: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """Return one expert's unweighted output rows: down(act(gate(x)) · up(x)), as Mixtral computes it."""
    gate, up = nn.functional.linear(x, gate_up).chunk(2, dim=-1)
    return nn.functional.linear(act(gate) * up, down)


def _moe_blocks(model: Any) -> list[Any]:
    return [layer.mlp for layer in model.model.layers]


@torch.inference_mode()
def record_trace(model: Any, token_ids: Sequence[int]) -> MoeTrace:
    """Run one forward pass over token_ids and return the per-layer MoE trace."""
    blocks = _moe_blocks(model)
    captured: list[tuple[torch.Tensor, torch.Tensor]] = []

    def hook(module: nn.Module, args: tuple[Any, ...], output: torch.Tensor) -> None:
        captured.append((args[0].detach()[0].float().clone(), output.detach()[0].float().clone()))

    handles = [b.register_forward_hook(hook) for b in blocks]
    try:
        model.model(input_ids=torch.tensor([list(token_ids)]), use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return _trace_from_captures(blocks, captured)


def _trace_from_captures(blocks: list[Any], captured: list[tuple[torch.Tensor, torch.Tensor]]) -> MoeTrace:
    inputs, experts, weights, mixed = [], [], [], []
    outputs: dict[ExpertKey, ExpertRows] = {}
    num_experts = int(blocks[0].experts.num_experts)
    for layer, (block, (x, m)) in enumerate(zip(blocks, captured, strict=True)):
        _, top_w, top_i = block.gate(x)
        for e in range(num_experts):
            rows = torch.nonzero((top_i == e).any(dim=-1)).flatten()
            if rows.numel():
                y = compute_expert_output(block.experts.gate_up_proj[e], block.experts.down_proj[e], x[rows],
                                          block.experts.act_fn)
                outputs[ExpertKey(layer, e)] = ExpertRows(rows.numpy().astype(np.int64), y.numpy().copy())
        inputs.append(x.numpy())
        experts.append(top_i.numpy().astype(np.int64))
        weights.append(top_w.float().numpy())
        mixed.append(m.numpy())
    return MoeTrace(np.stack(inputs), np.stack(experts), np.stack(weights), outputs, np.stack(mixed), num_experts)


def build_commitment(trace: MoeTrace) -> MoeCommitment:
    """Return the router and per-expert leaves of a trace."""
    router: list[RouterLeaf] = []
    for layer in range(trace.num_layers):
        for t in range(trace.inputs.shape[1]):
            router.append(RouterLeaf(layer, t, tuple(int(e) for e in trace.experts[layer, t]),
                                     tuple(float(w) for w in trace.weights[layer, t]),
                                     compute_vector_hash(trace.inputs[layer, t])))
    experts: dict[ExpertKey, tuple[ExpertLeaf, ...]] = {}
    for key, rows in sorted(trace.outputs.items()):
        leaves = []
        inputs = trace.get_expert_inputs(key)
        for j, t in enumerate(rows.positions.tolist()):
            slot = int(np.nonzero(trace.experts[key.layer, t] == key.expert)[0][0])
            leaves.append(make_expert_leaf(key.layer, key.expert, t, float(trace.weights[key.layer, t, slot]),
                                           inputs[j], rows.outputs[j]))
        experts[key] = tuple(leaves)
    return MoeCommitment(trace.num_layers, trace.num_experts, tuple(router), experts)

"""Expert-level validation: measure one expert, one router or the shared-layer link against a commitment.

Three duties, each loading only what it needs from the model's safetensors file:
- expert (L, e): that expert's two weight slices. Recomputes its outputs on the committed input rows of the
  positions routed to it; measures the fingerprints and the input hashes.
- router of layer L: that layer's router matrix. Recomputes routing from the committed inputs.
- link ("shared"): every non-expert tensor (embeddings, attention, norms, routers, head), no expert. Walks
  the residual stream with the committed expert outputs in place of the experts and measures how far the
  committed inputs of each layer lie from its own; checks every leaf's output hash and fingerprint against
  the payload's output rows. This is what binds the layers together: an expert-holder alone only vouches
  that "this expert maps these inputs to these outputs".
Each ``verify_*`` returns a frozen dataclass of numbers; ``decide`` applies calibrated limits.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from torch import nn
from transformers import MixtralConfig, MixtralForCausalLM
from transformers.activations import ACT2FN

from node.moe.trace import MoeTrace, compute_expert_output
from node.protocol.moe import (
    ExpertKey,
    ExpertLeaf,
    InvalidMoe,
    MoeCommitment,
    MoeReason,
    RouterLeaf,
    compute_expert_fingerprint,
    compute_routing,
    compute_vector_hash,
    measure_expert_fingerprint,
)

log = logging.getLogger(__name__)
WEIGHTS = "model.safetensors"


@dataclass(frozen=True, eq=False)
class ExpertWeights:
    """One expert's weights and activation, loaded alone."""

    key: ExpertKey
    gate_up: torch.Tensor
    down: torch.Tensor
    act: Any

    def nbytes(self) -> int:
        """Return the bytes these weights occupy."""
        return int(self.gate_up.nbytes + self.down.nbytes)


@dataclass(frozen=True)
class ExpertCheck:
    """An expert duty's measurements over every leaf of its expert."""

    key: str
    leaves: int
    input_hash_mismatches: int
    max_rel_error: float
    max_index_mismatches: int
    first_bad_position: int | None  # first position with an input hash mismatch (evidence)


@dataclass(frozen=True)
class RouterCheck:
    """A router duty's measurements over one layer."""

    layer: int
    positions: int
    input_hash_mismatches: int
    choice_mismatches: int
    max_weight_error: float


@dataclass(frozen=True)
class LinkCheck:
    """The shared-layer duty's measurements over the whole sequence."""

    layers: int
    max_input_rel_error: float  # max over layers of max|committed input − own| / max|own|
    worst_layer: int
    output_hash_mismatches: int
    fingerprint_mismatches: int  # leaves whose fingerprint is not the fingerprint of the payload row
    routing_gaps: int
    input_hash_conflicts: int  # expert leaves whose input hash is not the router leaf's at that position
    routing_choice_mismatches: int = 0  # positions whose committed choices differ from the link's own routing
    routing_weight_error: float = 0.0  # max |committed − own| routing weight where the choices agree


@dataclass(frozen=True)
class MoeLimits:
    """Calibrated limits a decision applies (written by node.moe.calibration)."""

    expert_rel_error: float
    expert_index_mismatches: int
    router_weight_error: float
    link_rel_error: float


def load_limits(path: Path | None = None) -> MoeLimits:
    """Return the calibrated MoE limits (docs/moe/limits.json, written by `verinfer moe calibrate`)."""
    path = path or Path(__file__).resolve().parents[2] / "docs" / "moe" / "limits.json"
    return MoeLimits(**json.loads(path.read_text())["limits"])


def _hidden_act(model_dir: Path) -> Any:
    return ACT2FN[json.loads((model_dir / "config.json").read_text()).get("hidden_act", "silu")]


def load_expert(model_dir: Path, key: ExpertKey) -> ExpertWeights:
    """Return one expert's weights; the file keeps Mixtral's per-expert tensors, so no other expert is read."""
    p = f"model.layers.{key.layer}.block_sparse_moe.experts.{key.expert}."
    with safe_open(str(model_dir / WEIGHTS), framework="pt") as f:
        if p + "w1.weight" not in f.keys():
            raise InvalidMoe(f"{key}: the model has no such expert", MoeReason.EXPERT_UNKNOWN)
        gate_up = torch.cat([f.get_tensor(p + "w1.weight"), f.get_tensor(p + "w3.weight")], dim=0)
        down = f.get_tensor(p + "w2.weight")
    return ExpertWeights(key, gate_up, down, _hidden_act(model_dir))


def load_router(model_dir: Path, layer: int) -> torch.Tensor:
    """Return one layer's router matrix (experts × hidden)."""
    with safe_open(str(model_dir / WEIGHTS), framework="pt") as f:
        name = f"model.layers.{layer}.block_sparse_moe.gate.weight"
        if name not in f.keys():
            raise InvalidMoe(f"layer{layer}: the model has no such router", MoeReason.EXPERT_UNKNOWN)
        router: torch.Tensor = f.get_tensor(name)
        return router


def _require_rows(rows: np.ndarray, positions: Sequence[int], what: str) -> None:
    if rows.ndim != 2 or rows.shape[0] != len(positions) or not np.all(np.isfinite(rows)):
        raise InvalidMoe(f"{what}: {rows.shape} input rows for {len(positions)} positions",
                         MoeReason.MOE_MALFORMED)


@torch.inference_mode()
def verify_expert(weights: ExpertWeights, leaves: Sequence[ExpertLeaf], inputs: np.ndarray,
                  row_block: int | None = None) -> ExpertCheck:
    """Measure one expert's leaves against its recomputed outputs on the committed input rows (one per leaf).

    row_block computes the rows in blocks of that many (another kernel path than one batch; the validator
    need not batch as the executer did).
    """
    _require_rows(inputs, [x.position for x in leaves], str(weights.key))
    bad = [x.position for x, row in zip(leaves, inputs, strict=True) if compute_vector_hash(row) != x.input_hash]
    if not leaves:
        return ExpertCheck(str(weights.key), 0, 0, 0.0, 0, None)
    x = torch.from_numpy(np.ascontiguousarray(inputs, dtype=np.float32))
    step = row_block or len(leaves)
    y = torch.cat([compute_expert_output(weights.gate_up, weights.down, x[i:i + step], weights.act)
                   for i in range(0, len(leaves), step)]).numpy()
    measures = [measure_expert_fingerprint(leaf, row) for leaf, row in zip(leaves, y, strict=True)]
    return ExpertCheck(str(weights.key), len(leaves), len(bad), max(m.rel_error for m in measures),
                       max(m.index_mismatches for m in measures), bad[0] if bad else None)


@torch.inference_mode()
def verify_router(router: torch.Tensor, leaves: Sequence[RouterLeaf], inputs: np.ndarray) -> RouterCheck:
    """Measure one layer's committed routing against routing recomputed from the committed inputs."""
    _require_rows(inputs, [r.position for r in leaves], "router")
    layer = leaves[0].layer if leaves else -1
    hashes = sum(1 for r, row in zip(leaves, inputs, strict=True) if compute_vector_hash(row) != r.input_hash)
    logits = nn.functional.linear(torch.from_numpy(np.ascontiguousarray(inputs, dtype=np.float32)), router)
    top_k = len(leaves[0].experts) if leaves else 1
    experts, weights = compute_routing(logits.numpy(), top_k)
    choices, werr = 0, 0.0
    for r, e, w in zip(leaves, experts, weights, strict=True):
        mine = dict(zip(e.tolist(), w.tolist(), strict=True))
        if set(mine) != set(r.experts):
            choices += 1
            continue
        werr = max(werr, *(abs(mine[x] - cw) for x, cw in zip(r.experts, r.weights, strict=True)))
    return RouterCheck(layer, len(leaves), hashes, choices, werr)


def decide_expert(check: ExpertCheck, limits: MoeLimits) -> MoeReason:
    """Return OK or why an expert duty rejects."""
    if check.input_hash_mismatches:
        return MoeReason.EXPERT_INPUT_HASH_MISMATCH
    if check.max_rel_error > limits.expert_rel_error or check.max_index_mismatches > limits.expert_index_mismatches:
        return MoeReason.EXPERT_FINGERPRINT_MISMATCH
    return MoeReason.OK


def decide_router(check: RouterCheck, limits: MoeLimits) -> MoeReason:
    """Return OK or why a router duty rejects."""
    if check.input_hash_mismatches:
        return MoeReason.EXPERT_INPUT_HASH_MISMATCH
    if check.choice_mismatches or check.max_weight_error > limits.router_weight_error:
        return MoeReason.ROUTER_MISMATCH
    return MoeReason.OK


def decide_link(check: LinkCheck, limits: MoeLimits) -> MoeReason:
    """Return OK or why the link duty rejects."""
    if check.routing_gaps:
        return MoeReason.ROUTING_INCOMPLETE
    if check.output_hash_mismatches:
        return MoeReason.EXPERT_OUTPUT_HASH_MISMATCH
    if check.input_hash_conflicts:
        return MoeReason.EXPERT_INPUT_HASH_MISMATCH
    if check.fingerprint_mismatches:
        return MoeReason.EXPERT_FINGERPRINT_MISMATCH
    if check.max_input_rel_error > limits.link_rel_error:
        return MoeReason.LINK_MISMATCH
    if check.routing_choice_mismatches or check.routing_weight_error > limits.router_weight_error:
        return MoeReason.ROUTER_MISMATCH
    return MoeReason.OK


class _ReplayBlock(nn.Module):
    """Stands in for a sparse-MoE block: records its input, returns the committed weighted expert outputs."""

    def __init__(self, mixed: torch.Tensor) -> None:
        super().__init__()
        self.mixed = mixed
        self.seen: torch.Tensor | None = None

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        self.seen = hidden_states.detach()[0].clone()
        return self.mixed[None].to(hidden_states.dtype)


def load_shared(model_dir: Path) -> Any:
    """Return the model with every non-expert tensor loaded and experts of width 1 (never used)."""
    config = MixtralConfig.from_pretrained(str(model_dir))
    config.intermediate_size = 1
    model: Any = MixtralForCausalLM(config)
    model = model.float().eval()
    with safe_open(str(model_dir / WEIGHTS), framework="pt") as f:
        state = {k.replace(".block_sparse_moe.", ".mlp."): f.get_tensor(k)
                 for k in f.keys() if ".experts." not in k}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or any(".experts." not in k and k != "lm_head.weight" for k in missing):
        raise InvalidMoe(f"shared weights do not fit: missing {missing[:3]}, unexpected {unexpected[:3]}",
                         MoeReason.MOE_MALFORMED)
    return model


def compute_mixed_outputs(commitment: MoeCommitment, trace: MoeTrace, layer: int, length: int) -> torch.Tensor:
    """Return Σ weight · committed output per position of one layer, from the payload's expert rows."""
    hidden = trace.inputs.shape[2]
    mixed = torch.zeros((length, hidden), dtype=torch.float32)
    for e in range(commitment.num_experts):
        key = ExpertKey(layer, e)
        leaves = commitment.leaves_of(key)
        if not leaves:
            continue
        rows = trace.outputs[key]
        w = torch.tensor([x.weight for x in leaves], dtype=torch.float32)[:, None]
        mixed.index_add_(0, torch.from_numpy(rows.positions), torch.from_numpy(rows.outputs) * w)
    return mixed


# The link walk swaps the MoE blocks of the model it is given for the walk's duration; validators in one process
# (the devnet's) share one loaded model, so one walk at a time, else a walk restores another's stand-ins for good.
_WALK_LOCK = threading.Lock()


@torch.inference_mode()
def verify_link(model: Any, token_ids: Sequence[int], commitment: MoeCommitment,
                trace: MoeTrace) -> LinkCheck:
    """Walk the shared layers with committed expert outputs; measure the committed inputs against one's own."""
    from node.protocol.moe import find_routing_gaps

    hash_bad, fp_bad = _count_payload_mismatches(commitment, trace)
    conflicts = count_input_hash_conflicts(commitment)
    gaps = len(find_routing_gaps(commitment))
    layers = list(model.model.layers)
    replays = [_ReplayBlock(compute_mixed_outputs(commitment, trace, i, len(token_ids))) for i in range(len(layers))]
    with _WALK_LOCK:
        originals = [layer.mlp for layer in layers]
        try:
            for layer, replay in zip(layers, replays, strict=True):
                layer.mlp = replay
            model.model(input_ids=torch.tensor([list(token_ids)]), use_cache=False)
        finally:
            for layer, original in zip(layers, originals, strict=True):
                layer.mlp = original
    errors = []
    for i, replay in enumerate(replays):
        assert replay.seen is not None
        own = replay.seen.numpy()
        errors.append(float(np.max(np.abs(trace.inputs[i] - own)) / max(float(np.max(np.abs(own))), 1e-30)))
    worst = int(np.argmax(errors))
    # every router is in the shared weights: routing recomputed from the committed rows, as the router duties do,
    # so a colluding router-holder alone cannot pass a routing the model would not choose
    choices, weight_error = 0, 0.0
    for i, block in enumerate(originals):
        routed = [r for r in commitment.router if r.layer == i]
        check = verify_router(block.gate.weight.detach(), routed, get_router_inputs(trace, routed))
        choices += check.choice_mismatches
        weight_error = max(weight_error, check.max_weight_error)
    return LinkCheck(len(layers), errors[worst], worst, hash_bad, fp_bad, gaps, conflicts, choices, weight_error)


def count_input_hash_conflicts(commitment: MoeCommitment) -> int:
    """Return how many expert leaves commit an input hash other than the router leaf's at their position."""
    router = {(r.layer, r.position): r.input_hash for r in commitment.router}
    return sum(1 for leaves in commitment.experts.values() for x in leaves
               if router.get((x.layer, x.position)) != x.input_hash)


def _count_payload_mismatches(commitment: MoeCommitment, trace: MoeTrace) -> tuple[int, int]:
    hash_bad = fp_bad = 0
    for key, leaves in commitment.experts.items():
        rows = trace.outputs.get(key)
        if rows is None or len(rows.positions) != len(leaves):
            hash_bad += len(leaves)
            continue
        for leaf, t, y in zip(leaves, rows.positions.tolist(), rows.outputs, strict=True):
            if t != leaf.position or compute_vector_hash(y) != leaf.output_hash:
                hash_bad += 1
            elif compute_expert_fingerprint(y) != (leaf.fp_index, leaf.fp_value):
                fp_bad += 1
    return hash_bad, fp_bad


def get_router_inputs(trace: MoeTrace, leaves: Sequence[RouterLeaf]) -> np.ndarray:
    """Return the payload's committed input rows of one layer's router leaves."""
    if not leaves:
        return np.zeros((0, trace.inputs.shape[2]), dtype=np.float32)
    return trace.inputs[leaves[0].layer, [r.position for r in leaves]]

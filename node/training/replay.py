"""Re-execution of one training step from Z(t−1) and the declared batches: the auditor's core (and a cheater's)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from transformers import LlamaForCausalLM

from node.training.model import (
    TrainState,
    build_model,
    compute_local_gradient,
    compute_lr,
    compute_update,
    set_params_vector,
)
from node.training.spec import RunSpec


@dataclass(frozen=True)
class Replay:
    """A re-executed step: the new state and each replica's own gradient (rank order) and loss."""

    state: TrainState
    replica_grads: tuple[torch.Tensor, ...]
    mean_grad: torch.Tensor
    losses: tuple[float, ...]


@functools.lru_cache(maxsize=2)
def get_replay_model(spec: RunSpec) -> LlamaForCausalLM:
    """Return a model of the run's shape to load states into (built once per spec)."""
    return build_model(spec)


def compute_replay(spec: RunSpec, prev: TrainState, replica_windows: Sequence[np.ndarray], step: int) -> Replay:
    """Return Z′(t): each replica's gradient at Z(t−1), summed in rank order, averaged, one declared update."""
    model = get_replay_model(spec)
    set_params_vector(model, prev.params)
    grads, losses = [], []
    for windows in replica_windows:
        loss, grad = compute_local_gradient(model, windows)
        grads.append(grad)
        losses.append(loss)
    mean = torch.zeros_like(grads[0])
    for g in grads:
        mean += g
    mean /= len(grads)  # in place: the same rounding as total / N
    state = compute_update(prev, mean, compute_lr(spec, step), spec.momentum)
    return Replay(state=state, replica_grads=tuple(grads), mean_grad=mean, losses=tuple(losses))

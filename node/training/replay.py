"""Re-execution of one training step from Z(t−1) and the declared batches: the auditor's core (and a cheater's)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
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


def compute_replay(spec: RunSpec, prev: TrainState, replica_windows: Sequence[np.ndarray], step: int,
                   on_grad: Callable[[torch.Tensor], None] | None = None) -> Replay:
    """Return Z′(t): each replica's gradient at Z(t−1), summed in rank order, averaged, one declared update.

    With `on_grad`, each replica's gradient is handed to it (the auditor sketches it) and not kept: the sum
    runs as the gradients come (the same additions in the same order), so one replica gradient is alive at a
    time and `replica_grads` is empty."""
    model = get_replay_model(spec)
    set_params_vector(model, prev.params)
    grads, losses = [], []
    mean = torch.zeros(prev.params.numel(), dtype=torch.float32)
    for windows in replica_windows:
        loss, grad = compute_local_gradient(model, windows)
        mean += grad
        losses.append(loss)
        if on_grad is None:
            grads.append(grad)
        else:
            on_grad(grad)
        del grad
    mean /= len(replica_windows)  # in place: the same rounding as total / N
    state = compute_update(prev, mean, compute_lr(spec, step), spec.momentum)
    return Replay(state=state, replica_grads=tuple(grads), mean_grad=mean, losses=tuple(losses))

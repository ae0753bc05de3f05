"""The trained model and its flat training state Z = params ‖ momentum, plus the declared optimiser step.

Every role (workers, shadow, auditor) goes through these functions, so a re-executed step differs
from the prover's only by floating-point order, which the calibration measures.
"""

from __future__ import annotations

import functools
import hashlib
import math
from dataclasses import dataclass

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from node.protocol.ledger import InvalidTraining, TrainingReason
from node.training.spec import RunSpec

INIT_STD = 0.02


def build_model(spec: RunSpec) -> LlamaForCausalLM:
    """Return the run's model with the declared initialisation (normal(0, 0.02) matrices, unit norms)."""
    config = LlamaConfig(tie_word_embeddings=True, **spec.shape.model_dump())
    model = LlamaForCausalLM(config)
    compute_declared_init(model, spec.init_seed)
    return model


def compute_declared_init(model: torch.nn.Module, seed: int) -> None:
    """Overwrite every parameter from the declared strategy with a generator seeded by sha256(seed)."""
    gen = torch.Generator().manual_seed(int.from_bytes(hashlib.sha256(seed.to_bytes(8, "big")).digest()[:8], "big"))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.fill_(1.0)  # RMSNorm weights
            else:
                p.normal_(0.0, INIT_STD, generator=gen)
            del name


@functools.lru_cache(maxsize=8)
def get_run_param_count(spec: RunSpec) -> int:
    """Return the parameter count of a run's model (built on the meta device: no weights allocated)."""
    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(tie_word_embeddings=True, **spec.shape.model_dump()))
    return get_param_count(model)


def get_param_count(model: torch.nn.Module) -> int:
    """Return the number of trained parameters (tied weights once)."""
    return sum(p.numel() for p in model.parameters())


def get_params_vector(model: torch.nn.Module) -> torch.Tensor:
    """Return the parameters as one flat float32 vector."""
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()


def set_params_vector(model: torch.nn.Module, flat: torch.Tensor) -> None:
    """Load a flat float32 vector into the parameters."""
    torch.nn.utils.vector_to_parameters(flat, model.parameters())


def compute_lr(spec: RunSpec, step: int) -> float:
    """Return the declared learning rate of step t ≥ 1: linear warmup, then cosine decay to 10 %."""
    if step <= spec.warmup_steps:
        return spec.lr_peak * step / max(1, spec.warmup_steps)
    progress = (step - spec.warmup_steps) / max(1, spec.steps - spec.warmup_steps)
    return spec.lr_peak * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress))))


@functools.lru_cache(maxsize=8)
def get_declared_schedule(spec: RunSpec) -> tuple[float, ...]:
    """Return the declared learning rate of every step 0..steps (step 0 has none: 0)."""
    return (0.0, *(compute_lr(spec, t) for t in range(1, spec.steps + 1)))


def compute_local_gradient(model: LlamaForCausalLM, windows: np.ndarray) -> tuple[float, torch.Tensor]:
    """Return (mean token loss, flat float32 gradient) of one worker's mini-batch of (seq_len+1)-windows."""
    ids = torch.as_tensor(windows, dtype=torch.long)
    logits = model(input_ids=ids[:, :-1], use_cache=False).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
    model.zero_grad(set_to_none=True)
    loss.backward()  # type: ignore[no-untyped-call]
    grad = torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None]).detach()
    model.zero_grad(set_to_none=True)  # the flat copy is all that is kept: no second gradient between steps
    return float(loss.detach()), grad


@dataclass
class TrainState:
    """Z(t): flat parameters and momentum (float32), and the step they follow."""

    step: int
    params: torch.Tensor
    momentum: torch.Tensor

    def vector(self) -> np.ndarray:
        """Return Z as one float32 numpy vector params ‖ momentum."""
        return torch.cat([self.params, self.momentum]).numpy()


def compute_update(state: TrainState, grad: torch.Tensor, lr: float, momentum: float) -> TrainState:
    """Return the SGD-with-momentum step: buf = μ·buf + g; θ = θ − lr·buf (torch.optim.SGD's formula)."""
    buf = state.momentum * momentum
    buf += grad  # in place on the fresh product: the same two roundings as μ·buf + g, one temporary fewer
    params = buf * lr
    torch.sub(state.params, params, out=params)  # θ − lr·buf into the fresh product (same rounding)
    return TrainState(step=state.step + 1, params=params, momentum=buf)


def get_named_values(state: TrainState, positions: np.ndarray) -> np.ndarray:
    """Return Z[positions] (float32) of Z = params ‖ momentum without building Z."""
    n = state.params.numel()
    idx = torch.from_numpy(np.asarray(positions, dtype=np.int64))
    in_params = idx < n
    values = torch.where(in_params, state.params[idx.clamp(max=n - 1)], state.momentum[(idx - n).clamp(min=0)])
    return values.numpy().astype(np.float32)


def state_from_vector(step: int, z: np.ndarray, n_params: int, copy: bool = True) -> TrainState:
    """Return the TrainState of a flat Z vector, refusing a wrong shape, dtype or non-finite values.

    With copy=False the state's tensors are views of z (the auditor's loaded response, never changed in place:
    no second copy of a 135 M-parameter Z)."""
    if z.dtype != np.float32:
        raise InvalidTraining(f"checkpoint of step {step} has dtype {z.dtype}, not float32",
                              TrainingReason.CHECKPOINT_DTYPE, step)
    if z.shape != (2 * n_params,):
        raise InvalidTraining(f"checkpoint of step {step} has shape {z.shape}, not ({2 * n_params},)",
                              TrainingReason.CHECKPOINT_SHAPE, step)
    if not np.isfinite(z).all():
        raise InvalidTraining(f"checkpoint of step {step} holds NaN or infinity", TrainingReason.CHECKPOINT_NON_FINITE,
                              step)
    if not copy:
        t = torch.from_numpy(z)
        return TrainState(step=step, params=t[:n_params], momentum=t[n_params:])
    t = torch.from_numpy(z.copy())
    return TrainState(step=step, params=t[:n_params].clone(), momentum=t[n_params:].clone())

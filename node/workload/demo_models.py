"""Small real computations the demo and tests record: an MLP training step with explicit gradients.

torch.export cannot trace ``torch.func.grad`` (its wrapper tensors have no storage), so the step
writes its backward pass out by hand; a test checks it against autograd.
"""

from __future__ import annotations

import torch


def compute_mlp_step(w1: torch.Tensor, w2: torch.Tensor, x: torch.Tensor,
                     y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Return (loss, dloss/dw1, dloss/dw2) of a 2-layer ReLU MLP with mean cross-entropy."""
    z1 = x @ w1.T
    a1 = torch.relu(z1)
    logits = a1 @ w2.T
    logp = torch.log_softmax(logits, dim=-1)
    onehot = torch.nn.functional.one_hot(y, logits.shape[-1]).to(logits.dtype)
    loss = -(logp * onehot).sum() / x.shape[0]
    dlogits = (torch.exp(logp) - onehot) / x.shape[0]
    grad_w2 = dlogits.T @ a1
    dz1 = (dlogits @ w2) * (z1 > 0).to(z1.dtype)
    grad_w1 = dz1.T @ x
    return loss, grad_w1, grad_w2


def make_mlp_batch(seed: int, batch: int = 8, d_in: int = 16, hidden: int = 32,
                   classes: int = 4) -> dict[str, torch.Tensor]:
    """Return seeded weights and one batch for the MLP step."""
    g = torch.Generator().manual_seed(seed)
    return {"w1": torch.randn(hidden, d_in, generator=g) * 0.3, "w2": torch.randn(classes, hidden, generator=g) * 0.3,
            "x": torch.randn(batch, d_in, generator=g), "y": torch.randint(0, classes, (batch,), generator=g)}

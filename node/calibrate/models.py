"""Model variants for calibration: what honest operators differ in, and what cheaters change.

Each function returns a transformers engine whose weights or numerics differ from the claimed model
in one way (int8 weights, bf16 execution, weight noise, a skipped layer). Randomness is seeded by
the caller.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch

from node.engines.transformers_engine import TransformersEngine, TransformersOptions


class _SkippedLayer(torch.nn.Module):
    """A decoder layer that passes its input through unchanged (attack: one layer skipped)."""

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return hidden_states


def load_engine(model_dir: Path, name: str, **options: Any) -> TransformersEngine:
    """Return a transformers engine with the given options."""
    return TransformersEngine(model_dir, name, TransformersOptions(**options))


def _rebind(engine: TransformersEngine, model: torch.nn.Module) -> TransformersEngine:
    clone = copy.copy(engine)
    clone.model = model
    clone.decoder = model.get_decoder()
    clone.lm_head = model.get_output_embeddings()
    clone.fast_prefill = False  # the fast prefill reads a stock Llama decoder's modules; a cheater's may differ
    return clone


def make_int8_engine(base: TransformersEngine) -> TransformersEngine:
    """Return the model with int8 dynamic quantisation of every Linear layer."""
    model = torch.ao.quantization.quantize_dynamic(copy.deepcopy(base.model), {torch.nn.Linear}, dtype=torch.qint8)
    return _rebind(base, model)


def make_noisy_engine(base: TransformersEngine, relative: float, seed: int) -> TransformersEngine:
    """Return the model with every weight multiplied by (1 + relative · N(0, 1))."""
    model = copy.deepcopy(base.model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1 + relative * torch.randn(p.shape, generator=generator, dtype=p.dtype))
    return _rebind(base, model)


def make_skip_layer_engine(base: TransformersEngine, layer: int) -> TransformersEngine:
    """Return the model with one decoder layer replaced by the identity."""
    model = copy.deepcopy(base.model)
    model.get_decoder().layers[layer] = _SkippedLayer()
    return _rebind(base, model)

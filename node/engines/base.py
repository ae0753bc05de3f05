"""The engine interface: everything else generates and verifies through these two operations.

``generate`` runs the canonical sampler with the request's run_seed and records, per generated
position, the artifact leaf and the last hidden state (after the final norm) of every fed token.
``prefill`` runs prompt + output through the model once (teacher forcing) and returns the logits
of every generated position and the same hidden-state rows, for stage 2 and fingerprints.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

import numpy as np

from node.protocol.artifact import Positions, positions_from_samples
from node.protocol.sampler import PositionSample, SamplingParams

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class GenerationRequest:
    """One sequence to generate: prompt ids, declared params, the run seed and the leaf width K."""

    prompt_ids: tuple[int, ...]
    params: SamplingParams
    run_seed: bytes
    k: int
    stop_ids: frozenset[int] = field(default_factory=frozenset)


@dataclass(frozen=True, eq=False)
class Generation:
    """A generated sequence with what the executer commits to."""

    output_ids: tuple[int, ...]
    samples: tuple[PositionSample, ...]
    hidden: np.ndarray  # (P + N - 1, hidden) float32 last hidden states of every fed token
    finish_reason: FinishReason
    layers: np.ndarray | None = None  # (len(record_layers), P + N - 1, hidden): recorded decoder layer outputs

    def positions(self, k: int) -> Positions:
        """Return the artifact leaves of this generation."""
        return positions_from_samples(self.samples, k)


@dataclass(frozen=True, eq=False)
class Prefill:
    """One teacher-forced pass over prompt + output."""

    logits: np.ndarray  # (N, vocab) float32: the logits that predicted output position i
    hidden: np.ndarray  # (P + N - 1, hidden) float32, rows as in Generation.hidden
    layers: np.ndarray | None = None  # rows as in Generation.layers, when the engine records layers


@dataclass(frozen=True)
class EngineInfo:
    """What an engine runs: backend, model, dtype, device."""

    backend: str
    model: str
    dtype: str
    device: str


class ClaimsIdentityOf:
    """A wrapper engine that answers as `real`: its identity and vocabulary are the wrapped engine's."""

    real: Engine

    @property
    def info(self) -> EngineInfo:
        """Return the wrapped engine's identity."""
        return self.real.info

    @property
    def vocab_size(self) -> int:
        """Return the wrapped model's vocabulary size."""
        return self.real.vocab_size


@runtime_checkable
class Engine(Protocol):
    """An inference backend (transformers, vLLM) for one loaded model."""

    info: EngineInfo
    vocab_size: int

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """Generate every request (a batch where the backend supports it) with the canonical sampler."""
        ...

    def prefill(self, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> Prefill:
        """Return logits for every output position and hidden rows from one forward pass."""
        ...


def prefill_many(engine: Engine, items: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[Prefill]:
    """Return the prefill of every (prompt, output) pair: one batched pass where the engine has one."""
    batch = getattr(engine, "prefill_batch", None)
    if batch is not None and len(items) > 1:
        return list(batch(items))
    return [engine.prefill(prompt_ids, output_ids) for prompt_ids, output_ids in items]

"""Honest artifacts from synthetic logits: the executer's recording path without a model.

Used by the protocol demo, the stage-1 benchmark and property tests. The logits come from a
numpy Generator seeded by the caller, so every artifact is reproducible.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from node.checks.stage1 import OnchainInference
from node.protocol.artifact import Artifact, ArtifactHeader, compute_output_hash, positions_from_samples
from node.protocol.sampler import DEFAULT_K, SamplingParams, sample_position
from node.protocol.seed import position_uniform, run_seed, sampler_uniform


@dataclass(frozen=True)
class SyntheticRequest:
    """An inference request as the chain would record it, plus the synthetic model's shape."""

    inference_id: int
    user_seed: int
    params: SamplingParams
    model_id: bytes = b"\x11" * 32
    prompt_token_ids: tuple[int, ...] = (1, 2, 3)
    k: int = DEFAULT_K
    vocab_size: int = 1024
    output_length: int = 16
    logit_scale: float = 3.0
    # The synthetic model has no stop token: its outputs end by length, so an honest synthetic
    # artifact is terminated only when output_length == params.max_tokens.
    stop_token_ids: frozenset[int] = frozenset()


def make_logits(rng: np.random.Generator, vocab_size: int, scale: float) -> np.ndarray:
    """Return one row of synthetic float32 logits with a peaked, LLM-like shape."""
    return (rng.standard_normal(vocab_size) * scale).astype(np.float32)


def make_synthetic_artifact(request: SyntheticRequest, logits_seed: int) -> Artifact:
    """Return the artifact an honest executer would record for request on synthetic logits."""
    seed = run_seed(request.user_seed, request.inference_id)
    rng = np.random.default_rng(logits_seed)
    samples = [
        sample_position(make_logits(rng, request.vocab_size, request.logit_scale), request.params, request.k,
                        sampler_uniform(position_uniform(seed, i)))
        for i in range(request.output_length)
    ]
    p = request.params
    header = ArtifactHeader(request.model_id, p.temperature_bits, p.top_p_bits, p.top_k, p.max_tokens, request.k,
                            seed, request.prompt_token_ids, request.output_length)
    return Artifact(header, positions_from_samples(samples, request.k))


def make_onchain(request: SyntheticRequest, artifact: Artifact) -> OnchainInference:
    """Return the on-chain view of request after the executer committed artifact."""
    p = request.params
    return OnchainInference(
        inference_id=request.inference_id, user_seed=request.user_seed, model_id=request.model_id,
        temperature_bits=p.temperature_bits, top_p_bits=p.top_p_bits, top_k=p.top_k, max_tokens=p.max_tokens,
        k=request.k, vocab_size=request.vocab_size,
        output_hash=compute_output_hash(artifact.positions.chosen), artifact_root=artifact.root,
        stop_token_ids=request.stop_token_ids, prompt_token_ids=request.prompt_token_ids,
    )

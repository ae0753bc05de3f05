"""The upcycled SmolLM2 MoE end to end: it answers sensibly, one expert's validator catches that expert in int8."""

import pytest
import torch

from node.engines.base import GenerationRequest
from node.engines.tokenizer import ModelTokenizer
from node.engines.transformers_engine import TransformersEngine
from node.moe.attacks import int8_expert
from node.moe.calibration import TokenSequence
from node.moe.config import DutyValidator, MoeDutiesConfig
from node.moe.model import MOE_MODEL_NAME, materialise_moe
from node.moe.trace import build_commitment, record_trace
from node.moe.validate import MoeLimits
from node.protocol.moe import ExpertKey, MoeReason
from node.protocol.sampler import SamplingParams
from node.protocol.seed import run_seed

pytestmark = pytest.mark.e2e  # builds a 1.5 GB model once (≈ 12 s) and decodes at ≈ 2 tok/s on 2 cores


def test_generate_commit_and_catch_one_int8_expert_with_a_one_expert_validator():
    torch.set_num_threads(2)
    folder = materialise_moe(MOE_MODEL_NAME)
    engine = TransformersEngine(folder, MOE_MODEL_NAME)
    tokenizer = ModelTokenizer(folder, True)
    ids = tuple(tokenizer.encode_chat([{"role": "user", "content": "What is the capital of France?"}]))
    out = engine.generate([GenerationRequest(ids, SamplingParams(0.0, max_tokens=12), run_seed(1, 1), 5,
                                             frozenset({2}))])[0]
    assert "Paris" in tokenizer.decode(out.output_ids)
    seq = TokenSequence(ids, out.output_ids)
    key = ExpertKey.parse("layer3.e1")
    validator = DutyValidator(folder, MoeDutiesConfig(experts=("layer3.e1",)), MoeLimits(1e-4, 0, 1e-4, 1e-4))
    assert validator.weight_bytes() == 3 * 576 * 1536 * 4  # one expert: gate, up, down
    honest = record_trace(engine.model, seq.fed)
    with int8_expert(engine.model, key):
        cheat = record_trace(engine.model, seq.fed)
    decisions = [validator.check(build_commitment(t), t, seq.fed, [key])[str(key)] for t in (honest, cheat)]
    if not build_commitment(honest).leaves_of(key):
        pytest.skip("layer3.e1 was never routed on this sequence")
    assert decisions == [MoeReason.OK, MoeReason.EXPERT_FINGERPRINT_MISMATCH]

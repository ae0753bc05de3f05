"""Issue 30, finding 2: MoE tokens from a cheaper decode, traced by the real model, pass every duty; the dense check
of the served tokens (stage 1 + stage 2 on one prefill of the MoE model, node.moe.dense) catches them.

Each cheat runs through the real executer (ExecuterService with its MoeRecorder on the SmolLM2 MoE), plugged in
where node.moe.attacks plugs it (DecodeOnlyEngine: the cheap decode serves the tokens, the recorder traces the real
model afterwards). On the code before the fix every duty of such an inference passes and nothing else looks at the
served tokens, so the hub committee voted it valid; the assertions on the dense verdict fail there (no check).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from node.engines.models import get_model_spec, materialise_model
from node.engines.tokenizer import ModelTokenizer
from node.engines.transformers_engine import TransformersEngine
from node.errors import Reason
from node.executer.api import decode_inference_payload
from node.executer.moe import MoeRecorder
from node.executer.service import ExecuterService
from node.moe.attacks import DECODE_ONLY, make_decode_only_engine
from node.moe.config import DutyValidator, MoeDutiesConfig
from node.moe.dense import find_moe_payload_mismatch, verify_moe_payload
from node.moe.model import MOE_MODEL_NAME
from node.moe.validate import load_limits
from node.profiles import load_profile
from node.protocol.moe import MoeReason, compute_used_experts
from node.protocol.prompt import compute_prompt_hash
from node.protocol.sampler import SamplingParams
from node.validator.verify import NO_BLOCK_HASH, ChainFacts

pytestmark = pytest.mark.e2e  # the 1.5 GB SmolLM2 MoE (≈ 2 tok/s on 2 cores) and its dense parent

TOKENS = 16  # the MoE devnet's response length
MESSAGES = [{"role": "user", "content": "Why is the sky blue? Answer in one sentence."}]


@pytest.fixture(scope="module")
def lab() -> dict[str, Any]:
    torch.set_num_threads(2)
    spec = get_model_spec(MOE_MODEL_NAME)
    files = materialise_model(spec)
    real = TransformersEngine(files.path, MOE_MODEL_NAME)
    parent_spec = get_model_spec(spec.tokenizer_from or "")
    parent = TransformersEngine(materialise_model(parent_spec).path, parent_spec.name)
    _, profile = load_profile(spec)
    whole = MoeDutiesConfig(experts=tuple(f"layer{L}.e{e}" for L in range(30) for e in range(4))
                            + tuple(f"layer{L}.router" for L in range(30)) + ("shared",))
    return {"files": files, "real": real, "parent": parent, "tokenizer": ModelTokenizer(files.path, True),
            "thresholds": profile.stage2_thresholds(), "duties": DutyValidator(files.path, whole, load_limits())}


def serve(lab: dict[str, Any], cheat: str | None, seed: int) -> tuple[ExecuterService, Any]:
    """Serve one inference through the real MoE executer, honest or with a decode-only cheat plugged in."""
    real = lab["real"]
    engine = real if cheat is None else make_decode_only_engine(cheat, real, lab["parent"])
    service = ExecuterService(lab["files"], lab["tokenizer"], engine, None, moe=MoeRecorder(real.model))
    ids = lab["tokenizer"].encode_chat(MESSAGES)
    prompt_hash = compute_prompt_hash(lab["files"].model_id, messages=MESSAGES)
    served = service.infer(ids, prompt_hash, SamplingParams(0.7, 0.95, 0, TOKENS), seed, 1000 + seed,
                           {"messages": MESSAGES})
    return service, served


def judge(lab: dict[str, Any], service: ExecuterService, served: Any) -> tuple[dict[str, MoeReason], Reason]:
    """Return every duty's decision on the recorded trace and the hub committee's dense verdict on the payload."""
    moe = service.moe.slices.get(served.inference_id)  # type: ignore[union-attr]
    fed = [*moe.prompt_ids, *moe.output_ids[:-1]]
    duties = lab["duties"].check(moe.commitment, moe.trace, fed, compute_used_experts(moe.commitment))
    p = SamplingParams(0.7, 0.95, 0, TOKENS)
    facts = ChainFacts(served.inference_id, served.user_seed, lab["files"].model_id, p.temperature_bits, p.top_p_bits,
                       p.top_k, p.max_tokens, served.prompt_hash, served.output_hash, served.artifact.root,
                       served.fingerprint_hash, NO_BLOCK_HASH)
    payload = decode_inference_payload(service.payload_json(served.inference_id) or b"")
    report = verify_moe_payload(payload, facts, moe.commitment.root(), lab["files"], lab["tokenizer"], lab["real"],
                                lab["thresholds"])
    return duties, report.reason


def test_honest_moe_inference_passes_every_duty_and_the_dense_check(lab: dict[str, Any]) -> None:
    service, served = serve(lab, None, 7)
    duties, dense = judge(lab, service, served)
    assert len(duties) > 100 and set(duties.values()) == {MoeReason.OK}
    assert dense is Reason.OK


@pytest.mark.parametrize("cheat", DECODE_ONLY)
def test_decode_only_cheat_passes_every_duty_but_fails_the_dense_check(lab: dict[str, Any], cheat: str) -> None:
    service, served = serve(lab, cheat, 7)
    duties, dense = judge(lab, service, served)
    assert len(duties) > 100 and set(duties.values()) == {MoeReason.OK}, "the duties see the real model's trace"
    assert dense is not Reason.OK, f"{cheat}: the served tokens were not checked"


def test_a_payload_whose_proofs_are_not_the_committed_ones_is_refused(lab: dict[str, Any]) -> None:
    service, served = serve(lab, None, 8)
    moe = service.moe.slices.get(served.inference_id)  # type: ignore[union-attr]
    p = SamplingParams(0.7, 0.95, 0, TOKENS)
    facts = ChainFacts(served.inference_id, served.user_seed, lab["files"].model_id, p.temperature_bits, p.top_p_bits,
                       p.top_k, p.max_tokens, served.prompt_hash, served.output_hash, served.artifact.root,
                       served.fingerprint_hash, NO_BLOCK_HASH)
    payload = decode_inference_payload(service.payload_json(served.inference_id) or b"")
    assert find_moe_payload_mismatch(payload, facts, moe.commitment.root())[0] is Reason.OK
    assert find_moe_payload_mismatch(payload, facts, bytes(32))[0] is Reason.FINGERPRINT_MALFORMED  # another moeRoot

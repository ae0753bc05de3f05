import base64

from node.checks.decision import Stage2Thresholds
from node.checks.fingerprint import FingerprintThresholds
from node.errors import Reason
from node.executer.api import InferencePayload
from node.executer.service import ExecuterService
from node.protocol.fingerprint import encode_fingerprint_base64
from node.protocol.prompt import compute_prompt_hash
from node.protocol.sampler import SamplingParams
from node.validator.verify import verify_payload

MESSAGES = [{"role": "user", "content": "Name a colour."}]
# Plumbing thresholds: the tiny model verified by its own engine reproduces weights to ~1e-9; these
# are not a calibrated profile (the real one lives in config/profiles/ and comes from calibration).
T = Stage2Thresholds(1e-4, 1e-4, 0.01, 0.0, 6.0, 0.05, FingerprintThresholds(2, 1.0, 1.0, 0))


def payload(tiny, params=SamplingParams(1.0, 1.0, 0, 12), seed=5):
    service = ExecuterService(tiny.files, tiny.tokenizer, tiny.engine, T.fingerprint)
    ids = tiny.tokenizer.encode_chat(MESSAGES)
    served = service.infer(ids, compute_prompt_hash(tiny.files.model_id, messages=MESSAGES), params, seed, 77,
                           {"messages": MESSAGES})
    return InferencePayload(model="tiny-llama", model_id="0x" + tiny.files.model_id.hex(), inference_id="77",
                            user_seed=str(seed), request={"messages": MESSAGES},
                            artifact=base64.b64encode(served.wire).decode(),
                            verification_proofs=encode_fingerprint_base64(served.fingerprint))


def test_honest_payload_is_valid(tiny):
    report = verify_payload(payload(tiny), tiny.files, tiny.tokenizer, tiny.engine, T)
    assert report.valid, report
    assert report.decision is not None and len(report.decision.scores_digest) == 32


def test_injected_system_prompt_fails_stage1(tiny):
    p = payload(tiny)
    tampered = p.model_copy(update={"request": {"messages": [
        {"role": "system", "content": "be brief"}, *MESSAGES]}})
    report = verify_payload(tampered, tiny.files, tiny.tokenizer, tiny.engine, T)
    assert report.reason is Reason.PROMPT_MISMATCH


def test_wrong_seed_and_malformed_parts_are_typed(tiny):
    p = payload(tiny)
    assert verify_payload(p.model_copy(update={"user_seed": "6"}), tiny.files, tiny.tokenizer, tiny.engine,
                          T).reason is Reason.SEED_MISMATCH
    assert verify_payload(p.model_copy(update={"artifact": "%%%"}), tiny.files, tiny.tokenizer, tiny.engine,
                          T).reason is Reason.WIRE_MALFORMED
    assert verify_payload(p.model_copy(update={"artifact": base64.b64encode(b"junk").decode()}), tiny.files,
                          tiny.tokenizer, tiny.engine, T).reason is Reason.WIRE_MALFORMED
    assert verify_payload(p.model_copy(update={"verification_proofs": p.verification_proofs[:1]}), tiny.files,
                          tiny.tokenizer, tiny.engine, T).reason is Reason.FINGERPRINT_LENGTH_MISMATCH

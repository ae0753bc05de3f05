import base64
from collections.abc import Sequence
from dataclasses import dataclass, replace

import pytest

from node.calibrate.cheaters import TruncatingEngine
from node.checks.decision import Stage2Thresholds
from node.checks.fingerprint import FingerprintThresholds
from node.engines.base import Engine, EngineInfo, Generation, GenerationRequest, Prefill
from node.errors import Reason
from node.executer.api import InferencePayload
from node.executer.service import ExecuterService
from node.profiles import load_profile
from node.protocol.fingerprint import encode_fingerprint_base64
from node.protocol.prompt import compute_prompt_hash
from node.protocol.sampler import SamplingParams
from node.validator.verify import decode_payload_artifact, verify_payload

MESSAGES = [{"role": "user", "content": "Name a colour."}]
# Plumbing thresholds: the tiny model verified by its own engine reproduces weights to ~1e-9; these
# are not a calibrated profile (the real one lives in config/profiles/ and comes from calibration).
T = Stage2Thresholds(1e-4, 1e-4, 0.01, 0.0, 6.0, 0.05, FingerprintThresholds(2, 1.0, 1.0, 0))


def payload(tiny, params=SamplingParams(1.0, 1.0, 0, 12), seed=5, engine=None, messages=MESSAGES):
    service = ExecuterService(tiny.files, tiny.tokenizer, engine or tiny.engine, T.fingerprint)
    ids = tiny.tokenizer.encode_chat(messages)
    served = service.infer(ids, compute_prompt_hash(tiny.files.model_id, messages=messages), params, seed, 77,
                           {"messages": messages})
    return InferencePayload(model=tiny.files.spec.name, model_id="0x" + tiny.files.model_id.hex(), inference_id="77",
                            user_seed=str(seed), request={"messages": messages},
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



# ---- the termination rule through the executer (docs/security.md rule 3, issue 15 finding 6) -------------------------


@dataclass
class _Wrapping:
    """An executer's engine that claims to be `honest` and changes what it returns."""

    honest: Engine

    @property
    def info(self) -> EngineInfo:
        return self.honest.info

    @property
    def vocab_size(self) -> int:
        return self.honest.vocab_size

    def prefill(self, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> Prefill:
        return self.honest.prefill(prompt_ids, output_ids)


class _EmptyAnswerEngine(_Wrapping):
    """Answers nothing at all (the cheapest answer), whatever was sampled."""

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        one = self.honest.generate([replace(r, params=replace(r.params, max_tokens=1)) for r in requests])
        return [Generation((), (), g.hidden, "stop") for g in one]  # P hidden rows: the prompt chunk only


class _IgnoresStopEngine(_Wrapping):
    """Samples on past the model's stop token (a longer, padded answer)."""

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        return self.honest.generate([replace(r, stop_ids=frozenset()) for r in requests])


def check(model, p, thresholds=T):
    return verify_payload(p, model.files, model.tokenizer, model.engine, thresholds)


def test_a_truncating_executer_fails_stage1_at_its_last_position(tiny):
    params = SamplingParams(1.0, 1.0, 0, 12)
    honest = check(tiny, payload(tiny, params))
    assert honest.valid and honest.stage1 is not None and honest.stage1.positions_checked == 12
    report = check(tiny, payload(tiny, params, engine=TruncatingEngine(tiny.engine, keep=4)))
    assert report.stage1 is not None
    assert (report.reason, report.stage1.position) == (Reason.NOT_TERMINATED, 3)


def test_an_empty_answer_fails_stage1(tiny):
    report = check(tiny, payload(tiny, engine=_EmptyAnswerEngine(tiny.engine)))
    assert report.stage1 is not None
    assert (report.reason, report.stage1.position) == (Reason.NOT_TERMINATED, None)


@pytest.fixture(scope="module")
def smol_profile(smol):
    _, profile = load_profile(smol.files.spec)
    return profile.stage2_thresholds()


PARIS = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = SamplingParams(0.0, 1.0, 0, 24)


def test_real_smollm2_records_its_stop_token_as_the_last_position_and_passes(smol, smol_profile):
    stops = frozenset(smol.files.spec.stop_token_ids)
    p = payload(smol, GREEDY, messages=PARIS)
    art = decode_payload_artifact(p)
    chosen = [int(t) for t in art.positions.chosen]
    # the sampler chose the stop token at the last position, and it is a committed leaf like any other
    assert 0 < len(chosen) < GREEDY.max_tokens and chosen[-1] in stops and not stops & set(chosen[:-1])
    assert art.header.output_length == len(chosen)
    report = check(smol, p, smol_profile)
    assert report.valid, report


def test_real_smollm2_cut_short_or_run_on_past_the_stop_fails_stage1(smol):
    stops = frozenset(smol.files.spec.stop_token_ids)
    cut = check(smol, payload(smol, GREEDY, engine=TruncatingEngine(smol.engine, keep=4), messages=PARIS))
    assert cut.stage1 is not None and (cut.reason, cut.stage1.position) == (Reason.NOT_TERMINATED, 3)
    run_on = payload(smol, GREEDY, engine=_IgnoresStopEngine(smol.engine), messages=PARIS)
    chosen = [int(t) for t in decode_payload_artifact(run_on).positions.chosen]
    first_stop = next(i for i, t in enumerate(chosen) if t in stops)
    assert first_stop < len(chosen) - 1
    report = check(smol, run_on)
    assert report.stage1 is not None and (report.reason, report.stage1.position) == (Reason.TOKENS_AFTER_STOP,
                                                                                      first_stop)

"""Stage 2 on the real SmolLM2 with the committed, calibrated profile: honest passes, attacks fail.

A small set (32 tokens each) of the calibration's honest variants and attacks, run in CI.
"""

import base64

import pytest
from typer.testing import CliRunner

from node.calibrate.models import load_engine, make_int8_engine
from node.calibrate.runs import forge_leaf
from node.cli import app
from node.engines.base import GenerationRequest
from node.errors import Reason
from node.executer.api import InferencePayload
from node.profiles import load_profile
from node.protocol.artifact import Artifact, ArtifactHeader, encode_artifact_wire, make_positions
from node.protocol.fingerprint import build_fingerprint, encode_fingerprint_base64
from node.protocol.sampler import SamplingParams, sample_position
from node.protocol.seed import compute_sampler_uniforms, run_seed
from node.validator.verify import verify_payload

MESSAGES = [{"role": "user", "content": "Explain why the sky is blue in two sentences."}]
N = 32
STOPS = frozenset({2})  # SmolLM2's registered stop token: generation ends on it, as an executer's does


@pytest.fixture(scope="module")
def profile(smol):
    _, p = load_profile(smol.files.spec)
    if not p.meta.calibrated:
        pytest.fail("the SmolLM2 fp32 profile must be the calibrated one (verinfer calibrate fit)")
    return p.stage2_thresholds()


def make_payload(smol, declared, output_ids, positions, hidden, seed=(11, 22)):
    ids = smol.tokenizer.encode_chat(MESSAGES)
    header = ArtifactHeader(smol.files.model_id, declared.temperature_bits, declared.top_p_bits, declared.top_k,
                            declared.max_tokens, 5, run_seed(*seed), ids, len(output_ids))
    art = Artifact(header, positions)
    return InferencePayload(model="smollm2-135m-instruct", model_id="0x" + smol.files.model_id.hex(),
                            inference_id=str(seed[1]), user_seed=str(seed[0]), request={"messages": MESSAGES},
                            artifact=base64.b64encode(encode_artifact_wire(art)).decode(),
                            verification_proofs=encode_fingerprint_base64(build_fingerprint(hidden, len(ids))))


def generated(smol, engine, declared, actual=None):
    ids = smol.tokenizer.encode_chat(MESSAGES)
    gen = engine.generate([GenerationRequest(ids, actual or declared, run_seed(11, 22), 5, STOPS)])[0]
    return make_payload(smol, declared, gen.output_ids, gen.positions(5), gen.hidden)


def check(smol, payload, thresholds):
    return verify_payload(payload, smol.files, smol.tokenizer, smol.engine, thresholds)


@pytest.mark.parametrize("params", [SamplingParams(1.0, 1.0, 0, N), SamplingParams(0.7, 0.9, 0, N),
                                    SamplingParams(0.0, 1.0, 0, N)])
def test_honest_runs_pass(smol, profile, params):
    report = check(smol, generated(smol, smol.engine, params), profile)
    assert report.valid, report.measurements


def test_temperature_lie_fails(smol, profile):
    payload = generated(smol, smol.engine, SamplingParams(0.7, 1.0, 0, N), SamplingParams(0.8, 1.0, 0, N))
    assert not check(smol, payload, profile).valid


def test_int8_weights_fail(smol, profile):
    payload = generated(smol, make_int8_engine(smol.engine), SamplingParams(1.0, 1.0, 0, N))
    assert not check(smol, payload, profile).valid


def test_bf16_claimed_as_fp32_fails(smol, profile):
    payload = generated(smol, load_engine(smol.files.path, "smollm2-135m-instruct", dtype="bfloat16"),
                        SamplingParams(1.0, 1.0, 0, N))
    assert not check(smol, payload, profile).valid


def test_prefill_attack_keeping_cheap_tokens_fails(smol, profile):
    params = SamplingParams(1.0, 1.0, 0, N)
    ids = smol.tokenizer.encode_chat(MESSAGES)
    cheap = make_int8_engine(smol.engine).generate([GenerationRequest(ids, params, run_seed(11, 22), 5, STOPS)])[0]
    pre = smol.engine.prefill(ids, cheap.output_ids)
    v = compute_sampler_uniforms(run_seed(11, 22), N)
    leaves = [forge_leaf(sample_position(pre.logits[i], params, 5, int(v[i])), t, int(v[i]), 5)
              for i, t in enumerate(cheap.output_ids)]
    positions = make_positions([s.chosen for s in leaves], [s.token_ids for s in leaves],
                               [s.weights for s in leaves], [s.raw_logprobs for s in leaves])
    report = check(smol, make_payload(smol, params, cheap.output_ids, positions, pre.hidden), profile)
    assert report.reason is not Reason.OK and report.stage1 is not None and report.stage1.valid


def test_cli_verify_prints_the_report_and_exits_by_verdict(smol, profile, tmp_path):
    honest = generated(smol, smol.engine, SamplingParams(1.0, 1.0, 0, 16))
    path = tmp_path / "payload.json"
    path.write_text(honest.model_dump_json())
    result = CliRunner().invoke(app, ["verify", "--payload", str(path)])
    assert result.exit_code == 0, result.output
    assert "VALID" in result.output and "weight_error_max" in result.output
    lie = generated(smol, smol.engine, SamplingParams(0.7, 1.0, 0, 16), SamplingParams(1.0, 1.0, 0, 16))
    path.write_text(lie.model_dump_json())
    result = CliRunner().invoke(app, ["verify", "--payload", str(path), "--json"])
    assert result.exit_code == 1 and '"valid": false' in result.output
    path.write_text("{}")
    assert CliRunner().invoke(app, ["verify", "--payload", str(path)]).exit_code == 2


def test_a_batched_prefill_decides_every_payload_as_one_at_a_time(smol, profile):
    """Honest runs and attacks of different lengths in one right-padded pass: the same decisions, and
    measurements that differ by no more than the batched kernels' rounding."""
    from node.engines.base import prefill_many
    from node.validator.verify import finish_verification, prepare_verification

    payloads = [generated(smol, smol.engine, SamplingParams(1.0, 1.0, 0, N)),
                generated(smol, smol.engine, SamplingParams(0.7, 0.9, 0, N // 2)),
                generated(smol, smol.engine, SamplingParams(0.7, 1.0, 0, N), SamplingParams(0.8, 1.0, 0, N)),
                generated(smol, make_int8_engine(smol.engine), SamplingParams(1.0, 1.0, 0, N))]
    checks = [prepare_verification(p, smol.files, smol.tokenizer) for p in payloads]
    items = [(c.prompt_ids, c.output_ids) for c in checks]
    assert len({len(c.output_ids) for c in checks}) > 1, "rows of different lengths share the pass"
    batched = prefill_many(smol.engine, items)
    single = [smol.engine.prefill(*item) for item in items]
    for b, s in zip(batched, single, strict=True):
        assert b.logits.shape == s.logits.shape and b.hidden.shape == s.hidden.shape
        assert float(abs(b.logits - s.logits).max()) < 1e-3
    one = [finish_verification(c, p, profile, smol.files, smol.engine) for c, p in zip(checks, single, strict=True)]
    many = [finish_verification(c, p, profile, smol.files, smol.engine) for c, p in zip(checks, batched, strict=True)]
    assert [r.valid for r in one] == [r.valid for r in many] == [True, True, False, False]
    assert [r.reason for r in one] == [r.reason for r in many]

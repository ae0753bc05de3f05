"""verify_stock_output on the tiny model: honest vLLM-rule tokens pass, other noise or params fail, bad input."""

import pytest

from node.calibrate.stock import generate_with_vllm_rule
from node.checks.stock_decision import StockThresholds
from node.engines.models import ModelFiles
from node.protocol.errors import Reason
from node.protocol.sampler import SamplingParams
from node.protocol.seed import run_seed
from node.protocol.vllm_sampler import vllm_request_seed
from node.validator.stock import verify_stock_output

PROMPT = (1, 9690, 198, 2683, 359, 253, 5356, 28, 1780, 314)
PARAMS = SamplingParams(0.8, 0.95, 0, 24)
SEED = run_seed(4, 5)
THRESHOLDS = StockThresholds(max_difr_mean=0.01, max_difr_max=0.01, max_surprisal_z_abs=8.0)


@pytest.fixture(scope="module")
def stock(tiny):
    files = ModelFiles(tiny.files.spec.model_copy(update={"sampler": "vllm-seeded"}), tiny.files.path,
                       tiny.files.weights_sha256)
    honest = generate_with_vllm_rule(tiny.engine, PROMPT, PARAMS, vllm_request_seed(SEED))
    assert not set(honest) & set(files.spec.stop_token_ids)
    return files, tiny.engine, honest


def test_honest_tokens_pass(stock):
    files, engine, honest = stock
    report = verify_stock_output(files, engine, PROMPT, honest, PARAMS, SEED, THRESHOLDS)
    assert report.valid and report.measurements is not None and report.measurements.difr_max < 1e-4


def test_tokens_from_another_seed_or_temperature_fail(stock):
    files, engine, _ = stock
    other = generate_with_vllm_rule(engine, PROMPT, PARAMS, vllm_request_seed(run_seed(4, 6)))
    assert verify_stock_output(files, engine, PROMPT, other, PARAMS, SEED, THRESHOLDS).reason is Reason.TOKEN_DIFR_MAX
    hot = generate_with_vllm_rule(engine, PROMPT, SamplingParams(1.5, 0.95, 0, 24), vllm_request_seed(SEED))
    assert not verify_stock_output(files, engine, PROMPT, hot, PARAMS, SEED, THRESHOLDS).valid


def test_bad_input_is_a_typed_reason(stock):
    files, engine, honest = stock
    canonical = ModelFiles(files.spec.model_copy(update={"sampler": "canonical"}), files.path, files.weights_sha256)
    cases = [(canonical, honest, Reason.UNKNOWN_SAMPLER), (files, (), Reason.OUTPUT_LENGTH_MISMATCH),
             (files, (*honest, 5), Reason.OUTPUT_TOO_LONG), (files, honest[:10], Reason.NOT_TERMINATED),
             (files, (*honest[:3], 2, *honest[4:]), Reason.TOKENS_AFTER_STOP),
             (files, (*honest[:-1], 10**6), Reason.OUT_OF_RANGE)]
    for model, tokens, reason in cases:
        report = verify_stock_output(model, engine, PROMPT, tokens, PARAMS, SEED, THRESHOLDS)
        assert report.reason is reason and report.measurements is None


def test_a_stock_payload_is_checked_against_the_stock_commitment_field_by_field(stock):
    import json

    from node.executer.api import MAX_PAYLOAD_BYTES, InvalidPayload, StockPayload, decode_stock_payload
    from node.protocol.prompt import compute_prompt_hash, normalise_messages
    from node.protocol.stock import compute_stock_commitment
    from node.validator.stock import find_stock_payload_mismatch
    from node.validator.verify import ChainFacts

    files, _, honest = stock
    messages = normalise_messages([{"role": "user", "content": "Hi."}])
    prompt_hash = compute_prompt_hash(files.model_id, messages=messages)
    body = {"model": files.spec.name, "model_id": "0x" + files.model_id.hex(), "inference_id": "5", "user_seed": "4",
            "request": {"messages": messages}, "output_ids": list(honest)}
    payload = decode_stock_payload(json.dumps(body))
    output_hash, root, fingerprint_hash = compute_stock_commitment(honest)
    facts = ChainFacts(5, 4, files.model_id, PARAMS.temperature_bits, PARAMS.top_p_bits, 0, 24, prompt_hash,
                       output_hash, root, fingerprint_hash)
    assert find_stock_payload_mismatch(payload, facts) is Reason.OK
    wrong = [(facts.__class__(**{**facts.__dict__, "artifact_root": b"\x01" * 32}), Reason.ARTIFACT_ROOT_MISMATCH),
             (facts.__class__(**{**facts.__dict__, "fingerprint_hash": b"\x01" * 32}), Reason.ARTIFACT_ROOT_MISMATCH),
             (facts.__class__(**{**facts.__dict__, "inference_id": 6}), Reason.SEED_MISMATCH),
             (facts.__class__(**{**facts.__dict__, "user_seed": 3}), Reason.SEED_MISMATCH),
             (facts.__class__(**{**facts.__dict__, "model_id": b"\x02" * 32}), Reason.UNKNOWN_MODEL),
             (facts.__class__(**{**facts.__dict__, "output_hash": b"\x03" * 32}), Reason.OUTPUT_HASH_MISMATCH),
             (facts.__class__(**{**facts.__dict__, "prompt_hash": b"\x04" * 32}), Reason.PROMPT_MISMATCH)]
    for bad_facts, reason in wrong:
        assert find_stock_payload_mismatch(payload, bad_facts) is reason
    # the wire shape: exactly these fields, 1..MAX_OUTPUT_TOKENS uint32 ids, nothing else
    for change in ({"output_ids": []}, {"output_ids": [2**32]}, {"output_ids": [-1]}, {"output_ids": ["7"]},
                   {"artifact": "AAAA"}, {"inference_id": "x"}):
        with pytest.raises(InvalidPayload) as got:
            decode_stock_payload(json.dumps({**body, **change}))
        assert got.value.reason is Reason.WIRE_MALFORMED
    with pytest.raises(InvalidPayload) as got:
        decode_stock_payload(b" " * (MAX_PAYLOAD_BYTES + 1))
    assert got.value.reason is Reason.WIRE_TOO_LARGE
    assert isinstance(payload, StockPayload)

"""The API's wire models are strict at the edge (issue 15, finding 4): a malformed payload is a typed rejection."""

import base64
import json
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from node.checks.fingerprint import FingerprintThresholds
from node.errors import InvalidInput, Reason
from node.executer import api
from node.executer.service import ExecuterService
from node.executer.synthetic import SyntheticRequest, make_synthetic_artifact
from node.protocol.artifact import compute_output_hash, encode_artifact_wire
from node.protocol.fingerprint import (
    build_fingerprint,
    compute_fingerprint_hash,
    decode_fingerprint_base64,
    encode_fingerprint_base64,
)
from node.protocol.prompt import compute_prompt_hash, normalise_messages
from node.protocol.sampler import SamplingParams
from node.validator.verify import ChainFacts, decode_payload_artifact, find_payload_mismatch
from tests.node.protocol.strategies import json_values

MESSAGES = [{"role": "user", "content": "Name a colour."}]
REQ = SyntheticRequest(inference_id=77, user_seed=5, params=SamplingParams(1.0, 1.0, 0, 16), output_length=6)
ART = make_synthetic_artifact(REQ, 0)
PROOFS = build_fingerprint(np.random.default_rng(0).standard_normal((3 + 5, 64)).astype(np.float32), 3)
FACTS = ChainFacts(77, 5, REQ.model_id, REQ.params.temperature_bits, REQ.params.top_p_bits, 0, 16,
                   compute_prompt_hash(REQ.model_id, messages=MESSAGES), compute_output_hash(ART.positions.chosen),
                   ART.root, compute_fingerprint_hash(PROOFS))
FUZZ = settings(max_examples=150, deadline=2000, suppress_health_check=[HealthCheck.too_slow])


def valid_body() -> dict:
    """Return the payload JSON an honest executer serves (as ExecuterService.payload_json builds it)."""
    return {"model": "tiny-llama", "model_id": "0x" + REQ.model_id.hex(), "inference_id": "77", "user_seed": "5",
            "request": {"messages": [dict(m) for m in MESSAGES]},
            "artifact": base64.b64encode(encode_artifact_wire(ART)).decode(),
            "verification_proofs": encode_fingerprint_base64(PROOFS)}


def fetch_time_reason(raw: bytes | str) -> Reason | None:
    """Run what the daemon runs on fetched bytes (parse, then compare with the commitment); None if refused.

    The daemon catches ValueError around these two steps; anything else escaping here ends its verify task.
    """
    try:
        payload = api.InferencePayload.model_validate_json(raw)
    except ValueError:
        return None
    return find_payload_mismatch(payload, FACTS)


def test_honest_payload_round_trips_and_matches_its_commitment():
    payload = api.InferencePayload(**valid_body())
    raw = payload.model_dump_json().encode()
    assert api.InferencePayload.model_validate_json(raw) == payload
    assert api.decode_inference_payload(raw) == payload
    assert fetch_time_reason(raw) is Reason.OK
    assert payload.request == {"messages": MESSAGES}  # readers still get the plain dict
    text = api.InferencePayload(**{**valid_body(), "request": {"prompt": "Once"}})
    assert text.request == {"prompt": "Once"}


@pytest.mark.parametrize("messages", [["x"], [1], [None], [["role", "user"]], "abc", {"role": "user"},
                                      [{"role": "user"}], [{"role": "user", "content": ["x"]}]])
def test_messages_that_are_not_message_objects_are_refused_at_parse(messages):
    """The reported attack: messages ["x"] raised AttributeError at fetch time and ended the validator."""
    raw = json.dumps({**valid_body(), "request": {"messages": messages}})
    assert fetch_time_reason(raw) is None  # before: AttributeError: 'str' object has no attribute 'get'
    with pytest.raises(api.InvalidPayload) as err:
        api.decode_inference_payload(raw)
    assert err.value.reason is Reason.WIRE_MALFORMED and "request" in str(err.value)
    assert isinstance(err.value, InvalidInput) and isinstance(err.value, ValueError)


TEXT_LIMIT, MESSAGES_LIMIT = 8 * 2**20, 2**16  # api.MAX_TEXT_CHARS, api.MAX_MESSAGES (checked below)
BAD_FIELDS = [
    ("inference_id", 77), ("inference_id", "0x4d"), ("inference_id", "077"), ("inference_id", " 77"),
    ("inference_id", "7_7"), ("inference_id", "-77"), ("inference_id", "٧٧"), ("inference_id", str(2**256)),
    ("inference_id", "9" * 5000), ("user_seed", str(2**64)), ("user_seed", 5), ("user_seed", "5.0"),
    ("model_id", "11" * 32), ("model_id", "0x" + "11" * 31), ("model_id", "0x" + "zz" * 32), ("model", ""),
    ("model", "m" * 257), ("model", 1), ("artifact", ""), ("artifact", "%%%"), ("artifact", "QR=="),
    ("artifact", "AAAA\n"), ("artifact", 1), ("verification_proofs", []), ("verification_proofs", "AAAA"),
    ("verification_proofs", ["AAAA"]), ("verification_proofs", [None]),
    ("verification_proofs", [base64.b64encode(b"\0" * 259).decode()]),
    ("verification_proofs", [base64.b64encode(b"\0" * 258).decode()] * 1026),
    ("request", {}), ("request", []), ("request", "hi"), ("request", None), ("request", {"messages": []}),
    ("request", {"messages": [{"role": "wizard", "content": "hi"}]}),
    ("request", {"messages": [{"role": "user", "content": "hi", "name": "x"}]}),
    ("request", {"messages": MESSAGES, "prompt": "x"}), ("request", {"messages": MESSAGES, "tools": []}),
    ("request", {"prompt": ""}), ("request", {"prompt": 5}), ("request", {"prompt": None}),
    ("request", {"prompt": "x" * (TEXT_LIMIT + 1)}),
    ("request", {"messages": [{"role": "user", "content": "x" * 2**20}] * 9}),
    ("request", {"messages": [{"role": "user", "content": ""}] * (MESSAGES_LIMIT + 1)}),
]


@pytest.mark.parametrize("field,value", BAD_FIELDS, ids=[f"{f}={str(v)[:20]!r}" for f, v in BAD_FIELDS])
def test_every_payload_field_is_strict(field, value):
    raw = json.dumps({**valid_body(), field: value})
    with pytest.raises(ValidationError):
        api.InferencePayload.model_validate_json(raw)
    with pytest.raises(api.InvalidPayload):
        api.decode_inference_payload(raw)


def test_unknown_missing_and_oversized_payloads_are_refused():
    assert (api.MAX_TEXT_CHARS, api.MAX_MESSAGES) == (TEXT_LIMIT, MESSAGES_LIMIT)
    for body in ({**valid_body(), "extra": 1}, {k: v for k, v in valid_body().items() if k != "artifact"}):
        with pytest.raises(api.InvalidPayload):
            api.decode_inference_payload(json.dumps(body))
    huge = json.dumps({**valid_body(), "artifact": "A" * (api.MAX_ARTIFACT_BASE64_CHARS + 4)})
    with pytest.raises(api.InvalidPayload) as err:
        api.decode_inference_payload(huge)
    assert err.value.reason is Reason.WIRE_MALFORMED
    with pytest.raises(api.InvalidPayload) as err:
        api.decode_inference_payload(b" " * (api.MAX_PAYLOAD_BYTES + 1))
    assert err.value.reason is Reason.WIRE_TOO_LARGE


def test_deep_nesting_is_a_validation_error_not_a_recursion_error():
    for depth in (200, 100_000):
        for raw in ("[" * depth + "]" * depth,
                    json.dumps({**valid_body(), "request": None}).replace("null", "[" * depth + "]" * depth)):
            started = time.perf_counter()
            assert fetch_time_reason(raw) is None
            assert time.perf_counter() - started < 1.0


@FUZZ
@given(st.binary(max_size=2000))
def test_arbitrary_bytes_are_refused_with_a_typed_error(data):
    assert fetch_time_reason(data) is None
    with pytest.raises(api.InvalidPayload):
        api.decode_inference_payload(data)


PATHS = [(), ("model",), ("model_id",), ("inference_id",), ("user_seed",), ("artifact",), ("request",),
         ("request", "messages"), ("request", "messages", 0), ("request", "messages", 0, "role"),
         ("request", "messages", 0, "content"), ("verification_proofs",), ("verification_proofs", 0),
         ("request", "prompt"), ("extra",)]


def replaced(body: dict, path: tuple, value: object) -> object:
    """Return body with the value at path replaced (the whole body for the empty path)."""
    if not path:
        return value
    out = json.loads(json.dumps(body))
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out


def check_pre_model_steps(payload: "api.InferencePayload") -> None:
    """Run verify_payload's steps before the model on an accepted payload: only typed rejections."""
    for step in (lambda: decode_payload_artifact(payload),
                 lambda: decode_fingerprint_base64(payload.verification_proofs),
                 lambda: normalise_messages(payload.request.get("messages") or [])):
        try:
            step()
        except InvalidInput:
            pass
    assert 0 <= int(payload.inference_id) < 2**256 and 0 <= int(payload.user_seed) < 2**64


@FUZZ
@given(st.sampled_from(PATHS), json_values)
def test_wrong_json_anywhere_gives_a_typed_rejection(path, value):
    raw = json.dumps(replaced(valid_body(), path, value))
    reason = fetch_time_reason(raw)
    assert reason is None or isinstance(reason, Reason)
    try:
        payload = api.decode_inference_payload(raw)
    except api.InvalidPayload as exc:
        assert exc.reason is Reason.WIRE_MALFORMED
        return
    check_pre_model_steps(payload)


@FUZZ
@given(st.data())
def test_corrupted_payload_text_gives_a_typed_rejection(data):
    raw = bytearray(json.dumps(valid_body()).encode())
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(raw) - 1))
        raw[at] = data.draw(st.integers(0, 255))
    reason = fetch_time_reason(bytes(raw))
    assert reason is None or isinstance(reason, Reason)


def test_sampling_requests_are_strict():
    ok = {"model": "tiny-llama", "messages": MESSAGES}
    parse = api.ChatCompletionRequest.model_validate
    assert parse({**ok, "temperature": 0, "inference_id": "0xff"}).inference_id == 255
    assert parse({**ok, "inference_id": 12345, "presence_penalty": 0}).inference_id == 12345
    for bad in ({"max_tokens": "12"}, {"seed": True}, {"seed": "3"}, {"seed": 2**64}, {"temperature": "1.0"},
                {"temperature": float("nan")}, {"top_k": 1.5}, {"logprobs": "true"}, {"inference_id": "1_0"},
                {"inference_id": " 1"}, {"inference_id": "0o7"}, {"inference_id": 2**256}, {"inference_id": True},
                {"inference_id": "9" * 5000}, {"output_token_ids": [2**32]}, {"output_token_ids": ["1"]},
                {"verification_proof_to_validate": ["AAAA"]}, {"frequency_penalty": 0.5}, {"stop": ["\n"]},
                {"logit_bias": {"1": 5}}, {"messages": [{"role": "user", "content": "hi", "name": "bob"}]},
                {"messages": ["x"]}, {"messages": [{"role": "user", "content": None}]}):
        with pytest.raises(ValidationError):
            api.ChatCompletionRequest.model_validate({**ok, **bad})
    with pytest.raises(ValidationError, match="base64"):
        api.ChatCompletionRequest.model_validate({**ok, "verification_proof_to_validate": ["%%%"]})
    with pytest.raises(ValidationError):
        api.CompletionRequest.model_validate({"model": "tiny-llama", "prompt": ["a"]})


def test_response_models_refuse_unknown_fields():
    info = {"inference_id": "1", "user_seed": "2", "run_seed": "0x" + "00" * 32, "model_id": "0x" + "11" * 32,
            "prompt_hash": "0x" + "22" * 32, "output_hash": "0x" + "33" * 32, "artifact_root": "0x" + "44" * 32,
            "fingerprint_hash": "0x" + "55" * 32, "k": 5, "artifact_url": "http://x/a", "payload_url": "http://x/p"}
    assert api.VerinferInfo.model_validate_json(api.VerinferInfo(**info).model_dump_json()).k == 5
    for model, body in ((api.VerinferInfo, {**info, "extra": 1}), (api.VerinferInfo, {**info, "user_seed": 2}),
                        (api.ErrorBody, {"message": "m", "type": "t", "extra": 1}),
                        (api.FingerprintCheck, {"valid": "yes", "reason": "OK", "profile": "p", "calibrated": False,
                                                "chunks": []})):
        with pytest.raises(ValidationError):
            model.model_validate(body)


def test_the_executers_own_payload_passes_the_strict_parse(tiny):
    service = ExecuterService(tiny.files, tiny.tokenizer, tiny.engine, FingerprintThresholds(2, 1.0, 1.0, 0))
    prompt_hash = compute_prompt_hash(tiny.files.model_id, messages=MESSAGES)
    served = service.infer(tiny.tokenizer.encode_chat(MESSAGES), prompt_hash, SamplingParams(1.0, 1.0, 0, 8), 5, 77,
                           {"messages": MESSAGES})
    payload = api.decode_inference_payload(service.payload_json(77))
    p = SamplingParams(1.0, 1.0, 0, 8)
    facts = ChainFacts(77, 5, tiny.files.model_id, p.temperature_bits, p.top_p_bits, 0, 8, prompt_hash,
                       served.output_hash, served.artifact.root, served.fingerprint_hash)
    assert find_payload_mismatch(payload, facts) is Reason.OK

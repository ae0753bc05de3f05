import base64

import httpx
import openai
import pytest

from node.checks.stage1 import OnchainInference, sequence_check
from node.protocol.artifact import decode_artifact_wire
from node.protocol.fingerprint import compute_fingerprint_hash, decode_fingerprint_base64
from node.protocol.prompt import compute_prompt_hash
from node.protocol.sampler import SamplingParams

TINY = "tiny-llama"
MESSAGES = [{"role": "user", "content": "Count to five."}]


def chat(client, **kw):
    args = {"model": TINY, "messages": MESSAGES, "max_tokens": 12, "seed": 3, "temperature": 1.0}
    args.update(kw)
    return client.chat.completions.create(**args).model_dump()


def test_models_lists_the_served_model(tiny_server, tiny):
    models = tiny_server.client().models.list().model_dump()["data"]
    assert [m["id"] for m in models] == [TINY]
    assert models[0]["verinfer"]["model_id"] == "0x" + tiny.files.model_id.hex()


def test_chat_response_carries_proofs_and_a_verifiable_artifact(tiny_server, tiny):
    client = tiny_server.client()
    r = chat(client, temperature=0.8, top_p=0.9, extra_body={"top_k": 50, "inference_id": 12345})
    choice, info = r["choices"][0], r["verinfer"]
    proofs = decode_fingerprint_base64(choice["message"]["verification_proofs"])
    assert info["fingerprint_hash"] == "0x" + compute_fingerprint_hash(proofs).hex()
    assert info["inference_id"] == "12345" and info["user_seed"] == "3"
    assert info["prompt_hash"] == "0x" + compute_prompt_hash(tiny.files.model_id, messages=MESSAGES).hex()
    wire = httpx.get(info["artifact_url"]).content
    art = decode_artifact_wire(wire)
    assert "0x" + art.root.hex() == info["artifact_root"]
    assert r["usage"]["completion_tokens"] == len(art.positions)
    p = SamplingParams(0.8, 0.9, 50, 12)
    onchain = OnchainInference(12345, 3, tiny.files.model_id, p.temperature_bits, p.top_p_bits, 50, 12, 5,
                               tiny.engine.vocab_size, bytes.fromhex(info["output_hash"][2:]), art.root,
                               frozenset(tiny.files.spec.stop_token_ids), tiny.tokenizer.encode_chat(MESSAGES))
    assert sequence_check(art.header, art.positions, onchain).valid
    payload = httpx.get(info["payload_url"]).json()
    assert base64.b64decode(payload["artifact"]) == wire
    assert payload["request"] == {"messages": MESSAGES}
    assert payload["verification_proofs"] == choice["message"]["verification_proofs"]


def test_same_seed_same_text_other_seed_other_text(tiny_server):
    client = tiny_server.client()
    a, b, c = chat(client, seed=11), chat(client, seed=11), chat(client, seed=12)
    text = [x["choices"][0]["message"]["content"] for x in (a, b, c)]
    assert text[0] == text[1] and text[0] != text[2]
    assert a["verinfer"]["inference_id"] == b["verinfer"]["inference_id"]  # derived from request + seed
    assert a["verinfer"]["inference_id"] != c["verinfer"]["inference_id"]


def test_logprobs_are_the_raw_model_logprobs(tiny_server):
    r = chat(tiny_server.client(), logprobs=True, top_logprobs=3, temperature=0.0)
    content = r["choices"][0]["logprobs"]["content"]
    assert len(content) == r["usage"]["completion_tokens"]
    first = content[0]
    assert len(first["top_logprobs"]) == 3
    assert first["logprob"] == first["top_logprobs"][0]["logprob"]  # greedy picks the top token
    assert all(x["logprob"] <= 0 for x in first["top_logprobs"])


def test_completions_endpoint(tiny_server, tiny):
    r = tiny_server.client().completions.create(model=TINY, prompt="Once upon a time", max_tokens=8, seed=1,
                                                logprobs=2).model_dump()
    choice = r["choices"][0]
    assert len(choice["logprobs"]["tokens"]) == r["usage"]["completion_tokens"] == 8
    assert choice["finish_reason"] == "length"
    assert r["verinfer"]["prompt_hash"] == "0x" + compute_prompt_hash(tiny.files.model_id,
                                                                      prompt="Once upon a time").hex()


def test_verification_instance_mode(tiny_server):
    client = tiny_server.client()
    r = chat(client, temperature=0.0, max_tokens=10)
    proofs = r["choices"][0]["message"]["verification_proofs"]
    art = decode_artifact_wire(httpx.get(r["verinfer"]["artifact_url"]).content)
    output_ids = [int(t) for t in art.positions.chosen]
    messages = [*MESSAGES, {"role": "assistant", "content": r["choices"][0]["message"]["content"]}]
    ok = client.chat.completions.create(model=TINY, messages=messages, max_tokens=0, extra_body={
        "verification_proof_to_validate": proofs, "output_token_ids": output_ids}).model_dump()["verification"]
    assert ok["valid"] and ok["reason"] == "OK" and len(ok["chunks"]) == len(proofs)
    assert ok["calibrated"] is False
    other = chat(client, temperature=1.0, max_tokens=10, seed=99)["choices"][0]["message"]["verification_proofs"]
    bad = client.chat.completions.create(model=TINY, messages=messages, max_tokens=0, extra_body={
        "verification_proof_to_validate": proofs[:1] + other[1:], "output_token_ids": output_ids}).model_dump()
    assert bad["verification"]["valid"] is False
    assert bad["verification"]["chunks"][1]["exponent_mismatches"] > 38


@pytest.mark.parametrize("body,status,needle", [
    ({"model": TINY, "messages": MESSAGES, "n": 2}, 400, "n"),
    ({"model": TINY, "messages": MESSAGES, "stream": True}, 400, "stream"),
    ({"model": TINY, "messages": MESSAGES, "temperature": -1}, 400, "temperature"),
    ({"model": TINY, "messages": MESSAGES, "top_p": 0}, 400, "top_p"),
    ({"model": TINY, "messages": MESSAGES, "seed": -5}, 400, "seed"),
    ({"model": TINY, "messages": MESSAGES, "max_tokens": 0}, 400, "max_tokens"),
    ({"model": TINY, "messages": MESSAGES, "inference_id": "0xzz"}, 400, "inference_id"),
    ({"model": TINY, "messages": []}, 400, "messages"),
    ({"model": TINY, "messages": [{"role": "wizard", "content": "hi"}]}, 400, "role"),
    ({"model": TINY}, 400, "messages"),
    ({"model": "nope", "messages": MESSAGES}, 404, "nope"),
    ({"model": TINY, "messages": [*MESSAGES, {"role": "assistant", "content": "x"}], "max_tokens": 0,
      "verification_proof_to_validate": ["%%%"]}, 400, "base64"),
    ({"model": TINY, "messages": MESSAGES, "max_tokens": 0, "verification_proof_to_validate": []}, 400, "assistant"),
])
def test_malformed_requests_get_openai_style_errors(tiny_server, body, status, needle):
    r = httpx.post(tiny_server.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == status
    error = r.json()["error"]
    assert needle in error["message"] and error["type"]


def test_non_json_and_unknown_ids(tiny_server):
    r = httpx.post(tiny_server.url + "/v1/chat/completions", content=b"{not json", timeout=30)
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    assert httpx.get(tiny_server.url + "/v1/artifacts/0x" + "00" * 32).status_code == 404
    assert httpx.get(tiny_server.url + "/v1/artifacts/nothex").status_code == 400
    assert httpx.get(tiny_server.url + "/v1/payloads/notanumber").status_code == 400
    assert httpx.get(tiny_server.url + "/health").json()["status"] == "ok"


def test_openai_client_raises_on_errors(tiny_server):
    with pytest.raises(openai.NotFoundError):
        tiny_server.client().chat.completions.create(model="nope", messages=MESSAGES)
    with pytest.raises(openai.BadRequestError):
        tiny_server.client().chat.completions.create(model=TINY, messages=MESSAGES, temperature=-3)


def test_real_smollm2_over_the_api(smol_server):
    client = smol_server.client()
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    r = client.chat.completions.create(model="smollm2-135m-instruct", messages=messages, temperature=0,
                                       max_tokens=24, seed=1).model_dump()
    text = r["choices"][0]["message"]["content"]
    assert "Paris" in text
    check = client.chat.completions.create(
        model="smollm2-135m-instruct", messages=[*messages, {"role": "assistant", "content": text}], max_tokens=0,
        extra_body={"verification_proof_to_validate": r["choices"][0]["message"]["verification_proofs"]},
    ).model_dump()["verification"]
    assert check["valid"], check  # the re-tokenised text (+ stop token) reproduces the generation

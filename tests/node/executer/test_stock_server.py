"""The executer's OpenAI-compatible API for a stock-sampler model (docs/protocol.md §13.1): the official
openai client against a real server; the payload it serves passes the validator's stock checks."""

from collections.abc import Iterator

import httpx
import openai
import pytest

from node.checks.stock_decision import StockThresholds
from node.engines.models import ModelFiles
from node.executer.api import decode_stock_payload
from node.executer.stock import StockService
from node.protocol.prompt import compute_prompt_hash
from node.protocol.sampler import SamplingParams
from node.protocol.stock import STOCK_ARTIFACT_ROOT, compute_stock_commitment
from node.validator.stock import verify_stock_payload
from node.validator.verify import ChainFacts
from tests.node.executer.conftest import RunningServer

MESSAGES = [{"role": "user", "content": "Count to five."}]


@pytest.fixture(scope="module")
def stock_server(tiny) -> Iterator[tuple[RunningServer, ModelFiles]]:
    files = ModelFiles(tiny.files.spec.model_copy(update={"sampler": "vllm-seeded", "name": "tiny-llama-stock"}),
                       tiny.files.path, tiny.files.weights_sha256)
    service = StockService(files, tiny.tokenizer, tiny.engine.generate_with_vllm_rule, tiny.engine.info)
    with RunningServer(service) as server:
        yield server, files


def test_a_stock_chat_response_names_the_stock_commitment_and_its_payload_verifies(stock_server, tiny):
    server, files = stock_server
    r = server.client().chat.completions.create(model="tiny-llama-stock", messages=MESSAGES, max_tokens=10, seed=3,
                                                temperature=0.8, top_p=0.95,
                                                extra_body={"inference_id": 77}).model_dump()
    info = r["verinfer"]
    assert info["artifact_root"] == "0x" + STOCK_ARTIFACT_ROOT.hex() and info["fingerprint_hash"] == "0x" + "00" * 32
    assert info["sampler"] == "vllm-seeded" and "verification_proofs" not in r["choices"][0]["message"]
    payload = decode_stock_payload(httpx.get(info["payload_url"]).content)
    assert r["usage"]["completion_tokens"] == len(payload.output_ids)
    assert r["choices"][0]["message"]["content"] == tiny.tokenizer.decode(tuple(payload.output_ids))
    output_hash, root, fingerprint_hash = compute_stock_commitment(payload.output_ids)
    assert info["output_hash"] == "0x" + output_hash.hex()
    params = SamplingParams(0.8, 0.95, 0, 10)
    facts = ChainFacts(77, 3, files.model_id, params.temperature_bits, params.top_p_bits, 0, 10,
                       compute_prompt_hash(files.model_id, messages=MESSAGES), output_hash, root, fingerprint_hash)
    report = verify_stock_payload(payload, files, tiny.tokenizer, tiny.engine,
                                  StockThresholds(max_difr_mean=0.01, max_difr_max=0.01, max_surprisal_z_abs=8.0),
                                  facts)
    assert report.valid, report.reason


def test_a_stock_model_refuses_what_it_cannot_answer(stock_server):
    server, _ = stock_server
    client = server.client()
    with pytest.raises(openai.BadRequestError, match="logprobs"):
        client.chat.completions.create(model="tiny-llama-stock", messages=MESSAGES, max_tokens=4, logprobs=True)
    with pytest.raises(openai.BadRequestError, match="no fingerprints"):
        client.chat.completions.create(model="tiny-llama-stock", messages=[*MESSAGES, {"role": "assistant",
                                       "content": "1 2"}], max_tokens=0,
                                       extra_body={"verification_proof_to_validate": []})
    assert httpx.get(f"{server.url}/v1/artifacts/0x{'11' * 32}").status_code == 404
    models = client.models.list().model_dump()["data"]
    assert models[0]["verinfer"]["sampler"] == "vllm-seeded"
    text = client.completions.create(model="tiny-llama-stock", prompt="One, two,", max_tokens=5, seed=4).model_dump()
    assert text["verinfer"]["artifact_root"] == "0x" + STOCK_ARTIFACT_ROOT.hex()

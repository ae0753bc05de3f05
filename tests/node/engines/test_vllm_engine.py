"""The vLLM backend against the transformers backend, on the real SmolLM2 (fp32).

Runs in .venv-vllm (scripts/setup_vllm; `bash scripts/test` runs it); skipped where vllm is absent.
"""

import numpy as np
import pytest

pytest.importorskip("vllm")

from node.engines.base import GenerationRequest
from node.engines.models import get_model_spec, materialise_model
from node.engines.tokenizer import ModelTokenizer
from node.engines.transformers_engine import TransformersEngine
from node.engines.vllm_engine import VllmEngine
from node.executer.service import ExecuterService
from node.profiles import load_profile
from node.protocol.fingerprint import build_fingerprint, verify_fingerprint
from node.protocol.sampler import SamplingParams, compute_raw_logprobs
from node.protocol.seed import run_seed
from tests.node.engines.test_transformers_engine import stage1
from tests.node.executer.conftest import RunningServer

NAME = "smollm2-135m-instruct"


class Loaded:
    def __init__(self) -> None:
        spec = get_model_spec(NAME)
        self.files = materialise_model(spec)
        self.tokenizer = ModelTokenizer(self.files.path, True)
        self.vllm = VllmEngine(self.files.path, NAME)
        self.hf = TransformersEngine(self.files.path, NAME)
        self.engine = self.vllm


@pytest.fixture(scope="module")
def both() -> Loaded:
    return Loaded()


def prompt(both, text="Write a haiku about the sea."):
    return both.tokenizer.encode_chat([{"role": "user", "content": text}])


PARAMS = [SamplingParams(0.0, 1.0, 0, 24), SamplingParams(1.0, 1.0, 0, 24), SamplingParams(0.7, 0.9, 40, 24)]


def close_to(prefill, gen, prompt_len):
    for i, s in enumerate(gen.samples):
        assert np.abs(compute_raw_logprobs(prefill.logits[i])[list(s.token_ids)] - s.raw_logprobs).max() < 1e-3
    for m in verify_fingerprint(prefill.hidden, prompt_len, build_fingerprint(gen.hidden, prompt_len)):
        assert m.exponent_mismatches <= 2 and m.sign_mismatches == 0 and m.mantissa_error_mean <= 1


@pytest.mark.parametrize("params", PARAMS)
def test_vllm_artifact_passes_stage1_and_verifies_under_transformers_prefill(both, params):
    ids = prompt(both)
    req = GenerationRequest(ids, params, run_seed(7, 8), 5, both.tokenizer.stop_ids)
    gen = both.vllm.generate([req])[0]
    assert stage1(both, req, gen, (7, 8)).valid
    close_to(both.hf.prefill(ids, gen.output_ids), gen, len(ids))


@pytest.mark.parametrize("params", PARAMS)
def test_transformers_artifact_verifies_under_vllm_prefill(both, params):
    ids = prompt(both, "List three prime numbers.")
    req = GenerationRequest(ids, params, run_seed(9, 10), 5, both.tokenizer.stop_ids)
    gen = both.hf.generate([req])[0]
    close_to(both.vllm.prefill(ids, gen.output_ids), gen, len(ids))


def test_both_backends_choose_the_same_tokens(both):
    ids = prompt(both)
    req = GenerationRequest(ids, SamplingParams(1.0, 1.0, 0, 32), run_seed(1, 1), 5, both.tokenizer.stop_ids)
    a, b = both.vllm.generate([req])[0], both.hf.generate([req])[0]
    assert a.output_ids == b.output_ids
    assert np.abs(a.hidden - b.hidden).max() < 1e-3


def test_vllm_same_seed_same_output_other_seed_other(both):
    ids = prompt(both)
    p = SamplingParams(1.0, 1.0, 0, 16)
    one = [both.vllm.generate([GenerationRequest(ids, p, run_seed(s, 1), 5)])[0].output_ids for s in (1, 1, 2)]
    assert one[0] == one[1] and one[0] != one[2]


def test_vllm_answers_paris_over_the_api(both):
    _, profile = load_profile(both.files.spec)
    service = ExecuterService(both.files, both.tokenizer, both.vllm, profile.fingerprint_thresholds())
    with RunningServer(service) as server:
        r = server.client().chat.completions.create(
            model=NAME, messages=[{"role": "user", "content": "What is the capital of France?"}], temperature=0,
            max_tokens=24, seed=5).model_dump()
    assert "Paris" in r["choices"][0]["message"]["content"]
    assert r["choices"][0]["message"]["verification_proofs"]

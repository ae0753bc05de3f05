"""The vLLM backend against the transformers backend, on the real SmolLM2 (fp32).

Runs in .venv-vllm (scripts/setup_vllm; `bash scripts/test` runs it); skipped where vllm is absent.
"""

import copy
from dataclasses import replace

import numpy as np
import pytest
import torch

pytest.importorskip("vllm")

from node.calibrate.models import make_noisy_engine
from node.checks.projection import ProjectionThresholds
from node.engines.base import GenerationRequest
from node.engines.models import ProjectionConfig, get_model_spec, materialise_model
from node.engines.tokenizer import ModelTokenizer
from node.engines.transformers_engine import TransformersEngine, TransformersOptions
from node.engines.vllm_engine import VllmEngine, VllmOptions
from node.errors import Reason
from node.executer.api import InferencePayload
from node.executer.service import ExecuterService
from node.profiles import load_profile
from node.protocol.fingerprint import build_fingerprint, encode_fingerprint_base64, verify_fingerprint
from node.protocol.projection import KIND_PROJECTION, build_projection_blob, compute_projection_seed, split_pieces
from node.protocol.prompt import compute_prompt_hash
from node.protocol.sampler import SamplingParams, compute_raw_logprobs
from node.protocol.seed import run_seed
from node.validator.verify import NO_BLOCK_HASH, verify_payload
from tests.node.engines.test_transformers_engine import stage1
from tests.node.executer.conftest import RunningServer

NAME = "smollm2-135m-instruct"
RECORDED = (0, 7, 28, 29)  # SmolLM2-135M has 30 decoder layers: 29 is the last, before the final norm


class Loaded:
    def __init__(self) -> None:
        spec = get_model_spec(NAME)
        self.files = materialise_model(spec)
        self.tokenizer = ModelTokenizer(self.files.path, True)
        self.vllm = VllmEngine(self.files.path, NAME, VllmOptions(record_layers=RECORDED))
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


def relative(a, b):
    """Return the mean over rows of |a − b| / |b|."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.mean(np.linalg.norm(a - b, axis=-1) / np.linalg.norm(b, axis=-1)))


# fp32 rows, measured on 10 prompts of config/calibration/prompts.toml × 64 tokens: vLLM's generate against its own
# prefill and against the transformers prefill differ by at most 2.4e-6 (mean relative L2, any recorded layer);
# the final norm of layer 29's rows is vLLM's last hidden state exactly (0.0)
ROWS_TOLERANCE = 1e-5


def test_vllm_records_decoder_layers_row_for_row(both):
    ids = prompt(both, "Name three rivers in Europe.")
    req = GenerationRequest(ids, SamplingParams(0.7, 1.0, 0, 24), run_seed(3, 4), 5)
    gen = both.vllm.generate([req])[0]
    pre = both.vllm.prefill(ids, gen.output_ids)
    rows = len(ids) + len(gen.output_ids) - 1
    assert gen.layers.shape == pre.layers.shape == (len(RECORDED), rows, gen.hidden.shape[1])
    assert gen.layers.dtype == np.float32
    with torch.no_grad():  # the last layer's residual stream through the final norm is the last hidden state
        normed = both.hf.decoder.norm(torch.from_numpy(gen.layers[RECORDED.index(29)])).numpy()
    np.testing.assert_allclose(normed, gen.hidden, atol=1e-5)
    hf = copy.copy(both.hf)
    hf.options = TransformersOptions(record_layers=RECORDED)
    own = hf.prefill(ids, gen.output_ids)
    for i in range(len(RECORDED)):
        assert relative(gen.layers[i], pre.layers[i]) < ROWS_TOLERANCE
        assert relative(gen.layers[i], own.layers[i]) < ROWS_TOLERANCE


# Kind 1 over decoder layers 0 and 28 (k = 8, 8 bits). The threshold is measured, not tuned: fp32 vLLM rows against
# the fp32 transformers prefill on 10 prompts of config/calibration/prompts.toml × 64 tokens × 5 seeds measured at
# most 1.5e-9 per source (mostly 0: fp32 rows differ by ~1e-6, far inside an 8-bit bin); the threshold is 10× that.
# The same text with layer rows from a model with 0.1 % weight noise lies far above it.
PROJECTION = ProjectionConfig(layers=(0, 28), k=8, bits=8)
PROJECTION_THRESHOLD = ProjectionThresholds(1.5e-8)


def test_a_kind_1_executer_on_vllm_passes_the_transformers_validator(both):
    spec = both.files.spec.model_copy(update={"fingerprint_kinds": (1, 0), "projection": PROJECTION})
    files = replace(both.files, spec=spec)
    _, profile = load_profile(files.spec)
    messages = [{"role": "user", "content": "Describe a lighthouse in two sentences."}]
    service = ExecuterService(files, both.tokenizer, both.vllm, profile.fingerprint_thresholds())
    served = service.infer(both.tokenizer.encode_chat(messages), compute_prompt_hash(files.model_id, messages=messages),
                           SamplingParams(0.7, 1.0, 0, 48), 11, 12, {"messages": messages})
    assert b"".join(served.fingerprint)[0] == KIND_PROJECTION
    payload = InferencePayload.model_validate_json(service.payload_json(12))
    validator = copy.copy(both.hf)
    validator.options = TransformersOptions(record_layers=PROJECTION.decoder_layers())
    report = verify_payload(payload, files, both.tokenizer, validator, profile.stage2_thresholds(),
                            projection=PROJECTION_THRESHOLD)
    assert report.valid, report
    assert report.projection is not None and report.projection.distance <= PROJECTION_THRESHOLD.max_distance
    ids = list(both.tokenizer.encode_chat(messages))
    noisy = make_noisy_engine(validator, 0.001, seed=7).prefill(ids, served.generation.output_ids).layers
    seed = compute_projection_seed(run_seed(11, 12), NO_BLOCK_HASH)
    blob = build_projection_blob([layer[len(ids) - 1:] for layer in noisy], PROJECTION.spec(), seed)
    cheat = payload.model_copy(update={"verification_proofs": encode_fingerprint_base64(split_pieces(blob))})
    report = verify_payload(cheat, files, both.tokenizer, validator, profile.stage2_thresholds(),
                            projection=PROJECTION_THRESHOLD)
    assert report.reason is Reason.FINGERPRINT_PROJECTION_DISTANCE, report.projection

import numpy as np
import pytest

from node.checks.stage1 import OnchainInference, sequence_check
from node.engines.base import GenerationRequest
from node.engines.transformers_engine import TransformersEngine, TransformersOptions
from node.errors import InvalidParams
from node.protocol.artifact import Artifact, ArtifactHeader, compute_output_hash
from node.protocol.fingerprint import build_fingerprint, verify_fingerprint
from node.protocol.sampler import SamplingParams, compute_raw_logprobs
from node.protocol.seed import run_seed


def request(prompt, params, seed=(1, 2), k=5, stops=frozenset()):
    return GenerationRequest(tuple(prompt), params, run_seed(*seed), k, stops)


def stage1(model, req, gen, seed=(1, 2)):
    p = req.params
    header = ArtifactHeader(model.files.model_id, p.temperature_bits, p.top_p_bits, p.top_k, p.max_tokens, req.k,
                            req.run_seed, req.prompt_ids, len(gen.output_ids))
    art = Artifact(header, gen.positions(req.k))
    onchain = OnchainInference(seed[1], seed[0], model.files.model_id, p.temperature_bits, p.top_p_bits, p.top_k,
                               p.max_tokens, req.k, model.engine.vocab_size, compute_output_hash(gen.output_ids),
                               art.root, req.stop_ids)
    return sequence_check(header, art.positions, onchain)


PROMPT = [1, 9690, 198, 2683, 359, 253, 5356, 28, 1780, 314]


def test_same_seed_same_output_other_seed_other_samples(tiny):
    params = SamplingParams(1.0, 1.0, 0, 24)
    a = tiny.engine.generate([request(PROMPT, params, (5, 9))])[0]
    b = tiny.engine.generate([request(PROMPT, params, (5, 9))])[0]
    c = tiny.engine.generate([request(PROMPT, params, (6, 9))])[0]
    assert a.output_ids == b.output_ids and len(a.output_ids) == 24 and a.finish_reason == "length"
    assert a.output_ids != c.output_ids
    assert np.array_equal(a.hidden, b.hidden)


@pytest.mark.parametrize("params", [SamplingParams(0.0, 1.0, 0, 16), SamplingParams(0.7, 0.9, 0, 16),
                                    SamplingParams(1.0, 1.0, 20, 16), SamplingParams(1.3, 0.5, 3, 16)])
def test_generation_passes_stage1_and_matches_its_prefill(tiny, params):
    req = request(PROMPT, params)
    gen = tiny.engine.generate([req])[0]
    assert stage1(tiny, req, gen).valid
    assert gen.hidden.shape == (len(PROMPT) + len(gen.output_ids) - 1, 128)
    pre = tiny.engine.prefill(PROMPT, gen.output_ids)
    assert pre.logits.shape == (len(gen.output_ids), tiny.engine.vocab_size)
    assert np.abs(pre.hidden - gen.hidden).max() < 1e-4
    for i, s in enumerate(gen.samples):
        assert np.allclose(compute_raw_logprobs(pre.logits[i])[list(s.token_ids)], s.raw_logprobs, atol=1e-4)
    for m in verify_fingerprint(pre.hidden, len(PROMPT), build_fingerprint(gen.hidden, len(PROMPT))):
        assert m.exponent_mismatches <= 2 and m.mantissa_error_mean <= 1


def test_stop_token_ends_generation(tiny):
    params = SamplingParams(0.0, 1.0, 0, 30)
    free = tiny.engine.generate([request(PROMPT, params)])[0]
    stop = free.output_ids[3]
    stopped = tiny.engine.generate([request(PROMPT, params, stops=frozenset({stop}))])[0]
    assert stopped.finish_reason == "stop"
    assert stopped.output_ids == free.output_ids[:free.output_ids.index(stop) + 1]


def test_batch_of_four_matches_single_requests(tiny):
    params = [SamplingParams(1.0, 1.0, 0, 12), SamplingParams(0.0, 1.0, 0, 7), SamplingParams(0.8, 0.9, 0, 10),
              SamplingParams(1.0, 1.0, 5, 9)]
    prompts = [PROMPT, PROMPT[:4], PROMPT[2:], [1, 2, 3]]
    reqs = [request(p, q, (i, 7)) for i, (p, q) in enumerate(zip(prompts, params, strict=True))]
    batch = tiny.engine.generate(reqs)
    for req, gen in zip(reqs, batch, strict=True):
        single = tiny.engine.generate([req])[0]
        assert stage1(tiny, req, gen, (reqs.index(req), 7)).valid
        assert gen.output_ids == single.output_ids
        assert np.abs(gen.hidden - single.hidden).max() < 1e-4


def test_without_kv_cache_the_same_tokens(tiny):
    no_cache = TransformersEngine(tiny.files.path, "tiny-llama", TransformersOptions(kv_cache=False))
    req = request(PROMPT, SamplingParams(1.0, 1.0, 0, 12))
    a, b = tiny.engine.generate([req])[0], no_cache.generate([req])[0]
    assert a.output_ids == b.output_ids
    assert np.abs(a.hidden - b.hidden).max() < 1e-4


def test_bad_inputs_are_typed_errors(tiny):
    with pytest.raises(InvalidParams):
        tiny.engine.generate([request([], SamplingParams(1.0))])
    with pytest.raises(InvalidParams):
        tiny.engine.generate([request([10**6], SamplingParams(1.0))])
    with pytest.raises(InvalidParams):
        tiny.engine.generate([request(PROMPT, SamplingParams(1.0, 1.0, 0, 0))])
    with pytest.raises(InvalidParams):
        tiny.engine.prefill([], [1])


def test_real_smollm2_answers_paris_greedily(smol):
    prompt = smol.tokenizer.encode_chat([{"role": "user", "content": "What is the capital of France?"}])
    req = request(prompt, SamplingParams(0.0, 1.0, 0, 24), stops=smol.tokenizer.stop_ids)
    gen = smol.engine.generate([req])[0]
    assert "Paris" in smol.tokenizer.decode(gen.output_ids)
    assert gen.finish_reason == "stop"
    assert stage1(smol, req, gen).valid
    pre = smol.engine.prefill(prompt, gen.output_ids)
    for m in verify_fingerprint(pre.hidden, len(prompt), build_fingerprint(gen.hidden, len(prompt))):
        assert m.exponent_mismatches <= 2 and m.sign_mismatches == 0

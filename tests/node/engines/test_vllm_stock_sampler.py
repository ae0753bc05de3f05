"""vLLM's own seeded sampler, replayed by node.protocol.vllm_sampler from vLLM's own logits (real SmolLM2, fp32).

Runs in .venv-vllm (scripts/setup_vllm); skipped where vllm is absent. The logits are the rows vLLM's
sampler received (recorded by the engine's logits processor before temperature), so the replay must
give vLLM's tokens exactly: noise, temperature, top-k/top-p and the argmax are all reproduced.
"""

import numpy as np
import pytest

pytest.importorskip("vllm")

import torch

from node.engines.models import get_model_spec, materialise_model
from node.engines.tokenizer import ModelTokenizer
from node.engines.vllm_engine import VllmEngine, VllmOptions
from node.protocol.sampler import SamplingParams
from node.protocol.seed import run_seed
from node.protocol.vllm_sampler import (
    compute_gumbel_noise,
    compute_processed_logits,
    compute_step_seeds,
    sample_vllm_position,
    vllm_request_seed,
)

NAME = "smollm2-135m-instruct"
PARAMS = [SamplingParams(1.0, 1.0, 0, 40), SamplingParams(0.7, 0.9, 0, 40), SamplingParams(0.8, 0.95, 40, 40),
          SamplingParams(1.2, 1.0, 20, 40), SamplingParams(0.0, 1.0, 0, 24)]


@pytest.fixture(scope="module")
def loaded() -> tuple[VllmEngine, ModelTokenizer]:
    files = materialise_model(get_model_spec(NAME))
    return VllmEngine(files.path, NAME, VllmOptions(max_model_len=1024, memory_fraction=0.12)), \
        ModelTokenizer(files.path, True)


@pytest.mark.parametrize("params", PARAMS)
@pytest.mark.parametrize("user_seed", [3, 11])
def test_replay_gives_vllms_tokens_from_vllms_logits(loaded, params, user_seed):
    engine, tokenizer = loaded
    ids = tokenizer.encode_chat([{"role": "user", "content": "Tell me a short story about a lighthouse."}])
    seed = vllm_request_seed(run_seed(user_seed, 99))
    gen = engine.generate_stock(ids, params, seed, record_logits=True)
    assert gen.logits is not None and gen.logits.shape == (len(gen.output_ids), engine.vocab_size)
    steps = compute_step_seeds(seed, len(gen.output_ids))
    replay = [sample_vllm_position(gen.logits[i], params, int(steps[i])) for i in range(len(gen.output_ids))]
    assert replay == list(gen.output_ids)
    # the same seed gives the same tokens: the generator is the request's own
    assert engine.generate_stock(ids, params, seed).output_ids == gen.output_ids


def test_another_seed_gives_other_tokens_and_the_replay_sees_it(loaded):
    engine, tokenizer = loaded
    params = SamplingParams(1.0, 1.0, 0, 32)
    ids = tokenizer.encode_chat([{"role": "user", "content": "Name some rivers."}])
    seed = vllm_request_seed(run_seed(5, 5))
    gen = engine.generate_stock(ids, params, seed + 1, record_logits=True)
    steps = compute_step_seeds(seed, len(gen.output_ids))
    replay = [sample_vllm_position(gen.logits[i], params, int(steps[i])) for i in range(len(gen.output_ids))]
    assert replay != list(gen.output_ids)


def test_noise_matches_vllms_kernel():
    import vllm._C  # noqa: F401  (registers torch.ops._C)

    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(32, 49152, generator=generator) * 3
    logits[3, 100:] = float("-inf")
    seeds = torch.randint(-(2**63), 2**63 - 1, (32,), generator=generator)
    ours = np.argmax(logits.double().numpy() + compute_gumbel_noise(seeds.numpy(), 49152), axis=1)
    theirs = [int(torch.ops._C.fused_gumbel_argmax(logits[i:i + 1].contiguous(), seeds[i:i + 1])[0]) for i in range(32)]
    assert ours.tolist() == theirs


def test_processing_matches_vllms_top_k_top_p():
    """Temperature and top-k are exact; top-p's cut may move by a token where torch's exp rounds differently.

    torch's softmax uses Sleef's expf (about 40 % of values differ by an ulp from numpy's); the cumsum is
    float64-accumulated in both. Measured on these Gaussian rows: a handful of rows of 640 move the cut.
    """
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

    generator = torch.Generator().manual_seed(1)
    moved = 0
    for t, p, k in [(0.7, 0.9, 0), (1.0, 0.95, 40), (0.5, 1.0, 20), (1.3, 0.5, 0), (1.0, 0.99, 0)] * 8:
        logits = (torch.randn(16, 49152, generator=generator) * 3).float()
        params = SamplingParams(t, p, k, 8)
        tempered = logits.clone() / torch.tensor([params.temperature], dtype=torch.float32).unsqueeze(1)
        expected = apply_top_k_top_p_pytorch(tempered, torch.full((16,), k) if k else None,
                                             torch.full((16,), params.top_p) if p < 1 else None,
                                             allow_cpu_sync=True).numpy()
        ours = compute_processed_logits(logits.numpy(), params)
        kept = np.isfinite(expected) & np.isfinite(ours)
        assert np.array_equal(expected[kept], ours[kept])  # the values are vLLM's, bit for bit
        differs = (np.isfinite(expected) != np.isfinite(ours)).sum(axis=1)
        assert differs.max() <= 2  # only tokens at the cut
        if p == 1.0:
            assert differs.max() == 0  # temperature and top-k alone: exact
        moved += int((differs > 0).sum())
    assert moved <= 10  # of 640 rows


def test_step_seeds_are_torchs_generator():
    for seed in (0, 1, 12345, 2**32 + 7, 2**63 - 1):
        generator = torch.Generator().manual_seed(seed)
        expected = [int(torch.randint(0, 2**31, (1,), generator=generator).item()) for _ in range(700)]
        assert compute_step_seeds(seed, 700).tolist() == expected


def test_a_stock_operators_payload_from_real_vllm_passes_the_validator(loaded):
    # docs/protocol.md §13.1 end to end without a chain: StockService over stock vLLM (the operator), the
    # StockPayload's JSON, the validator's checks against the stock commitment and Token-DiFR on a
    # transformers prefill under the calibrated stock profile; a payload with one token changed is refused
    from node.engines.transformers_engine import TransformersEngine
    from node.executer.api import decode_stock_payload
    from node.executer.stock import StockService
    from node.profiles import load_profile
    from node.protocol.errors import Reason
    from node.protocol.prompt import compute_prompt_hash, normalise_messages
    from node.protocol.stock import compute_stock_commitment
    from node.validator.stock import find_stock_payload_mismatch, verify_stock_payload
    from node.validator.verify import ChainFacts

    engine, tokenizer = loaded
    spec = get_model_spec("smollm2-135m-instruct-vllm-stock")
    files = materialise_model(spec)
    _, profile = load_profile(spec)
    service = StockService(files, tokenizer, lambda ids, params, seed, stops: engine.generate_stock(
        ids, params, seed, stops).output_ids, engine.info)
    messages = normalise_messages([{"role": "user", "content": "Name three rivers in Europe."}])
    prompt_hash = compute_prompt_hash(files.model_id, messages=messages)
    params = SamplingParams(0.8, 0.95, 0, 48)
    served = service.infer(tokenizer.encode_chat(messages), prompt_hash, params, 11, 12, {"messages": messages})
    payload = decode_stock_payload(service.payload_json(12))
    output_hash, root, fingerprint_hash = compute_stock_commitment(served.output_ids)
    facts = ChainFacts(12, 11, files.model_id, params.temperature_bits, params.top_p_bits, 0, 48, prompt_hash,
                       output_hash, root, fingerprint_hash)
    validator = TransformersEngine(files.path, spec.name)
    report = verify_stock_payload(payload, files, tokenizer, validator, profile.stock_thresholds(), facts)
    assert report.valid, report.reason
    changed = payload.model_copy(update={"output_ids": [*payload.output_ids[:-1], 100]})
    assert find_stock_payload_mismatch(changed, facts) is Reason.OUTPUT_HASH_MISMATCH

"""The fast Llama prefill (node/engines/llama_prefill.py) is bit for bit the transformers module's forward.

The reference is the same engine with `fast_prefill` off: `LlamaModel.forward` and the LM head module,
unmodified. The validator's calibrated profiles were fit on those numbers, so equality is exact.
"""

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest
import torch

from node.engines.llama_prefill import compute_logits, is_supported
from node.engines.transformers_engine import TransformersEngine
from tests.node.conftest import LoadedModel, load

# (prompt tokens, response tokens): 1, 5, 64 and 300 rows fed; one prompt without a response
SHAPES = [(1, 1), (4, 2), (20, 45), (51, 250), (7, 0)]


@contextmanager
def module_forward(engine: TransformersEngine) -> Iterator[None]:
    """Run the engine's prefill through the transformers modules inside the block."""
    engine.fast_prefill = False
    try:
        yield
    finally:
        engine.fast_prefill = True


@contextmanager
def threads(n: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def token_ids(seed: int, n: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, 49152, n)]


def assert_same_prefill(a, b) -> None:
    assert np.array_equal(a.logits, b.logits) and a.logits.shape == b.logits.shape
    assert np.array_equal(a.hidden, b.hidden)
    assert (a.layers is None) == (b.layers is None)
    if a.layers is not None:
        assert np.array_equal(a.layers, b.layers) and a.layers.shape == b.layers.shape


def assert_bit_identical(engine: TransformersEngine) -> None:
    assert engine.fast_prefill
    items = [(token_ids(p, p), token_ids(p + 1000, r)) for p, r in SHAPES]
    fast = [engine.prefill(p, r) for p, r in items]
    fast_batch = engine.prefill_batch(items)
    with module_forward(engine):
        ref = [engine.prefill(p, r) for p, r in items]
        ref_batch = engine.prefill_batch(items)
    for got, want in zip(fast + fast_batch, ref + ref_batch, strict=True):
        assert_same_prefill(got, want)


def test_fast_prefill_is_bit_identical_on_the_tiny_model(tiny):
    assert_bit_identical(tiny.engine)


@pytest.mark.parametrize("n_threads", [1, 2])
def test_fast_prefill_is_bit_identical_on_smollm2(smol, n_threads):
    with threads(n_threads):
        assert_bit_identical(smol.engine)


@pytest.mark.parametrize("record", [(1, 0), (0, 0)])
def test_recorded_layers_are_bit_identical_on_the_tiny_model(record):
    engine = load("tiny-llama", record_layers=record).engine
    assert_bit_identical(engine)  # prefill records the layers; prefill_batch runs it row by row then


@pytest.fixture(scope="module")
def smol_recording() -> LoadedModel:
    return load("smollm2-135m-instruct", record_layers=(29, 3, 14))


def test_recorded_layers_are_bit_identical_on_smollm2(smol_recording):
    assert_bit_identical(smol_recording.engine)


@pytest.mark.parametrize("rows", [1, 2, 3, 8, 64, 256, 300])
def test_sliced_lm_head_is_the_linear_bit_for_bit(smol, rows):
    hidden = torch.from_numpy(np.random.default_rng(rows).standard_normal((rows, 576), dtype=np.float32))
    weight = smol.engine.lm_head.weight
    with torch.inference_mode():
        assert torch.equal(compute_logits(hidden, weight), torch.nn.functional.linear(hidden, weight))


def test_other_models_keep_the_module_forward(tiny):
    config = tiny.engine.decoder.config
    eager = config._attn_implementation
    try:
        config._attn_implementation = "eager"
        assert not is_supported(tiny.engine.decoder)
    finally:
        config._attn_implementation = eager
    assert not is_supported(torch.nn.Linear(2, 2))

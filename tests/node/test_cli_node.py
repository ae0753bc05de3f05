"""`verinfer validator run`'s stage-2 backend option: the IREE engine it builds computes the torch engine's prefill."""

import contextlib
from pathlib import Path

import numpy as np
import pytest

from node.cli_node import open_iree_engine
from node.validator.config import ValidatorConfig

REQUIRED = {"chain_id": 31337, "contract": "0x" + "11" * 20, "keystore": "k.json"}


def test_the_iree_backend_is_a_config_choice_and_nothing_else_is():
    assert ValidatorConfig(**REQUIRED).stage2_backend == "torch"
    assert ValidatorConfig(**REQUIRED, stage2_backend="iree").stage2_backend == "iree"
    with pytest.raises(ValueError):
        ValidatorConfig(**REQUIRED, stage2_backend="onnx")


def test_the_iree_engine_the_validator_opens_prefills_like_torch(tiny, tmp_path: Path):
    prompt, output = (1, 5, 9, 200, 7), (11, 42, 3)
    with contextlib.ExitStack() as stack:
        engine = open_iree_engine(tiny.engine, "tiny-llama", tiny.files.model_id, tmp_path / "iree-cache", stack)
        assert engine.info.backend == "iree" and engine.vocab_size == tiny.engine.vocab_size
        got, want = engine.prefill(prompt, output), tiny.engine.prefill(prompt, output)
        assert got.logits.shape == want.logits.shape and got.hidden.shape == want.hidden.shape
        assert np.allclose(got.logits, want.logits, atol=1e-3) and np.allclose(got.hidden, want.hidden, atol=1e-3)
    assert (tmp_path / "iree-cache" / "tiny-llama").exists(), "its exports and modules are cached for the next start"

"""Assemble the calibration lab: the claimed model, its validator, honest variants and cheaters."""

from __future__ import annotations

import importlib.util
import logging
from typing import Any

from node.calibrate.models import (
    load_engine,
    make_int8_engine,
    make_noisy_engine,
    make_skip_layer_engine,
)
from node.calibrate.runs import HONEST_VARIANTS, Lab, load_prompts
from node.engines.models import get_model_spec, materialise_model
from node.engines.tokenizer import ModelTokenizer

log = logging.getLogger(__name__)


def build_lab(model: str, tokens: int, with_gemma: bool = True,
              dtype: str = "float32") -> tuple[Lab, tuple[str, ...]]:
    """Return the lab for a model claimed at a precision and the honest variants available in this environment.

    The validator always runs the model in float32 (its own dtype); honest operators and the cheaters
    who start from the real model run at the claimed precision.
    """
    spec = get_model_spec(model)
    files = materialise_model(spec)
    tokenizer = ModelTokenizer(files.path, spec.chat)
    validator = load_engine(files.path, model)
    honest = validator if dtype == "float32" else load_engine(files.path, model, dtype=dtype)
    generators: dict[str, Any] = {
        "threads2": honest,
        "nocache": load_engine(files.path, model, kv_cache=False, dtype=dtype),
        "int8": make_int8_engine(validator),
        "weight-noise-1pct": make_noisy_engine(honest, 0.01, seed=1),
        "skip-layer": make_skip_layer_engine(honest, layer=validator.model.config.num_hidden_layers // 2),
    }
    if dtype == "float32":
        generators["bf16-as-fp32"] = load_engine(files.path, model, dtype="bfloat16")
    tiny = materialise_model(get_model_spec("tiny-llama"))
    generators["other-model-tiny"] = load_engine(tiny.path, "tiny-llama")
    if with_gemma:
        gemma = materialise_model(get_model_spec("gemma-3-270m"))
        generators["gemma"] = load_engine(gemma.path, "gemma-3-270m")
        generators["gemma-tokenizer"] = ModelTokenizer(gemma.path, chat=False)
    variants = [v for v in HONEST_VARIANTS if v != "vllm"]
    if importlib.util.find_spec("vllm") is not None:
        from node.engines.vllm_engine import VllmEngine, VllmOptions

        generators["vllm"] = VllmEngine(files.path, model, VllmOptions(dtype=dtype))
        variants.append("vllm")
    else:
        log.warning("vllm is not importable here: honest runs exclude the vLLM backend (use .venv-vllm)")
    return Lab(files, tokenizer, validator, generators, load_prompts(), tokens, honest=honest,
               dtype=dtype), tuple(variants)

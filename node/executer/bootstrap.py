"""Compose an executer from settings: registry entry → model files → engine, tokenizer, profile."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from node.engines.base import Engine
from node.engines.models import REPO_ROOT, ModelFiles, ModelSpec, get_model_spec, load_registry, materialise_model
from node.engines.tokenizer import ModelTokenizer
from node.errors import FatalError, Reason
from node.executer.service import ExecuterService
from node.executer.stock import StockGenerate, StockService
from node.profiles import ModelProfile, load_profile
from node.protocol.sampler import SamplingParams

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

        recorded = files.spec.projection.decoder_layers() if files.spec.projection is not None else ()
        engine: Engine = VllmEngine(files.path, files.spec.name, VllmOptions(dtype=dtype, record_layers=recorded))
        return engine
    from node.engines.transformers_engine import TransformersEngine, TransformersOptions

    layers = files.spec.projection.decoder_layers() if files.spec.projection is not None else ()
    options = TransformersOptions(settings.device, dtype, settings.threads, settings.kv_cache, record_layers=layers)
    return TransformersEngine(files.path, files.spec.name, options)


def load_stock_executer(settings: ExecuterSettings) -> tuple[StockService, Path, ModelProfile]:
    """Return a ready stock-sampler service (docs/protocol.md §13.1): vLLM's own seeded sampler on the vllm
    backend; on transformers, the same rule reproduced over its logits (node.protocol.vllm_sampler)."""
    spec = get_model_spec(settings.model)
    resolve_dtype(spec, settings.dtype)
    if settings.workload_record is not None:
        raise FatalError("the workload record covers the canonical executer only", Reason.UNKNOWN_SAMPLER)
    files = materialise_model(spec, settings.cache_dir)
    profile_path, profile = load_profile(spec)
    engine = load_engine(files, settings)
    generate: StockGenerate
    if settings.backend == "vllm":
        def generate(ids: Sequence[int], params: SamplingParams, seed: int, stops: frozenset[int]) -> Sequence[int]:
            return engine.generate_stock(ids, params, seed, stops).output_ids  # type: ignore[attr-defined, no-any-return]
    else:
        def generate(ids: Sequence[int], params: SamplingParams, seed: int, stops: frozenset[int]) -> Sequence[int]:
            return engine.generate_with_vllm_rule(ids, params, seed, stops)  # type: ignore[attr-defined, no-any-return]
    service = StockService(files, ModelTokenizer(files.path, spec.chat), generate, engine.info)
    return service, profile_path, profile


def load_executer(settings: ExecuterSettings) -> tuple[ExecuterService | StockService, Path, ModelProfile | None]:
    """Return a ready executer service with its profile (a stock-sampler model's is a StockService; an MoE model
    without a dense stage-2 profile has none: it serves, but not as a verification instance)."""
    spec = get_model_spec(settings.model)
    if spec.sampler != "canonical":  # its operators run the stock engine's own sampler (docs/protocol.md §13)
        return load_stock_executer(settings)
    resolve_dtype(spec, settings.dtype)  # before minutes of conversion and loading
    if spec.is_moe and settings.backend != "transformers":  # the trace needs the per-expert tensors (docs/moe.md)
        raise FatalError(f"{spec.name} is an MoE model: its executer records the experts on the transformers "
                         "backend only", Reason.UNKNOWN_MODEL)
    files = materialise_model(spec, settings.cache_dir)
    profile_path, profile = REPO_ROOT / spec.profile, None
    if not spec.is_moe or profile_path.exists():
        profile_path, profile = load_profile(spec)
    tokenizer = ModelTokenizer(files.path, spec.chat)
    recorder = None
    if settings.workload_record is not None:  # background mode: the serving thread only enqueues (≈0.1 ms)
        from node.workload.recorder import open_executer_recorder  # graphs exported in a niced child process

        recorder = open_executer_recorder(settings.workload_record, files, resolve_dtype(spec, settings.dtype),
                                          settings.device)
    engine = load_engine(files, settings)
    moe = None
    if spec.is_moe:
        from node.executer.moe import MoeRecorder

        moe = MoeRecorder(engine.model)  # type: ignore[attr-defined]  # the transformers engine's model
    thresholds = None if profile is None else profile.fingerprint_thresholds()
    service = ExecuterService(files, tokenizer, engine, thresholds, recorder=recorder, moe=moe)
    return service, profile_path, profile

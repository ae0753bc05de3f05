"""Queries, joins, filters, trace order against graph dependencies, and what is missing."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from node.workload.bind import compute_binding, compute_order_violations
from node.workload.model import Device, Graph, Link, Trace, TraceEvent
from node.workload.query import compute_missing, get_events, get_tensors, get_traces
from node.workload.store import WorkloadRecord


def _trace(trace_id: str, graph_id: str, mul_start: int) -> Trace:
    return Trace(trace_id, graph_id, "inference", (
        TraceEvent("add", "op", "add", "h0", 0, 100, ("op0",)),
        TraceEvent("mul", "kernel", "mul", "h0/gpu0", mul_start, mul_start + 50, ("op1",)),
    ))


def test_order_violations(add_graph: Graph) -> None:
    assert compute_order_violations(add_graph, _trace("ok", add_graph.graph_id, 100)) == []
    assert compute_order_violations(add_graph, _trace("bad", add_graph.graph_id, 40)) == [("mul", "add")]


def test_filters_joins_and_missing(tmp_path: Path, add_graph: Graph, devices: tuple[list[Device], list[Link]]) -> None:
    with WorkloadRecord.open(tmp_path / "rec") as rec:
        for d in devices[0]:
            rec.put_device(d)
        gid = rec.put_graph(add_graph)
        rec.put_trace(_trace("t1", gid, 100))
        rec.put_trace(Trace("t2", gid, "training", (TraceEvent("s", "step", "s", "h1", 5_000, 6_000),)))
        assert [t.trace_id for t in get_traces(rec, graph_id=gid)] == ["t1", "t2"]
        assert [t.trace_id for t in get_traces(rec, workload="training")] == ["t2"]
        assert [t.trace_id for t in get_traces(rec, device_ids={"h0/gpu0"})] == ["t1"]
        assert [t.trace_id for t in get_traces(rec, start_ns=1_000)] == ["t2"]
        assert [e.event_id for e in get_events(rec.get_trace("t1"), kinds={"kernel"})] == ["mul"]
        x = rec.put_tensor(np.ones((2, 3), np.float32), role="input", name="x", trace_id="t1", event_id="add")
        y = rec.put_tensor(np.full((2, 3), 2.0, np.float32), role="output", name="y", trace_id="t1", event_id="mul")
        assert get_tensors(rec, trace_id="t1", role="output") == [y]
        missing = compute_missing(rec, gid, "exact")
        assert missing.graph_recorded and missing.best_binding is None and not missing.is_verifiable
        rec.put_binding(compute_binding(add_graph, {"x": x, "y": y}, "partial"))
        missing = compute_missing(rec, gid, "exact")
        assert missing.best_binding == "partial" and missing.missing_inputs == ("w",)
        assert not compute_missing(rec, "f" * 64).graph_recorded


def test_a_collective_may_start_early_but_not_end_early(add_graph: Graph) -> None:
    def trace(end: int) -> Trace:
        return Trace("c", add_graph.graph_id, "training", (
            TraceEvent("add", "op", "add", "h0", 0, 100, ("op0",)),
            TraceEvent("ar", "collective", "all_reduce", "h1", 50, end, ("op1",))))

    assert compute_order_violations(add_graph, trace(150)) == []
    assert compute_order_violations(add_graph, trace(90)) == [("ar", "add")]

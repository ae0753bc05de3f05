"""The pure data model: validation, canonical ids, distribution changes the id."""

from __future__ import annotations

import dataclasses

import pytest

from node.workload.errors import InvalidObject, UnknownObject
from node.workload.model import (
    Collective,
    Distribution,
    Graph,
    OpInfo,
    Sharding,
    Trace,
    TraceEvent,
    compute_tensor_digest,
    graph_from_json,
    to_json,
    trace_from_json,
    verify_trace_refs,
)


def test_graph_id_is_stable_and_ignores_names(add_graph: Graph) -> None:
    again = dataclasses.replace(add_graph, name="renamed", attrs=(("note", "x"),), graph_id="")
    assert again.graph_id == add_graph.graph_id
    assert graph_from_json(to_json(add_graph)).graph_id == add_graph.graph_id
    changed = dataclasses.replace(add_graph, mlir=add_graph.mlir.replace("multiply", "subtract"), graph_id="")
    assert changed.graph_id != add_graph.graph_id


def test_a_claimed_graph_id_must_match_the_content(add_graph: Graph) -> None:
    with pytest.raises(InvalidObject, match="does not match"):
        dataclasses.replace(add_graph, graph_id="0" * 64)


def _distributed(add_graph: Graph, dim: int | None, groups: tuple[tuple[int, ...], ...]) -> Graph:
    dist = Distribution(device_ids=("h0", "h1"), replication=2,
                        shardings=(Sharding("x", dim, 2 if dim is not None else 1, ("h0", "h1")),),
                        collectives=(Collective("op1", "all_reduce", "y", groups),))
    return Graph("distributed", "dp", add_graph.mlir, add_graph.inputs, add_graph.outputs, add_graph.ops,
                 parent_id=add_graph.graph_id, distribution=dist)


def test_distribution_choices_change_the_id(add_graph: Graph) -> None:
    a = _distributed(add_graph, 0, ((0, 1),))
    assert _distributed(add_graph, 0, ((0, 1),)).graph_id == a.graph_id
    assert _distributed(add_graph, 1, ((0, 1),)).graph_id != a.graph_id
    assert _distributed(add_graph, 0, ((0,), (1,))).graph_id != a.graph_id
    assert a.graph_id != add_graph.graph_id
    assert graph_from_json(to_json(a)) == a


def test_collective_must_name_an_op(add_graph: Graph) -> None:
    dist = Distribution(("h0",), collectives=(Collective("op9", "all_reduce", "y", ((0,),)),))
    with pytest.raises(UnknownObject, match="op9"):
        Graph("distributed", "dp", add_graph.mlir, add_graph.inputs, add_graph.outputs, add_graph.ops,
              parent_id=add_graph.graph_id, distribution=dist)


def test_graph_rules(add_graph: Graph) -> None:
    with pytest.raises(InvalidObject):
        dataclasses.replace(add_graph, kind="verification", graph_id="")  # no parent
    with pytest.raises(InvalidObject, match="duplicate"):
        dataclasses.replace(add_graph, ops=(OpInfo("a", "x", (), ()), OpInfo("a", "y", (), ())), graph_id="")


def test_event_and_trace_validation() -> None:
    with pytest.raises(InvalidObject, match="kind"):
        TraceEvent("e", "dance", "n", "h0", 0, 1)
    with pytest.raises(InvalidObject, match="start"):
        TraceEvent("e", "op", "n", "h0", 5, 1)
    e = TraceEvent("e", "op", "n", "h0", 0, 1, op_ids=("op0",))
    with pytest.raises(InvalidObject, match="duplicate"):
        Trace("t", "g", "inference", (e, e))
    with pytest.raises(InvalidObject, match="workload"):
        Trace("t", "g", "mining", (e,))
    trace = Trace("t", "g", "inference", (e,))
    assert trace_from_json(to_json(trace)) == trace
    verify_trace_refs(trace, {"h0"}, {"op0"})
    with pytest.raises(UnknownObject, match="device"):
        verify_trace_refs(trace, {"h1"}, None)
    with pytest.raises(UnknownObject, match="op0"):
        verify_trace_refs(trace, {"h0"}, {"op1"})


def test_tensor_digest_covers_dtype_shape_and_bytes() -> None:
    d = compute_tensor_digest("float32", (2, 2), bytes(16))
    assert d != compute_tensor_digest("int32", (2, 2), bytes(16))
    assert d != compute_tensor_digest("float32", (4,), bytes(16))
    assert d != compute_tensor_digest("float32", (2, 2), bytes(15) + b"\1")

"""Shared fixtures: a tiny hand-written graph and a small device registry."""

from __future__ import annotations

import pytest

from node.workload.graph import build_graph
from node.workload.model import Device, Graph, Link

ADD_MLIR = """module {
  func.func @main(%arg0: tensor<2x3xf32>, %arg1: tensor<2x3xf32>) -> tensor<2x3xf32> {
    %0 = stablehlo.add %arg0, %arg1 : tensor<2x3xf32>
    %1 = stablehlo.multiply %0, %arg1 : tensor<2x3xf32>
    return %1 : tensor<2x3xf32>
  }
}
"""


@pytest.fixture
def add_graph() -> Graph:
    graph = build_graph(ADD_MLIR, kind="logical", name="add-mul", input_names=["x", "w"],
                        input_roles=["input", "weight"], output_names=["y"])
    assert [(op.op_id, op.name) for op in graph.ops] == [("op0", "stablehlo.add"), ("op1", "stablehlo.multiply")]
    return graph


@pytest.fixture
def devices() -> tuple[list[Device], list[Link]]:
    devs = [Device("h0", "h0", "cpu", 2**34), Device("h0/gpu0", "h0", "gpu", 2**33, 1e14),
            Device("h1", "h1", "cpu", 2**34)]
    return devs, [Link("h0", "h0/gpu0", 1000, 32e9), Link("h0", "h1", 3000, 12.5e9)]

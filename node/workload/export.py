"""Export torch computations to StableHLO graphs with every parameter as a graph *input*.

torch-mlir's FX importer bakes module parameters into ``dense_resource`` constants. To let data bind
to edges, the module is called through ``torch.func.functional_call`` from a wrapper whose
positional arguments are the parameters (and buffers) followed by the real inputs; the wrapper has
no parameters of its own, so the exported ``@main`` takes every weight as an argument.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.func import functional_call
from torch_mlir import fx

from node.workload.errors import InvalidObject
from node.workload.graph import build_graph
from node.workload.model import Graph

log = logging.getLogger(__name__)

Run = Callable[..., Any]
Call = Callable[[Run, dict[str, torch.Tensor]], Any]


@dataclass(frozen=True, eq=False)
class Exported:
    """A graph and the tensors that were bound to its inputs when it was exported."""

    graph: Graph
    values: dict[str, torch.Tensor]  # input name → the tensor used at export (weights and example inputs)


class _Functional(torch.nn.Module):
    """A parameter-free wrapper: positional args = the module's parameters/buffers, then the inputs."""

    def __init__(self, module: torch.nn.Module, state_names: list[str], input_names: list[str], call: Call) -> None:
        super().__init__()
        self.inner = [module]  # a list, so the module's parameters are not registered here
        self.state_names, self.input_names, self.call = state_names, input_names, call

    def forward(self, *args: torch.Tensor) -> Any:
        n = len(self.state_names)
        state = dict(zip(self.state_names, args[:n], strict=True))
        inputs = dict(zip(self.input_names, args[n:], strict=True))

        def run(*a: Any, **kw: Any) -> Any:
            return functional_call(self.inner[0], state, a, kw)

        out = self.call(run, inputs)
        return tuple(out) if isinstance(out, (list, tuple)) else out


def get_module_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Return the module's parameters and buffers by name (detached)."""
    state = {n: p.detach() for n, p in module.named_parameters()}
    state.update({n: b.detach() for n, b in module.named_buffers()})
    return state


def export_module(module: torch.nn.Module, inputs: dict[str, torch.Tensor], call: Call, *, name: str,
                  output_names: Sequence[str], input_roles: dict[str, str] | None = None, kind: str = "logical",
                  parent_id: str | None = None, attrs: tuple[tuple[str, str], ...] = ()) -> Exported:
    """Export call(run, inputs) (run = the module with lifted weights) as a StableHLO graph."""
    state = get_module_state(module)
    roles = {n: ("weight" if n in dict(module.named_parameters()) else "state") for n in state}
    roles.update({n: (input_roles or {}).get(n, "input") for n in inputs})
    if set(state) & set(inputs):
        raise InvalidObject(f"input names collide with parameter names: {sorted(set(state) & set(inputs))}", obj=name)
    wrapper = _Functional(module, list(state), list(inputs), call).eval()
    args = [*state.values(), *inputs.values()]
    with torch.no_grad():
        mlir_module = fx.export_and_import(wrapper, *args, output_type="stablehlo")
    text = str(mlir_module)
    if "dense_resource" in text:
        raise InvalidObject("a tensor was baked into the graph as a constant; pass it as an input", obj=name)
    names = [*state, *inputs]
    graph = build_graph(text, kind=kind, name=name, input_names=names, input_roles=[roles[n] for n in names],
                        output_names=list(output_names), parent_id=parent_id, attrs=attrs)
    log.info("exported graph", extra={"graph": name, "graph_id": graph.graph_id, "ops": len(graph.ops)})
    return Exported(graph, {**state, **inputs})


def export_function(fn: Callable[..., Any], inputs: dict[str, torch.Tensor], *, name: str,
                    output_names: Sequence[str], input_roles: dict[str, str] | None = None,
                    kind: str = "logical", parent_id: str | None = None) -> Exported:
    """Export a pure tensor function fn(**inputs) (no parameters of its own) as a StableHLO graph."""
    return export_module(torch.nn.Module(), inputs, lambda _run, x: fn(**x), name=name, output_names=output_names,
                         input_roles=input_roles, kind=kind, parent_id=parent_id)

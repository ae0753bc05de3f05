"""Replay a bound graph on IREE (StableHLO → llvm-cpu) and compare with the claimed outputs.

Compiled modules are cached in the record by graph id and target (compilation is the slow part).
``replay_*`` measures (frozen numbers per output); ``is_replay_match`` decides with per-dtype
tolerances, so thresholds stay separate from measurement.
"""

from __future__ import annotations

import importlib.metadata
import logging
import platform
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import iree.compiler as ireec
import iree.runtime as ireert
import numpy as np

from node.workload.bind import Binding, compute_binding_report
from node.workload.errors import UnknownObject, WorkloadError
from node.workload.model import Graph
from node.workload.store import WorkloadRecord, get_numpy_dtype

log = logging.getLogger(__name__)

TARGET = f"llvm-cpu-host-{platform.machine()}-iree{importlib.metadata.version('iree-base-compiler')}"
# (absolute, relative) tolerance per dtype; integers and bools must match exactly
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-9, 1e-9), "float32": (1e-4, 1e-4), "float16": (1e-2, 1e-2), "bfloat16": (5e-2, 5e-2)}


class ReplayFailed(WorkloadError):
    """IREE could not compile or run the graph."""


def compile_graph(graph: Graph, extra_args: Sequence[str] = ()) -> bytes:
    """Compile a graph's StableHLO for the host CPU with IREE."""
    try:
        vmfb = ireec.compile_str(graph.mlir, target_backends=["llvm-cpu"], input_type="stablehlo",
                                 extra_args=["--iree-llvmcpu-target-cpu=host", *extra_args])
    except ireec.CompilerToolError as exc:
        raise ReplayFailed(f"IREE compile failed: {str(exc)[:400]}", obj=graph.graph_id) from exc
    return bytes(vmfb)


def get_compiled(graph: Graph, record: WorkloadRecord | None,
                 extra_args: Sequence[str] = ()) -> tuple[bytes, bool]:
    """Return (module, was cached), compiling and caching in the record when needed."""
    target = TARGET + "".join(extra_args)
    if record is not None:
        cached = record.get_compiled(graph.graph_id, target)
        if cached is not None:
            return cached, True
    vmfb = compile_graph(graph, extra_args)
    if record is not None and not record.readonly:
        record.put_compiled(graph.graph_id, target, vmfb)
    return vmfb, False


class CompiledGraph:
    """A loaded IREE module for one graph; call run() repeatedly."""

    def __init__(self, vmfb: bytes) -> None:
        self._ctx = ireert.SystemContext(config=ireert.Config("local-task"))
        self._ctx.add_vm_module(ireert.VmModule.copy_buffer(self._ctx.instance, vmfb))
        self._main = self._ctx.modules.module["main"]

    def upload(self, args: Sequence[np.ndarray[Any, Any]]) -> list[Any]:
        """Return the arguments as device arrays (copy once, e.g. the weights, then run many times)."""
        return [ireert.asdevicearray(self._ctx.config.device, a) for a in args]

    def run(self, args: Sequence[Any]) -> list[np.ndarray[Any, Any]]:
        """Run main on numpy (or uploaded device) arguments and return numpy results."""
        out = self._main(*args)
        results = out if isinstance(out, (list, tuple)) else [out]
        return [np.asarray(r.to_host()) if hasattr(r, "to_host") else np.asarray(r) for r in results]


@dataclass(frozen=True)
class OutputComparison:
    """How far one replayed output is from the claimed one."""

    name: str
    dtype: str
    size: int
    max_abs_error: float
    max_rel_error: float
    shape_matches: bool


@dataclass(frozen=True)
class ReplayResult:
    """Measurements of one replay."""

    graph_id: str
    cached: bool
    compile_s: float
    run_s: float
    outputs: tuple[OutputComparison, ...]
    unclaimed: tuple[str, ...]  # outputs with no claimed tensor bound (nothing to compare)


def compare_output(name: str, dtype: str, claimed: np.ndarray[Any, Any],
                   replayed: np.ndarray[Any, Any]) -> OutputComparison:
    """Return the absolute and relative error of a replayed output against the claim."""
    if claimed.shape != replayed.shape:
        return OutputComparison(name, dtype, int(claimed.size), float("inf"), float("inf"), False)
    a, b = claimed.astype(np.float64), replayed.astype(np.float64)
    diff = np.abs(a - b)
    rel = diff / np.maximum(np.abs(a), 1e-30)
    return OutputComparison(name, dtype, int(claimed.size), float(diff.max(initial=0.0)),
                            float(np.where(diff == 0, 0.0, rel).max(initial=0.0)), True)


def is_replay_match(result: ReplayResult, tolerances: dict[str, tuple[float, float]] | None = None) -> bool:
    """Decide whether every compared output is within its dtype's tolerance (abs or rel)."""
    tol = tolerances or DEFAULT_TOLERANCES
    for out in result.outputs:
        atol, rtol = tol.get(out.dtype, (0.0, 0.0))
        if not out.shape_matches or (out.max_abs_error > atol and out.max_rel_error > rtol):
            return False
    return bool(result.outputs)


def replay_arrays(graph: Graph, inputs: dict[str, np.ndarray[Any, Any]], claimed: dict[str, np.ndarray[Any, Any]],
                  record: WorkloadRecord | None = None) -> ReplayResult:
    """Compile (or reuse) and run a graph on the given inputs; compare with the claimed outputs."""
    return run_and_compare(graph, inputs, claimed, record)[0]


def run_and_compare(graph: Graph, inputs: dict[str, np.ndarray[Any, Any]], claimed: dict[str, np.ndarray[Any, Any]],
                    record: WorkloadRecord | None = None) -> tuple[ReplayResult, list[np.ndarray[Any, Any]]]:
    """Return the replay's measurements and the replayed outputs themselves."""
    missing = [s.name for s in graph.inputs if s.name not in inputs]
    if missing:
        raise UnknownObject(f"inputs not bound: {missing[:5]}", obj=graph.graph_id)
    t0 = time.perf_counter()
    vmfb, cached = get_compiled(graph, record)
    t1 = time.perf_counter()
    args = [np.asarray(inputs[s.name], dtype=get_numpy_dtype(s.dtype), order="C") for s in graph.inputs]
    outs = CompiledGraph(vmfb).run(args)
    t2 = time.perf_counter()
    comparisons = tuple(compare_output(s.name, s.dtype, claimed[s.name], r)
                        for s, r in zip(graph.outputs, outs, strict=True) if s.name in claimed)
    unclaimed = tuple(s.name for s in graph.outputs if s.name not in claimed)
    return ReplayResult(graph.graph_id, cached, t1 - t0, t2 - t1, comparisons, unclaimed), outs


def replay_binding(record: WorkloadRecord, graph: Graph, binding: Binding) -> ReplayResult:
    """Replay a graph on the tensors of a binding read from the record (each re-verified)."""
    return replay_binding_outputs(record, graph, binding)[0]


def replay_binding_outputs(record: WorkloadRecord, graph: Graph,
                           binding: Binding) -> tuple[ReplayResult, list[np.ndarray[Any, Any]]]:
    """Replay a binding and return the measurements and the replayed outputs."""
    report = compute_binding_report(graph, binding, "exact")
    if not report.is_replayable:
        raise UnknownObject(f"binding lacks inputs: {list(report.missing_inputs)[:5]}", obj=graph.graph_id)
    refs = binding.as_dict()
    inputs = {s.name: record.get_tensor(refs[s.name]) for s in graph.inputs}
    claimed = {s.name: record.get_tensor(refs[s.name]) for s in graph.outputs if s.name in refs}
    result, outs = run_and_compare(graph, inputs, claimed, record)
    log.info("replayed", extra={"graph_id": graph.graph_id, "cached": result.cached, "run_s": result.run_s})
    return result, outs

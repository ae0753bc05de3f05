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
from enum import Enum
from typing import Any

import iree.compiler as ireec
import iree.runtime as ireert
import numpy as np

from node.workload.bind import Binding, compute_binding_report
from node.workload.errors import UnknownObject, WorkloadError
from node.workload.graph import CUT_PREFIX, compute_ops_upstream, compute_slice, get_parent_edge
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
    """How far one replayed output is from the claimed one (errors over the places both are finite)."""

    name: str
    dtype: str
    size: int
    max_abs_error: float
    max_rel_error: float
    shape_matches: bool
    nonfinite_mismatches: int = 0  # places where either side is NaN/±inf and the other is not the same value
    exact_mismatches: int = 0  # integer/bool outputs: places that differ (compared exactly, not in float64)


@dataclass(frozen=True)
class ReplayResult:
    """Measurements of one replay."""

    graph_id: str
    cached: bool
    compile_s: float
    run_s: float
    outputs: tuple[OutputComparison, ...]
    unclaimed: tuple[str, ...]  # outputs with no claimed tensor bound (nothing to compare)


class ReplayMismatch(Enum):
    """Why a replay does not match its claim (OK when it does)."""

    OK = "ok"
    NO_OUTPUTS = "no claimed output to compare"
    SHAPE = "shape differs"
    NON_FINITE = "NaN or inf where the other side has another value"
    NOT_EXACT = "integer values differ"
    OUT_OF_TOLERANCE = "outside the dtype's tolerance"


@dataclass(frozen=True)
class ReplayDecision:
    """The decision on one replay: the first failing output and why."""

    reason: ReplayMismatch
    output: str = ""

    @property
    def match(self) -> bool:
        """True when every compared output is within tolerance."""
        return self.reason is ReplayMismatch.OK


def compare_output(name: str, dtype: str, claimed: np.ndarray[Any, Any],
                   replayed: np.ndarray[Any, Any]) -> OutputComparison:
    """Return the errors of a replayed output against the claim; NaN/inf only match the same value in place."""
    if claimed.shape != replayed.shape:
        return OutputComparison(name, dtype, int(claimed.size), float("inf"), float("inf"), False)
    exact = 0
    if claimed.dtype.kind in "iub" and replayed.dtype.kind in "iub":
        exact = int(np.count_nonzero(claimed != replayed))
    a, b = claimed.astype(np.float64), replayed.astype(np.float64)
    finite = np.isfinite(a) & np.isfinite(b)
    same_nonfinite = ~finite & ((np.isnan(a) & np.isnan(b)) | (a == b))  # NaN↔NaN, +inf↔+inf, -inf↔-inf
    nonfinite = int(np.count_nonzero(~finite & ~same_nonfinite))
    with np.errstate(over="ignore", invalid="ignore"):
        diff = np.where(finite, np.abs(a - b), 0.0)  # two huge finite values may differ by inf: a mismatch
        rel = np.where(diff == 0, 0.0, diff / np.maximum(np.abs(a), 1e-30))
    max_abs = float(diff.max(initial=0.0))
    if exact and max_abs == 0.0:
        max_abs = float("inf")  # integers beyond float64's 2^53 that differ: never within a tolerance
    return OutputComparison(name, dtype, int(claimed.size), max_abs, float(rel.max(initial=0.0)), True,
                            nonfinite, exact)


def decide_replay(result: ReplayResult, tolerances: dict[str, tuple[float, float]] | None = None) -> ReplayDecision:
    """Decide a replay: every output the right shape, its non-finite places equal, within (abs or rel) tolerance."""
    tol = tolerances or DEFAULT_TOLERANCES
    if not result.outputs:
        return ReplayDecision(ReplayMismatch.NO_OUTPUTS)
    for out in result.outputs:
        atol, rtol = tol.get(out.dtype, (0.0, 0.0))
        if not out.shape_matches:
            return ReplayDecision(ReplayMismatch.SHAPE, out.name)
        if out.nonfinite_mismatches:
            return ReplayDecision(ReplayMismatch.NON_FINITE, out.name)
        if out.exact_mismatches:
            return ReplayDecision(ReplayMismatch.NOT_EXACT, out.name)
        if not (out.max_abs_error <= atol or out.max_rel_error <= rtol):  # NaN-safe: a NaN error never passes
            return ReplayDecision(ReplayMismatch.OUT_OF_TOLERANCE, out.name)
    return ReplayDecision(ReplayMismatch.OK)


def is_replay_match(result: ReplayResult, tolerances: dict[str, tuple[float, float]] | None = None) -> bool:
    """Decide whether every compared output is within its dtype's tolerance (see decide_replay)."""
    return decide_replay(result, tolerances).match


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


def compute_cut_graph(parent: Graph, piece: Graph) -> tuple[Graph, list[str]]:
    """Return the parent's upstream slice that computes a slice's cut edges, and those edges (parent SSA names)."""
    cuts = [get_parent_edge(s.name) for s in piece.inputs if s.name.startswith(CUT_PREFIX)]
    if not cuts:
        raise UnknownObject("the slice has no cut edge", obj=piece.graph_id)
    producer = {v: op.op_id for op in parent.ops for v in op.results}
    missing = [v for v in cuts if v not in producer]
    if missing:
        raise UnknownObject(f"cut edges not computed by the parent: {missing[:5]}", obj=parent.graph_id)
    ops = compute_ops_upstream(parent, [producer[v] for v in cuts])
    return compute_slice(parent, ops, cuts, name=f"{parent.name}[cuts of {piece.graph_id[:12]}]"), cuts


def compute_cut_values(parent: Graph, piece: Graph, inputs: dict[str, np.ndarray[Any, Any]],
                       record: WorkloadRecord | None = None) -> dict[str, np.ndarray[Any, Any]]:
    """Return a slice's cut-edge values (by parent SSA name) replayed with IREE from the parent's inputs."""
    upstream, cuts = compute_cut_graph(parent, piece)
    if record is not None and not record.readonly:
        record.put_graph(upstream)  # (its compiled module is cached by graph id)
    _, outs = run_and_compare(upstream, {s.name: inputs[s.name] for s in upstream.inputs if s.name in inputs}, {},
                              record)
    return dict(zip(cuts, outs, strict=True))

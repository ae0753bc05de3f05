"""`verinfer workload …`: list, show, query, slice, bind, replay and export traces of a workload record.

Every command takes ``--record PATH`` (env VERINFER_WORKLOAD) and ``--json``. Reading commands open
the record read-only (a snapshot: they never take the writer's lock); ``slice``, ``bind`` and
``replay`` (which caches compiled modules) open it for writing. ``replay`` exits 0 when every output
matches within its dtype's tolerance, 1 on a mismatch, 2 when data is unreadable or missing.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.table import Table

from node.errors import VerinferError

console = Console(soft_wrap=True)
workload_app = typer.Typer(help="The workload record: graphs, traces, data and devices.", no_args_is_help=True)
RECORD = typer.Option(Path("workload-record"), "--record", envvar="VERINFER_WORKLOAD", help="Record directory.")
JSON = typer.Option(False, "--json", help="Machine-readable output.")
EXPECT_ROOT = typer.Option(None, "--expect-root", envvar="VERINFER_WORKLOAD_ROOT",
                           help="Refuse the record unless its Merkle root is this (hex; the root the prover signed).")


def emit(data: Any, as_json: bool, title: str = "") -> None:
    """Print data as JSON or as a rich table / key-value listing."""
    if as_json:
        console.print_json(json.dumps(data, default=str))
        return
    if isinstance(data, dict):
        table = Table(title=title or None, show_header=False)
        for key, value in data.items():
            table.add_row(str(key), _short(value))
        console.print(table)
        return
    rows = data
    if not rows:
        console.print(f"{title}: none")
        return
    table = Table(title=title or None)
    for key in rows[0]:
        table.add_column(str(key))
    for row in rows:
        table.add_row(*[_short(v) for v in row.values()])
    console.print(table)


def _short(value: Any) -> str:
    text = json.dumps(value, default=str) if isinstance(value, (list, dict, tuple)) else str(value)
    return text if len(text) <= 80 else text[:77] + "..."


def fail(message: str, code: int) -> NoReturn:
    """Print an error and exit with a code."""
    console.print(f"[red]{message}[/red]")
    raise typer.Exit(code)


def typed_errors(command: Callable[..., None]) -> Callable[..., None]:
    """Turn a verinfer error inside a command into a message and exit code 2 (unreadable / missing)."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        try:
            command(*args, **kwargs)
        except VerinferError as exc:
            fail(str(exc), 2)

    return wrapper


@workload_app.command("ls")
@typed_errors
def ls_command(record: Path = RECORD, as_json: bool = JSON, expect_root: str = EXPECT_ROOT) -> None:
    """List graphs, traces, devices and tensor counts."""
    from node.workload.query import get_graph_summaries

    with _readonly(record, expect_root) as rec:
        data = {"graphs": get_graph_summaries(rec),
                "traces": [{"trace_id": t.trace_id, "workload": t.workload, "graph_id": t.graph_id,
                            "events": len(t.events)} for t in rec.traces()],
                "devices": [{"device_id": d.device_id, "host": d.host, "kind": d.kind} for d in rec.devices()],
                "tensors": len(rec.tensor_refs())}
    if as_json:
        emit(data, True)
        return
    emit(data["graphs"], False, "graphs")
    emit(data["traces"], False, "traces")
    emit(data["devices"], False, "devices")
    console.print(f"tensors: {data['tensors']}")


@workload_app.command("show")
@typed_errors
def show_command(object_id: str, record: Path = RECORD, as_json: bool = JSON, expect_root: str = EXPECT_ROOT) -> None:
    """Show a graph (id), a trace (id) or a tensor (sha256)."""
    from node.workload.model import to_json

    with _readonly(record, expect_root) as rec:
        data = _find(rec, object_id)
        if data is None:
            fail(f"nothing named {object_id} in the record", 2)
        if as_json or not isinstance(data.get("ops"), list):
            emit(data if as_json else {k: v for k, v in data.items() if k != "mlir"}, as_json)
            return
        graph = rec.get_graph(object_id)
        console.print(f"{graph.kind} graph {graph.graph_id} '{graph.name}' parent={graph.parent_id}")
        emit([to_json(s) for s in graph.inputs], False, "inputs")
        emit([to_json(s) for s in graph.outputs], False, "outputs")
        emit([{"op_id": o.op_id, "name": o.name, "operands": list(o.operands), "results": list(o.results),
               "types": list(o.result_types)} for o in graph.ops[:40]], False, f"ops (first 40 of {len(graph.ops)})")
        if graph.distribution is not None:
            emit(to_json(graph.distribution), False, "distribution")


def _find(rec: Any, object_id: str) -> dict[str, Any] | None:
    from node.workload.errors import UnknownObject
    from node.workload.model import to_json

    for getter in (rec.get_graph, rec.get_trace):
        try:
            found: dict[str, Any] = to_json(getter(object_id))
            return found
        except UnknownObject:
            continue
    refs = [to_json(r) for r in rec.tensor_refs() if r.sha256 == object_id]
    if refs:
        array = rec.get_tensor(object_id)
        stats = {"min": float(array.min()), "max": float(array.max())} if array.size and array.dtype.kind in "fiub" \
            else {}
        return {"sha256": object_id, "refs": refs, **stats}
    return None


@workload_app.command("query")
@typed_errors
def query_command(record: Path = RECORD, as_json: bool = JSON,
                  graph: str = typer.Option(None, help="Traces of this graph / missing data for it."),
                  kind: str = typer.Option(None, help="Graph kind: logical|distributed|verification."),
                  workload: str = typer.Option(None, help="inference|training|spotcheck."),
                  device: list[str] = typer.Option(None, help="Only traces with events on these devices."),
                  start_ns: int = typer.Option(None), end_ns: int = typer.Option(None),
                  trace: str = typer.Option(None, help="Tensors of this trace."),
                  role: str = typer.Option(None, help="Tensor role filter."),
                  missing: bool = typer.Option(False, help="What is missing to verify --graph (or --trace's graph)."),
                  check: bool = typer.Option(False, help="Re-hash --trace's tensors, check its event order."),
                  mode: str = typer.Option("exact", help="Binding mode for --missing."),
                  expect_root: str = EXPECT_ROOT) -> None:
    """Query graphs, traces, tensors, joins between them, and what is missing to verify a graph."""
    from node.workload.model import to_json
    from node.workload.query import (
        compute_missing,
        get_graph_summaries,
        get_logical_graph_id,
        get_tensors,
        get_traces,
        verify_trace,
    )

    with _readonly(record, expect_root) as rec:
        if check:
            if not trace:
                fail("--check needs --trace", 2)
            result = verify_trace(rec, trace)
            emit({**dataclasses.asdict(result), "consistent": result.is_consistent}, as_json)
            if not result.is_consistent:
                raise typer.Exit(1)
        elif missing:
            if not graph and not trace:
                fail("--missing needs --graph or --trace", 2)
            report = compute_missing(rec, graph or rec.get_trace(trace).graph_id, mode)
            emit({**dataclasses.asdict(report), "verifiable": report.is_verifiable}, as_json)
        elif trace or role:
            emit([to_json(r) for r in get_tensors(rec, trace_id=trace, role=role)], as_json, "tensors")
        elif graph or workload or device or start_ns is not None or end_ns is not None:
            traces = get_traces(rec, graph_id=graph, workload=workload, device_ids=set(device) if device else None,
                                start_ns=start_ns, end_ns=end_ns)
            data: dict[str, Any] = {"traces": [t.trace_id for t in traces]}
            if graph:
                data["logical_graph"] = get_logical_graph_id(rec, graph)
                data["derived_graphs"] = [s["graph_id"] for s in get_graph_summaries(rec, parent_id=graph)]
            emit(data, as_json)
        else:
            emit(get_graph_summaries(rec, kind=kind), as_json, "graphs")


@workload_app.command("slice")
@typed_errors
def slice_command(graph: str, record: Path = RECORD, as_json: bool = JSON,
                  from_ops: str = typer.Option("", "--from", help="Comma-separated op ids where the slice starts."),
                  to_ops: str = typer.Option("", "--to", help="Comma-separated op ids where the slice ends."),
                  outputs: str = typer.Option("", help="Comma-separated SSA values to return (default: last op's)."),
                  cut: str = typer.Option("", help="With --to: comma-separated SSA values to cut at (inputs)."),
                  layer: int = typer.Option(None, help="Decoder layer N of a Llama-style graph (instead of --to).")
                  ) -> None:
    """Cut the subgraph between two op sets (or everything upstream of --to, or a decoder layer) and record it.

    Cut edges become inputs named ``cut:<parent SSA name>``; outputs that the parent does not return
    are named ``out:<parent SSA name>``; constant sub-graphs are carried into the slice.
    """
    from node.workload.graph import (
        compute_decoder_layer_slice,
        compute_ops_between,
        compute_ops_upstream,
        compute_slice,
    )

    with _writable(record) as rec:
        source = rec.get_graph(graph)
        ends = _split(to_ops)
        if layer is not None:
            if ends or from_ops or cut:
                fail("--layer replaces --from/--to/--cut", 2)
            piece = compute_decoder_layer_slice(source, layer)
        else:
            if not ends:
                fail("give --to (or --layer)", 2)
            ops = compute_ops_between(source, _split(from_ops), ends) if from_ops else \
                compute_ops_upstream(source, ends, _split(cut))
            piece = compute_slice(source, ops, _split(outputs) or None)
        rec.put_graph(piece)
        emit({"graph_id": piece.graph_id, "ops": len(piece.ops), "inputs": [s.name for s in piece.inputs],
              "outputs": [s.name for s in piece.outputs]}, as_json)


@workload_app.command("bind")
@typed_errors
def bind_command(graph: str, trace: str = typer.Option(..., help="Bind the tensors this trace recorded."),
                 record: Path = RECORD, as_json: bool = JSON, name: str = typer.Option("recorded"),
                 mode: str = typer.Option("exact", help="blackbox|exact|full (for the report)."),
                 device: str = typer.Option("", help="Bind the tensors recorded as <device>/<edge> (a replica's)."),
                 derive_cuts: bool = typer.Option(False, help="A slice's cut edges the trace did not record: replay "
                                                  "the parent upstream of them (IREE) on the trace's inputs.")
                 ) -> None:
    """Bind a graph's edges to the tensors a trace recorded under their names; report what is missing.

    A slice's ``cut:%N`` / ``out:%N`` edges bind to tensors recorded under the parent's ``%N``.
    """
    from node.workload.bind import compute_binding_from_trace, compute_binding_report

    with _writable(record) as rec:
        g = rec.get_graph(graph)
        t = rec.get_trace(trace)
        prefix = f"{device}/" if device else ""
        binding = compute_binding_from_trace(g, rec.tensor_refs_of_trace(t.trace_id), t, name, prefix)
        if derive_cuts:
            binding = _derive_cuts(rec, g, t, binding, name, prefix)
        rec.put_binding(binding)
        report = compute_binding_report(g, binding, mode)
        emit({**dataclasses.asdict(report), "complete": report.is_complete, "replayable": report.is_replayable},
             as_json)


@workload_app.command("replay")
@typed_errors
def replay_command(graph: str, binding: str = typer.Option("recorded", help="Binding name."),
                   record: Path = RECORD, as_json: bool = JSON) -> None:
    """Compile (cached) and run a bound graph with IREE; exit 0 match, 1 mismatch, 2 unreadable/missing.

    A binding without any claimed output has nothing to compare: exit 2 (missing data).
    """
    from node.workload.errors import UnknownObject, WorkloadError
    from node.workload.replay import ReplayResult, decide_replay, replay_binding

    result: ReplayResult

    try:
        with _writable(record) as rec:
            g = rec.get_graph(graph)
            result = replay_binding(rec, g, rec.get_binding(graph, binding))
    except (UnknownObject, WorkloadError, VerinferError) as exc:
        fail(f"cannot replay: {exc}", 2)
    decision = decide_replay(result)
    emit({**dataclasses.asdict(result), "match": decision.match, "reason": decision.reason.name,
          "failing_output": decision.output}, as_json)
    if not result.outputs:
        fail(f"no claimed output bound to compare with (unclaimed: {list(result.unclaimed)})", 2)
    if not decision.match and not as_json:
        console.print(f"mismatch: {decision.output}: {decision.reason.value}")
    raise typer.Exit(0 if decision.match else 1)


@workload_app.command("check-inference")
@typed_errors
def check_inference_command(trace: str, model: str = typer.Option(..., help="The claimed model (registry name)."),
                            record: Path = typer.Option(None, "--record", help="The prover's record folder."),
                            url: str = typer.Option(None, help="Or the executer's base URL (its /v1/workload API)."),
                            key: str = typer.Option(None, envvar="VERINFER_WORKLOAD_KEY", help="API key for --url."),
                            cache: Path = typer.Option(Path("workload-verifier"), help="The verifier's own record "
                                                       "(its graph exports and compiled modules)."),
                            root: str = typer.Option(None, help="The committed artifact root (hex) to hold it to."),
                            max_logprob_error: float = typer.Option(7e-4, help="Calibrated on SmolLM2: 10 × the "
                                                                    "largest honest error (docs/workload.md)."),
                            min_top_k_agreement: float = typer.Option(1.0), as_json: bool = JSON) -> None:
    """Stage 2 from the record: replay a recorded inference with IREE on this verifier's own weights and graphs.

    Exit 0 when it is within the tolerance, 1 when it is not (the reason is printed), 2 when the record is
    unreadable or the graph not exported yet.
    """
    from node.checks.stage2_record import Stage2RecordTolerance
    from node.engines.models import get_model_spec, materialise_model
    from node.workload.stage2_replay import HttpRecordReader, RecordReader, RecordVerifier
    from node.workload.store import WorkloadRecord

    if (record is None) == (url is None) or (url is not None and not key):
        fail("give either --record or --url with --key", 2)
    try:
        expected_root = bytes.fromhex(root) if root else None
    except ValueError:
        fail("--root must be hex", 2)
    verifier = RecordVerifier(materialise_model(get_model_spec(model)), cache)
    reader: RecordReader = (WorkloadRecord.open(record, readonly=True) if record is not None
                            else HttpRecordReader(url, key))
    try:
        measurement, decision = verifier.check(reader, trace, Stage2RecordTolerance(max_logprob_error,
                                                                                    min_top_k_agreement),
                                               expected_root)
    finally:
        reader.close()
        verifier.close()
    emit({**measurement.as_dict(), "reason": decision.reason.name, "valid": decision.valid}, as_json)
    raise typer.Exit(0 if decision.valid else 1)


@workload_app.command("export-trace")
@typed_errors
def export_trace_command(trace: str, out: Path = typer.Option(..., help="Chrome trace JSON to write."),
                         record: Path = RECORD, expect_root: str = EXPECT_ROOT) -> None:
    """Write a trace in the Chrome trace-event format (open it in Perfetto or chrome://tracing)."""
    from node.workload.chrome import compute_chrome_trace

    with _readonly(record, expect_root) as rec:
        data = compute_chrome_trace(rec.get_trace(trace), rec.devices())
    out.write_text(json.dumps(data))
    console.print(f"wrote {out} ({len(data['traceEvents'])} events)")


@workload_app.command("import-devices")
@typed_errors
def import_devices_command(topology: Path = typer.Option(..., help="SLURM topology.conf"),
                           gres: Path = typer.Option(..., help="SLURM gres.conf"), record: Path = RECORD) -> None:
    """Register the devices and links of a SLURM-style topology.conf / gres.conf pair."""
    from node.workload.devices import ImportLimits, import_registry
    from node.workload.errors import InvalidImport

    limits = ImportLimits()
    data = {}
    for path in (topology, gres):
        try:
            with path.open("rb") as f:
                data[path] = f.read(limits.max_bytes + 1)  # bounded: a huge file is refused, not read whole
        except OSError as exc:
            raise InvalidImport(f"cannot read ({exc.strerror})", obj=str(path)) from exc
    result = import_registry(data[topology], data[gres], topology_name=str(topology), gres_name=str(gres),
                             limits=limits)
    for line in result.ignored:
        console.print(f"ignored {line}")
    with _writable(record) as rec:
        for d in result.devices:
            rec.put_device(d)
        for link in result.links:
            rec.put_link(link)
    console.print(f"registered {len(result.devices)} devices and {len(result.links)} links")


@workload_app.command("demo")
@typed_errors
def demo_command(record: Path = RECORD, max_tokens: int = typer.Option(8), as_json: bool = JSON) -> None:
    """Record a SmolLM2-135M inference and a tiny training step, then replay slices of both with IREE."""
    from node.workload.demo import run_demo

    report = run_demo(record, max_tokens=max_tokens, say=lambda s: None if as_json else console.print(s))
    emit(dataclasses.asdict(report), as_json)


def _derive_cuts(rec: Any, g: Any, trace: Any, binding: Any, name: str, prefix: str) -> Any:
    """Record the cut edges a binding lacks, replayed from the parent graph on the trace's inputs; re-bind."""
    from node.workload.bind import compute_binding_from_trace
    from node.workload.errors import UnknownObject
    from node.workload.graph import CUT_PREFIX
    from node.workload.replay import compute_cut_values

    if g.parent_id is None or not any(s.name.startswith(CUT_PREFIX) for s in g.inputs):
        raise UnknownObject("--derive-cuts needs a slice with cut edges", obj=g.graph_id)
    bound = binding.as_dict()
    if all(s.name in bound for s in g.inputs):
        return binding
    parent = rec.get_graph(g.parent_id)
    refs = rec.tensor_refs_of_trace(trace.trace_id)
    parent_refs = compute_binding_from_trace(parent, refs, trace, name, prefix).as_dict()
    inputs = {s.name: rec.get_tensor(parent_refs[s.name]) for s in parent.inputs if s.name in parent_refs}
    for edge, value in compute_cut_values(parent, g, inputs, rec).items():
        if f"{CUT_PREFIX}{edge}" not in bound:
            rec.put_tensor(value, role="activation", name=prefix + edge, event_id=f"derived/{g.graph_id[:16]}",
                           trace_id=trace.trace_id)
    return compute_binding_from_trace(g, rec.tensor_refs_of_trace(trace.trace_id), trace, name, prefix)


@workload_app.command("root")
@typed_errors
def root_command(record: Path = RECORD, as_json: bool = JSON, expect_root: str = EXPECT_ROOT) -> None:
    """Print the record's Merkle root (verified against its committed root): what the prover signs and commits."""
    with _readonly(record, expect_root) as rec:
        emit({"root": rec.root_hash.hex(), "entries": rec.leaf_count}, as_json)


def _readonly(record: Path, expect_root: str | None) -> Any:
    from node.workload.store import WorkloadRecord

    try:
        expected = bytes.fromhex(expect_root) if expect_root else None
    except ValueError:
        fail("--expect-root must be hex", 2)
    return WorkloadRecord.open(record, readonly=True, expected_root=expected)


def _writable(record: Path) -> Any:
    from node.workload.store import WorkloadRecord

    return WorkloadRecord.open(record)


def _split(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


@workload_app.callback()
def _main() -> None:
    """The workload record (docs/workload.md)."""


def handle_errors() -> None:
    """Run the sub-app standalone, translating verinfer errors into exit code 2."""
    try:
        workload_app()
    except VerinferError as exc:
        console.print(f"[red]{exc}[/red]")
        raise SystemExit(2) from exc

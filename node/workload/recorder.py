"""Record every inference an executer serves: data, RNG seed, a trace of the steps, and its graphs.

Cheap on the serving path: a handful of small tensors (prompt and output ids, the run seed, the
artifact wire bytes, the fingerprint chunks, each content-addressed) and one trace, written in a
few synced LevelDB batches (or, with ``background=True``, by a writer thread: the serving thread only
enqueues).

Graphs: with a ``GraphSource`` (``node.workload.inference.CausalLmGraphExporter``) every inference
links to its decode graph and its teacher-forced verification graph. The pair is exported once per
``GraphKey`` (model, dtype, length bucket, export config, toolchain) by a separate export thread,
never on the serving path (an export takes seconds to minutes). Until then the trace names the key's
``pending_id``; the record keeps the request (``gwant/``) and, once exported, the resolution
(``gkey/``) plus graph → trace links for the traces recorded meanwhile. A recorder opened on the
same record later re-uses resolved keys and resumes the requests that were never exported. Without
a graph source the trace names ``pending/<model>/<length>`` and a verifier exports from its own copy.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from node.errors import VerinferError
from node.workload.graph_keys import GraphKey, get_legacy_pending_id, graph_key_from_json
from node.workload.model import Device, Trace, TraceEvent
from node.workload.store import WorkloadRecord

if TYPE_CHECKING:
    from node.engines.models import ModelFiles
    from node.executer.service import ServedInference

log = logging.getLogger(__name__)


class GraphSource(Protocol):
    """Names and exports the graphs that verify an inference of a given length."""

    def get_graph_key(self, length: int) -> GraphKey:
        """Return the key of the graphs for `length` fed tokens."""
        ...

    def is_own_key(self, key: dict[str, Any]) -> bool:
        """Check whether a recorded key's JSON is one this source exports."""
        ...

    def export_graphs(self, key: GraphKey, record: WorkloadRecord) -> tuple[str, str]:
        """Export the key's (decode, verification) graphs into the record; return their ids."""
        ...

    def close(self) -> None:
        """Release what exporting holds (a model copy, a child process)."""
        ...


def get_pending_graph_id(model: str, length: int) -> str:
    """Return the placeholder graph id of a verification graph no one here exports."""
    return get_legacy_pending_id(model, length)


def get_trace_id(inference_id: int) -> str:
    """Return the trace id of an inference."""
    return f"inference/{inference_id:#066x}"


class InferenceRecorder:
    """Writes one record per served inference into a WorkloadRecord (the executer's recorder hook).

    With ``background=True`` the serving thread only enqueues the served inference (its data is
    immutable) and one writer thread does the hashing and the fsyncs; ``flush()`` waits for it and
    ``close()`` stops it. Graph exports always run on their own thread (``wait_for_graphs()``).
    ``write_s`` / ``export_s`` accumulate the writer's and the exporter's own time.
    """

    def __init__(self, record: WorkloadRecord, model: str, device: Device, graphs: GraphSource | None = None,
                 background: bool = False) -> None:
        self.record = record
        self.model = model
        self.device = device
        self.graphs = graphs
        self._lock = threading.Lock()  # one writer at a time
        self._link_lock = threading.Lock()  # "is the key resolved?" + put_trace, atomic against a resolution
        self.failures = 0
        self.write_s = 0.0
        self.export_failures = 0
        self.export_s = 0.0
        self.exported: list[str] = []  # pending ids this recorder resolved
        self.exporting: str | None = None  # the pending id being exported now
        record.put_device(device)
        self._queue: queue.Queue[tuple[ServedInference, int, int] | None] | None = None
        self._worker: threading.Thread | None = None
        self._exports: queue.Queue[GraphKey | None] = queue.Queue()
        self._wanted: set[str] = set()
        self._exporter: threading.Thread | None = None
        self._abandon = False
        # an exporter that traces in this process (torch.export patches process-wide module hooks while it
        # traces) must never run beside serving: its exports wait for wait_for_graphs() / close(); one in its
        # own child process (the executer's) runs as soon as a key is wanted
        self._defer_exports = bool(getattr(graphs, "runs_in_process", False))
        if background:
            self._queue = queue.Queue()
            self._worker = threading.Thread(target=self._drain, name="workload-recorder", daemon=True)
            self._worker.start()
        if graphs is not None:
            self._resume_exports(graphs)

    # ---- threads ---------------------------------------------------------------------------------

    def _drain(self) -> None:
        assert self._queue is not None
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                self._record_logged(*item)
            finally:
                self._queue.task_done()

    def _resume_exports(self, graphs: GraphSource) -> None:
        """Queue the requests a previous run recorded and never exported (resolved ones are re-used)."""
        for pending_id, key in self.record.graph_requests():
            if self.record.get_graph_resolution(pending_id) is None and graphs.is_own_key(key):
                self._want(graph_key_from_json(key))

    def _want(self, key: GraphKey) -> None:
        with self._link_lock:
            if key.pending_id in self._wanted:
                return
            self._wanted.add(key.pending_id)
        self._exports.put(key)
        if not self._defer_exports:
            self._start_exporter()

    def _start_exporter(self) -> None:
        """Start the export thread (once)."""
        if self._exporter is None:
            self._exporter = threading.Thread(target=self._export_loop, name="workload-graph-export", daemon=True)
            self._exporter.start()

    def _export_loop(self) -> None:
        while True:
            key = self._exports.get()
            try:
                if key is None:
                    return
                self._export_logged(key)
            finally:
                self._exports.task_done()

    def _export_logged(self, key: GraphKey) -> None:
        assert self.graphs is not None
        if self._abandon:
            return
        t0 = time.perf_counter()
        self.exporting = key.pending_id
        try:
            if self.record.get_graph_resolution(key.pending_id) is not None:
                return
            decode_id, verification_id = self.graphs.export_graphs(key, self.record)
            with self._link_lock:
                self.record.resolve_graph_request(key.pending_id, decode_id, verification_id)
            self.exported.append(key.pending_id)
        except Exception as exc:  # a worker boundary: torch export raises many types; the request stays for a restart
            self.export_failures += 1
            log.error("exporting inference graphs failed", extra={"pending_id": key.pending_id, "error": repr(exc)})
        finally:
            self.exporting = None
            self.export_s += time.perf_counter() - t0

    def flush(self) -> None:
        """Wait until every enqueued inference is written."""
        if self._queue is not None:
            self._queue.join()

    def wait_for_graphs(self) -> None:
        """Wait until every wanted graph pair is exported (or failed); deferred exports start now."""
        self.flush()
        self._start_exporter()
        self._exports.join()

    def close(self, finish_exports: bool = True) -> None:
        """Write what is queued and stop the writer; finish the graph exports (or, if not, abandon them).

        ``finish_exports=False`` (a server shutting down): queued keys are not exported and one in
        progress is left to the daemon thread — the requests stay in the record and the next recorder
        on it resumes them.
        """
        if self._queue is not None and self._worker is not None:
            self._queue.put(None)
            self._worker.join()
            self._queue = self._worker = None
        if finish_exports and self._defer_exports and self._exports.unfinished_tasks:
            self._start_exporter()
        if self._exporter is not None:
            if not finish_exports:
                self._abandon = True
            self._exports.put(None)
            if finish_exports:
                self._exporter.join()
                if self.graphs is not None:
                    self.graphs.close()
            self._exporter = None

    # ---- recording -------------------------------------------------------------------------------

    def on_served(self, served: ServedInference, started_ns: int, ended_ns: int) -> str:
        """Record one served inference (or enqueue it); return its trace id ("" if recording failed).

        The inference is already committed when this runs, so a recording failure must not turn it
        into an error for the requester; it is logged and counted in ``failures``.
        """
        if self._queue is not None:
            self._queue.put((served, started_ns, ended_ns))
            return get_trace_id(served.inference_id)
        return self._record_logged(served, started_ns, ended_ns)

    def _record_logged(self, served: ServedInference, started_ns: int, ended_ns: int) -> str:
        t0 = time.perf_counter()
        with self._lock:
            try:
                return self._record(served, started_ns, ended_ns)
            except (VerinferError, OSError) as exc:
                self.failures += 1
                log.error("recording an inference failed", extra={"inference_id": hex(served.inference_id),
                                                                  "error": str(exc)})
                return ""
            finally:
                self.write_s += time.perf_counter() - t0

    def _record(self, served: ServedInference, started_ns: int, ended_ns: int) -> str:
        gen = served.generation
        prompt = served.artifact.header.prompt_token_ids
        trace_id = get_trace_id(served.inference_id)
        length = len(prompt) + max(len(gen.output_ids), 1) - 1
        key = None if self.graphs is None else self.graphs.get_graph_key(length)
        put = self.record.put_tensor
        put(np.asarray(prompt, np.int64), role="input", name="input_ids.prompt", event_id="generate",
            trace_id=trace_id)
        put(np.asarray(gen.output_ids, np.int64), role="output", name="output_ids", event_id="generate",
            trace_id=trace_id)
        put(np.frombuffer(served.artifact.header.run_seed, np.uint8), role="rng_seed", name="run_seed",
            event_id="generate", trace_id=trace_id)
        put(np.frombuffer(served.wire, np.uint8), role="output", name="artifact.wire", event_id="commit",
            trace_id=trace_id)
        put(np.frombuffer(b"".join(served.fingerprint), np.uint8).reshape(len(served.fingerprint), -1),
            role="output", name="fingerprint", event_id="commit", trace_id=trace_id)
        done = time.time_ns()
        events = (
            TraceEvent("generate", "step", f"generate {len(gen.output_ids)} tokens", self.device.device_id,
                       started_ns, ended_ns, attrs=(("finish_reason", gen.finish_reason),
                                                    ("prompt_tokens", str(len(prompt))),
                                                    ("fed_tokens", str(length)))),
            TraceEvent("commit", "commitment", "artifact root", self.device.device_id, ended_ns, max(done, ended_ns),
                       attrs=(("artifact_root", served.artifact.root.hex()),
                              ("output_hash", served.output_hash.hex()),
                              ("fingerprint_hash", served.fingerprint_hash.hex()))),
        )
        if key is None:
            self.record.put_trace(Trace(trace_id, get_pending_graph_id(self.model, length), "inference", events))
            return trace_id
        self.record.put_graph_request(key.pending_id, key.as_json())
        with self._link_lock:  # a resolution between this check and put_trace would miss the trace's link
            resolution = self.record.get_graph_resolution(key.pending_id)
            graph_id = key.pending_id if resolution is None else resolution["verification_graph_id"]
            self.record.put_trace(Trace(trace_id, graph_id, "inference", events))
        if resolution is None:
            self._want(key)
        log.debug("inference recorded", extra={"trace_id": trace_id, "graph_id": graph_id})
        return trace_id


def open_executer_recorder(path: Path, files: ModelFiles, dtype: str, device: str,
                           export_graphs: bool = True) -> InferenceRecorder:
    """Return the executer's background recorder on the record at path, exporting graphs where it can.

    Graphs are exported in a niced child process from its own CPU copy of the model (torch-mlir is
    needed: where it is not installed, e.g. the vLLM environment, inferences are recorded with a
    placeholder graph id and a verifier exports the graphs from its own copy).
    """
    graphs: GraphSource | None = None
    if export_graphs:
        try:
            from node.workload.inference import ProcessGraphExporter
        except ImportError as exc:
            log.warning("inference graphs will not be exported here", extra={"error": str(exc)})
        else:  # in a niced child process: an in-process export slowed generation several-fold
            graphs = ProcessGraphExporter(files.path, files.spec.name, files.model_id.hex(), dtype)
    return InferenceRecorder(WorkloadRecord.open(path), files.spec.name,
                             Device("executer/0", "localhost", device, 0), graphs=graphs, background=True)


def load_private_model(model_dir: Path, name: str, dtype: str) -> Any:
    """Return a CPU copy of the model for exporting (never the engine's own module)."""
    from node.engines.transformers_engine import TransformersEngine, TransformersOptions

    return TransformersEngine(model_dir, name, TransformersOptions("cpu", dtype)).model

"""Record every inference an executer serves: data, RNG seed and a trace of the steps.

Cheap on the serving path: a handful of small tensors (prompt and output ids, the run seed, the
artifact wire bytes, the fingerprint chunks, each content-addressed) and one trace, written in a
few synced LevelDB batches. The verification graph (teacher-forced prefill for this sequence length)
is exported only when ``export_graphs`` is on, once per length (same length → same graph id),
because a torch-mlir export takes seconds; otherwise the trace names the graph it will be verified
with as ``pending/<model>/<length>`` and a verifier exports it from its own copy of the model.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from node.errors import VerinferError
from node.workload.model import Device, Trace, TraceEvent
from node.workload.store import WorkloadRecord

if TYPE_CHECKING:
    from node.executer.service import ServedInference

log = logging.getLogger(__name__)

GraphExporter = Callable[[int], str]  # sequence length → id of the recorded verification graph


def get_pending_graph_id(model: str, length: int) -> str:
    """Return the placeholder graph id of a verification graph not exported yet."""
    return f"pending/{model}/{length}"


def get_trace_id(inference_id: int) -> str:
    """Return the trace id of an inference."""
    return f"inference/{inference_id:#066x}"


class InferenceRecorder:
    """Writes one record per served inference into a WorkloadRecord (the executer's recorder hook).

    With ``background=True`` the serving thread only enqueues the served inference (its data is
    immutable) and one writer thread does the hashing and the fsyncs; ``flush()`` waits for it and
    ``close()`` stops it. ``write_s`` accumulates the writer's own time (benchmarks report both).
    """

    def __init__(self, record: WorkloadRecord, model: str, device: Device,
                 export_graph: GraphExporter | None = None, background: bool = False) -> None:
        self.record = record
        self.model = model
        self.device = device
        self.export_graph = export_graph
        self._lock = threading.Lock()
        self._graphs: dict[int, str] = {}
        self.failures = 0
        self.write_s = 0.0
        record.put_device(device)
        self._queue: queue.Queue[tuple[ServedInference, int, int] | None] | None = None
        self._worker: threading.Thread | None = None
        if background:
            self._queue = queue.Queue()
            self._worker = threading.Thread(target=self._drain, name="workload-recorder", daemon=True)
            self._worker.start()

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

    def flush(self) -> None:
        """Wait until every enqueued inference is written."""
        if self._queue is not None:
            self._queue.join()

    def close(self) -> None:
        """Write what is queued and stop the writer thread."""
        if self._queue is not None and self._worker is not None:
            self._queue.put(None)
            self._worker.join()
            self._queue = self._worker = None

    def get_graph_id(self, length: int) -> str:
        """Return the verification graph id for a sequence length (exporting it once if enabled)."""
        if self.export_graph is None:
            return get_pending_graph_id(self.model, length)
        if length not in self._graphs:
            self._graphs[length] = self.export_graph(length)
        return self._graphs[length]

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
        graph_id = self.get_graph_id(len(prompt) + max(len(gen.output_ids), 1) - 1)
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
                                                    ("prompt_tokens", str(len(prompt))))),
            TraceEvent("commit", "commitment", "artifact root", self.device.device_id, ended_ns, max(done, ended_ns),
                       attrs=(("artifact_root", served.artifact.root.hex()),
                              ("output_hash", served.output_hash.hex()),
                              ("fingerprint_hash", served.fingerprint_hash.hex()))),
        )
        self.record.put_trace(Trace(trace_id, graph_id, "inference", events))
        log.debug("inference recorded", extra={"trace_id": trace_id, "graph_id": graph_id})
        return trace_id

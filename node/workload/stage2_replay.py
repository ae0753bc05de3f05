"""The adapter behind ``node.checks.stage2_record``: recorded inferences replayed with IREE.

A ``RecordReader`` is a record folder (``WorkloadRecord``, read-only snapshot) or the executer's HTTP
read API (``HttpRecordReader``: every object re-verified on arrival — graph ids recomputed from their
content, tensors re-hashed to their content address). ``IreeRecordReplayer`` binds the verification
graph to the recorded ids (padded to the graph's bucket) and the verifier's *own* weights, compiles
it with IREE (cached in the verifier's own record by graph id) and returns the logits of the
generated positions. With ``own_graphs`` (the verifier's exporter) it replays the graph the
verifier exported itself and reports whether the prover's recorded graph id is the same: a prover
cannot substitute a graph that ignores its inputs.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import httpx
import numpy as np
import safetensors

from node.checks.decision import Stage2Decision, Stage2Thresholds
from node.checks.stage2_record import (
    RecordedInference,
    ReplayedLogits,
    Stage2RecordMeasurement,
    Stage2RecordTolerance,
    check_recorded_inference,
)
from node.workload.bind import compute_binding
from node.workload.errors import BindingError, InvalidObject, TamperedTensor, UnknownObject, WorkloadError
from node.workload.inference import CausalLmGraphExporter, compute_fed_ids, get_input_length
from node.workload.model import (
    Graph,
    TensorRef,
    Trace,
    compute_tensor_digest,
    graph_from_json,
    tensor_ref_from_json,
    trace_from_json,
)
from node.workload.replay import CompiledGraph, get_compiled
from node.workload.store import FROM_SAFETENSORS, WorkloadRecord, get_numpy_dtype, to_canonical_array

if TYPE_CHECKING:
    from node.engines.models import ModelFiles

log = logging.getLogger(__name__)
REQUIRED = ("input_ids.prompt", "output_ids", "artifact.wire")


class RecordReader(Protocol):
    """Read access to a prover's record (a folder or the HTTP API)."""

    def get_trace(self, trace_id: str) -> Trace:
        """Return a trace."""
        ...

    def resolve_graph_id(self, graph_id: str) -> str | None:
        """Return the recorded graph an id names (following a resolved pending key), or None."""
        ...

    def get_graph(self, graph_id: str) -> Graph:
        """Return a graph (its id verified against its content)."""
        ...

    def tensor_refs_of_trace(self, trace_id: str) -> list[TensorRef]:
        """Return the tensor references a trace recorded."""
        ...

    def get_tensor(self, ref_or_sha: TensorRef | str) -> np.ndarray[Any, Any]:
        """Return a tensor, verified against its content address."""
        ...

    def close(self) -> None:
        """Release the reader (a snapshot copy, an HTTP client)."""
        ...


class HttpRecordReader:
    """The executer's /v1/workload read API as a RecordReader (bearer key; pages followed; data verified)."""

    def __init__(self, base_url: str, key: str, client: httpx.Client | None = None, page: int = 100) -> None:
        self._client = client or httpx.Client(base_url=base_url.rstrip("/"), timeout=60.0)
        self._headers = {"Authorization": f"Bearer {key}"}
        self._prefix = "/v1/workload"
        self._page = page

    def close(self) -> None:
        """Close the HTTP client."""
        self._client.close()

    def _get(self, path: str, params: dict[str, Any] | None = None) -> httpx.Response:
        try:
            response = self._client.get(self._prefix + path, params=params, headers=self._headers)
        except httpx.HTTPError as exc:
            raise WorkloadError(f"workload API unreachable ({exc})", obj=path) from exc
        if response.status_code == 404:
            raise UnknownObject(self._error(response), obj=path)
        if response.status_code != 200:
            raise WorkloadError(f"HTTP {response.status_code}: {self._error(response)}", obj=path)
        return response

    @staticmethod
    def _error(response: httpx.Response) -> str:
        try:
            return str(response.json().get("error", ""))
        except ValueError:
            return response.text[:200]

    def _pages(self, path: str, params: dict[str, Any] | None = None) -> list[Any]:
        items: list[Any] = []
        after: str | None = None
        while True:
            query = {**(params or {}), "limit": self._page, **({} if after is None else {"after": after})}
            body = self._get(path, query).json()
            items.extend(body["items"])
            after = body.get("next")
            if after is None:
                return items

    def get_trace(self, trace_id: str) -> Trace:
        """Return a trace."""
        trace = trace_from_json(self._get(f"/traces/{trace_id}").json())
        if trace.trace_id != trace_id:
            raise InvalidObject("the API returned another trace", obj=trace_id)
        return trace

    def resolve_graph_id(self, graph_id: str) -> str | None:
        """Return the recorded graph an id names, or None while it is pending."""
        resolved = self._get("/resolve", {"graph_id": graph_id}).json().get("graph_id")
        return None if resolved is None else str(resolved)

    def get_graph(self, graph_id: str) -> Graph:
        """Return a graph; its id is recomputed from the content received."""
        graph = graph_from_json(self._get(f"/graphs/{graph_id}").json())
        if graph.graph_id != graph_id:
            raise InvalidObject("the API returned another graph", obj=graph_id)
        return graph

    def tensor_refs_of_trace(self, trace_id: str) -> list[TensorRef]:
        """Return a trace's tensor references (every page)."""
        return [tensor_ref_from_json(r) for r in self._pages(f"/traces/{trace_id}/tensors")]

    def get_tensor(self, ref_or_sha: TensorRef | str) -> np.ndarray[Any, Any]:
        """Return a tensor; its bytes must hash to the address asked for."""
        sha = ref_or_sha.sha256 if isinstance(ref_or_sha, TensorRef) else ref_or_sha
        body = self._get(f"/tensors/{sha}").content
        try:
            [(name, info)] = safetensors.deserialize(body)  # type: ignore[no-untyped-call]
        except Exception as exc:  # safetensors raises its own error type for any malformed byte
            raise TamperedTensor(f"not one readable safetensors tensor ({exc})", obj=sha) from exc
        dtype = FROM_SAFETENSORS.get(str(info["dtype"]), "?")
        shape = tuple(int(d) for d in info["shape"])
        data = bytes(info["data"])
        if name != "data" or compute_tensor_digest(dtype, shape, data) != sha:
            raise TamperedTensor("received bytes do not hash to the address asked for", obj=sha)
        return np.frombuffer(data, dtype=get_numpy_dtype(dtype)).reshape(shape).copy()


class IreeRecordReplayer:
    """Replays recorded inferences with IREE on the verifier's weights (a RecordReplayer)."""

    def __init__(self, reader: RecordReader, weights: Mapping[str, Any], *, cache: WorkloadRecord | None = None,
                 own_graphs: CausalLmGraphExporter | None = None) -> None:
        self.reader = reader
        self.weights = {name: to_canonical_array(w) for name, w in weights.items()}
        self.cache = cache
        self.own_graphs = own_graphs
        if own_graphs is not None and (cache is None or cache.readonly):
            raise InvalidObject("comparing with the verifier's own export needs a writable cache record", obj="cache")
        self._loaded: dict[str, tuple[CompiledGraph, dict[str, Any], bool, float]] = {}

    def load_inference(self, trace_id: str) -> RecordedInference:
        """Return a recorded inference with its verification graph resolved (typed error while pending)."""
        trace = self.reader.get_trace(trace_id)
        if trace.workload != "inference":
            raise InvalidObject(f"a {trace.workload} trace, not an inference", obj=trace_id)
        graph_id = self.reader.resolve_graph_id(trace.graph_id)
        if graph_id is None:
            raise UnknownObject("the verification graph is not exported yet", obj=trace.graph_id)
        refs = {r.name: r for r in self.reader.tensor_refs_of_trace(trace_id)}
        lacking = [n for n in REQUIRED if n not in refs]
        if lacking:
            raise UnknownObject(f"recorded inference lacks {lacking}", obj=trace_id)
        get = self.reader.get_tensor
        return RecordedInference(trace_id, graph_id, get(refs["input_ids.prompt"]).astype(np.int64),
                                 get(refs["output_ids"]).astype(np.int64), get(refs["artifact.wire"]).tobytes())

    def replay_logits(self, inference: RecordedInference) -> ReplayedLogits:
        """Replay the verification graph (the verifier's own export when it has one) and return N logits rows."""
        graph, own, outputs, cached, compile_s, run_s = self.run_verification(inference)
        logits = outputs[[s.name for s in graph.outputs].index("logits")]
        p, n = inference.prompt_ids.size, inference.output_ids.size
        rows = np.asarray(logits[p - 1:p - 1 + n], dtype=np.float32)
        return ReplayedLogits(graph.graph_id, rows, own, cached, compile_s, run_s)

    def run_verification(self, inference: RecordedInference) -> tuple[Graph, bool | None, list[np.ndarray[Any, Any]],
                                                                       bool, float, float]:
        """Run the verification graph on an inference's fed ids: (graph, own, outputs, cached, compile s, run s)."""
        graph, own = self._select_graph(inference)
        compiled, args, cached, compile_s = self._load(graph)
        fed = compute_fed_ids(inference.prompt_ids, inference.output_ids, get_input_length(graph))
        call = [fed if s.name == "input_ids" else args[s.name] for s in graph.inputs]
        t0 = time.perf_counter()
        outputs = compiled.run(call)
        return graph, own, outputs, cached, compile_s, time.perf_counter() - t0

    def _select_graph(self, inference: RecordedInference) -> tuple[Graph, bool | None]:
        if self.own_graphs is None or self.cache is None:
            graph = self.reader.get_graph(inference.graph_id)
            if graph.kind != "verification":
                raise InvalidObject(f"a {graph.kind} graph, not a verification graph", obj=graph.graph_id)
            return graph, None
        key = self.own_graphs.get_graph_key(inference.prompt_ids.size + max(inference.output_ids.size, 1) - 1)
        own_id = self.cache.resolve_graph_id(key.pending_id)
        if own_id is None:
            self.cache.put_graph_request(key.pending_id, key.as_json())
            decode_id, own_id = self.own_graphs.export_graphs(key, self.cache)
            self.cache.resolve_graph_request(key.pending_id, decode_id, own_id)
        return self.cache.get_graph(own_id), own_id == inference.graph_id

    def _load(self, graph: Graph) -> tuple[CompiledGraph, dict[str, Any], bool, float]:
        """Return the compiled graph with the weights uploaded once (compiled modules cached by graph id)."""
        if graph.graph_id not in self._loaded:
            t0 = time.perf_counter()
            values = self._bind_weights(graph)
            in_cache = self.cache is not None and self.cache.resolve_graph_id(graph.graph_id) == graph.graph_id
            vmfb, cached = get_compiled(graph, self.cache if in_cache else None)
            compiled = CompiledGraph(vmfb)
            names = list(values)
            args = dict(zip(names, compiled.upload([values[n] for n in names]), strict=True))
            self._loaded[graph.graph_id] = (compiled, args, cached, time.perf_counter() - t0)
        return self._loaded[graph.graph_id]

    def _bind_weights(self, graph: Graph) -> dict[str, np.ndarray[Any, Any]]:
        """Return the verifier's weights for every non-id input, checked against the graph's edges."""
        values: dict[str, np.ndarray[Any, Any]] = {}
        for spec in graph.inputs:
            if spec.name == "input_ids":
                continue
            if spec.name not in self.weights:
                raise BindingError("the verifier's weights lack this input", obj=f"{graph.graph_id}:{spec.name}")
            values[spec.name] = np.asarray(self.weights[spec.name], dtype=get_numpy_dtype(spec.dtype))
        refs = {n: TensorRef("0" * 64, v.dtype.name, tuple(v.shape), "weight", n) for n, v in values.items()}
        compute_binding(graph, refs, "verifier-weights")  # dtype / shape of every weight against its edge
        return values


class RecordVerifier:
    """A verifier's standing setup for stage 2 from records: its own model copy, exporter and cache record.

    Load once (the model, then per bucket one export and one IREE compile, both cached), then
    ``check`` any number of recorded inferences from folders or executers' HTTP APIs.
    """

    def __init__(self, files: ModelFiles, cache: Path) -> None:
        from node.workload.export import get_module_state
        from node.workload.recorder import load_private_model

        model = load_private_model(files.path, files.spec.name, files.spec.dtype)
        self.files = files
        self.cache = WorkloadRecord.open(cache)
        self.exporter = CausalLmGraphExporter(lambda: copy.deepcopy(model), files.spec.name, files.model_id.hex(),
                                              files.spec.dtype)
        self.weights = get_module_state(model)
        self._lock = threading.Lock()

    def close(self) -> None:
        """Close the cache record."""
        self.cache.close()

    def check(self, reader: RecordReader, trace_id: str, tolerance: Stage2RecordTolerance,
              expected_root: bytes | None = None,
              profile: Stage2Thresholds | None = None) -> tuple[Stage2RecordMeasurement, Stage2Decision]:
        """Check one recorded inference (see node.checks.stage2_record.check_recorded_inference)."""
        with self._lock:  # one export / compile at a time; the IREE module is reused across readers
            replayer = IreeRecordReplayer(reader, self.weights, cache=self.cache, own_graphs=self.exporter)
            return check_recorded_inference(replayer, trace_id, tolerance, expected_root, profile)

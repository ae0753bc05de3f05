"""Inference graphs of a causal LM and a stage-2 style replay of a recorded inference from the record.

* decode graph — one decode step: the model on a prefix padded to the bucket length B, returning the
  logits at an input ``position`` (the KV cache is an optimisation that does not change what is
  computed, so the recorded graph has none; causality makes the padding after the position inert);
* verification graph — its teacher-forced prefill: the same forward returning the last hidden state
  and the logits of *every* position, linked to the decode graph (``parent_id``).
Both take every weight as an input. ``CausalLmGraphExporter`` exports the pair once per
``GraphKey`` (model, dtype, bucket, export config, toolchain) from its own copy of the model (never
the serving one: the export swaps parameters in and out). ``replay_recorded_inference`` binds the
verification graph to the record's prompt and output ids (padded to B) and the verifier's own
weights, replays it with IREE and compares the replayed raw log-probabilities with the ones the
artifact committed to.
"""

from __future__ import annotations

import importlib.metadata
import logging
import multiprocessing
import os
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from node.protocol.artifact import decode_artifact_wire
from node.workload.bind import compute_binding
from node.workload.errors import UnknownObject
from node.workload.export import Exported, export_module
from node.workload.graph_keys import ExportConfig, GraphKey
from node.workload.model import Graph
from node.workload.replay import ReplayResult, replay_binding_outputs
from node.workload.store import WorkloadRecord

log = logging.getLogger(__name__)
PAD_ID = 0  # fills a bucket after the fed tokens; causal attention keeps it out of every earlier position


def _ids(length: int) -> torch.Tensor:
    return torch.zeros((1, length), dtype=torch.long)


def export_decode_graph(model: torch.nn.Module, length: int, name: str) -> Exported:
    """Export one decode step (the logits at ``position`` of a prefix padded to L) with the weights as inputs."""

    def call(run: Any, x: dict[str, torch.Tensor]) -> torch.Tensor:
        logits: torch.Tensor = run(input_ids=x["input_ids"], use_cache=False).logits[0]
        return torch.index_select(logits, 0, x["position"].reshape(1))[0]

    return export_module(model, {"input_ids": _ids(length), "position": torch.tensor(length - 1)}, call,
                         name=f"{name}/decode/{length}", output_names=["logits.at_position"])


def export_verification_graph(model: torch.nn.Module, length: int, name: str,
                              decode_graph_id: str | None = None) -> Exported:
    """Export the teacher-forced prefill (hidden state and logits of every position) of a decode at length L."""

    def call(run: Any, x: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        out = run(input_ids=x["input_ids"], use_cache=False, output_hidden_states=True)
        return out.hidden_states[-1][0], out.logits[0]

    kind = "logical" if decode_graph_id is None else "verification"
    return export_module(model, {"input_ids": _ids(length)}, call, name=f"{name}/verify/{length}",
                         output_names=["hidden", "logits"], kind=kind, parent_id=decode_graph_id)


def record_verification_graphs(record: WorkloadRecord, model: torch.nn.Module, length: int, name: str) -> str:
    """Export and record the decode graph and its verification graph for length L; return the latter's id."""
    return record_graph_pair(record, model, length, name)[1]


def record_graph_pair(record: WorkloadRecord, model: torch.nn.Module, length: int, name: str) -> tuple[str, str]:
    """Export and record the decode graph and its verification graph for length L; return both ids."""
    decode = export_decode_graph(model, length, name).graph
    record.put_graph(decode)
    verify = export_verification_graph(model, length, name, decode.graph_id).graph
    return decode.graph_id, record.put_graph(verify)


def get_exporter_versions() -> tuple[tuple[str, str], ...]:
    """Return the (package, version) pairs whose change can change an exported graph."""
    return tuple((p, importlib.metadata.version(p)) for p in ("torch", "torch-mlir", "transformers"))


class CausalLmGraphExporter:
    """Exports a causal LM's (decode, verification) graph pair per GraphKey from a private copy of the model.

    ``load_model`` is called once, lazily, on the exporting thread (a verifier's or an executer's own
    copy: torch.func.functional_call swaps the parameters of the module it runs, so the serving model
    must never be the one exported). It traces in this process, so a recorder runs its exports only
    when asked to (``wait_for_graphs`` / ``close``), never beside serving: torch.export patches
    process-wide module hooks while it traces (a concurrent generation broke a trace: IndexError).
    """

    runs_in_process = True

    def __init__(self, load_model: Callable[[], torch.nn.Module], model: str, model_id: str, dtype: str,
                 config: ExportConfig | None = None) -> None:
        self.model, self.model_id, self.dtype = model, model_id, dtype
        self.config = config or ExportConfig()
        self.versions = get_exporter_versions()
        self._load = load_model
        self._module: torch.nn.Module | None = None
        self._lock = threading.Lock()

    def get_graph_key(self, length: int) -> GraphKey:
        """Return the key of the graphs that verify an inference of `length` fed tokens."""
        return GraphKey(self.model, self.model_id, self.dtype, self.config.compute_bucket(length), self.config,
                        self.versions)

    def is_own_key(self, key: dict[str, Any]) -> bool:
        """Check whether a recorded key's JSON is one this exporter produces (same model, dtype, config)."""
        try:
            return self.get_graph_key(int(key["length"])).as_json() == key
        except (KeyError, TypeError, ValueError):
            return False

    def export_graphs(self, key: GraphKey, record: WorkloadRecord) -> tuple[str, str]:
        """Export the key's graph pair into the record; return (decode id, verification id)."""
        with self._lock:
            if self._module is None:
                self._module = self._load().eval()
            ids = record_graph_pair(record, self._module, key.length, f"{key.model}/{key.dtype}")
        log.info("inference graphs exported", extra={"pending_id": key.pending_id, "decode_graph_id": ids[0],
                                                     "verification_graph_id": ids[1]})
        return ids

    def close(self) -> None:
        """Drop the private model copy."""
        self._module = None


class ProcessGraphExporter(CausalLmGraphExporter):
    """The exporter in a niced single-threaded child process (spawned on the first export).

    torch.export holds the GIL for much of its work and competes for the cores: in the serving
    process it slowed generation several-fold (docs/workload.md). The child loads its own copy of
    the model from its files and returns the exported graphs; the parent writes them (it stays the
    record's only writer).
    """

    runs_in_process = False  # its own process: exports run as soon as a key is wanted, beside serving

    def __init__(self, model_dir: Path, model: str, model_id: str, dtype: str, config: ExportConfig | None = None,
                 nice: int = 10, threads: int = 1) -> None:
        super().__init__(lambda: torch.nn.Module(), model, model_id, dtype, config)
        self._child_args = (str(model_dir), model, dtype, nice, threads)
        self._pool: ProcessPoolExecutor | None = None

    def export_graphs(self, key: GraphKey, record: WorkloadRecord) -> tuple[str, str]:
        """Export the key's pair in the child; record it here; return (decode id, verification id)."""
        with self._lock:
            if self._pool is None:
                self._pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                                                 initializer=_init_export_child, initargs=self._child_args)
            decode, verify = self._pool.submit(_export_in_child, key.length, f"{key.model}/{key.dtype}").result()
        record.put_graph(decode)
        record.put_graph(verify)
        log.info("inference graphs exported in a child process",
                 extra={"pending_id": key.pending_id, "verification_graph_id": verify.graph_id})
        return decode.graph_id, verify.graph_id

    def close(self) -> None:
        """Stop the child process."""
        with self._lock:
            if self._pool is not None:
                self._pool.shutdown(wait=True, cancel_futures=True)
                self._pool = None


_CHILD_MODEL: list[torch.nn.Module] = []


def _init_export_child(model_dir: str, name: str, dtype: str, nice: int, threads: int) -> None:
    """Lower the child's priority, pin its threads and load its model copy (runs once per child)."""
    from node.workload.recorder import load_private_model

    os.nice(nice)
    torch.set_num_threads(threads)
    _CHILD_MODEL.append(load_private_model(Path(model_dir), name, dtype).eval())


def _export_in_child(length: int, name: str) -> tuple[Graph, Graph]:
    """Export the decode graph and its verification graph at a length (in the child)."""
    model = _CHILD_MODEL[0]
    decode = export_decode_graph(model, length, name).graph
    return decode, export_verification_graph(model, length, name, decode.graph_id).graph


def get_input_length(graph: Graph) -> int:
    """Return the sequence length of a decode/verification graph's ``input_ids`` input."""
    for spec in graph.inputs:
        if spec.name == "input_ids" and len(spec.shape) == 2:
            return int(spec.shape[1])
    raise UnknownObject("graph has no [1, L] input_ids input", obj=graph.graph_id)


def compute_fed_ids(prompt: np.ndarray, output: np.ndarray, bucket: int) -> np.ndarray:
    """Return the teacher-forced ids (prompt, output but its last) padded with PAD_ID to [1, bucket]."""
    fed = np.concatenate([prompt, output[:-1]]).astype(np.int64)
    if fed.size > bucket:
        raise UnknownObject(f"{fed.size} fed tokens do not fit a graph of length {bucket}", obj="input_ids")
    padded = np.full((1, bucket), PAD_ID, dtype=np.int64)
    padded[0, :fed.size] = fed
    return padded


@dataclass(frozen=True)
class InferenceReplay:
    """Stage-2 style measurements of one recorded inference replayed with IREE."""

    trace_id: str
    graph_id: str
    positions: int
    max_logprob_error: float  # replayed vs committed raw log-probabilities of the K candidates
    top_k_equal: int  # positions where the replay's K most probable ids equal the committed candidates
    replay: ReplayResult


def replay_recorded_inference(record: WorkloadRecord, trace_id: str, weights: dict[str, torch.Tensor],
                              weights_label: str = "verifier") -> InferenceReplay:
    """Replay a recorded inference's verification graph on its recorded ids and the verifier's weights.

    The weights are stored under the trace id ``weights/<weights_label>`` (content-addressed, so a
    model's weights are written once); use another label for another set of weights.
    """
    trace = record.get_trace(trace_id)
    graph_id = record.resolve_graph_id(trace.graph_id)
    if graph_id is None:
        raise UnknownObject("the verification graph is not exported yet", obj=trace.graph_id)
    graph = record.get_graph(graph_id)
    refs = {r.name: r for r in record.tensor_refs_of_trace(trace_id)}
    for needed in ("input_ids.prompt", "output_ids", "artifact.wire"):
        if needed not in refs:
            raise UnknownObject(f"recorded inference lacks {needed}", obj=trace_id)
    prompt = record.get_tensor(refs["input_ids.prompt"])
    output = record.get_tensor(refs["output_ids"])
    artifact = decode_artifact_wire(record.get_tensor(refs["artifact.wire"]).tobytes())
    fed = compute_fed_ids(prompt, output, get_input_length(graph))
    values = {s.name: record.put_tensor(weights[s.name], role=s.role, name=s.name, trace_id=f"weights/{weights_label}")
              for s in graph.inputs if s.name in weights}
    values["input_ids"] = record.put_tensor(fed, role="input", name="input_ids", trace_id=trace_id)
    binding = compute_binding(graph, values, f"replay/{weights_label}/{trace_id}")
    record.put_binding(binding)  # so that queries see what this replay bound
    result, (_, logits) = replay_binding_outputs(record, graph, binding)
    p = len(prompt)
    rows = logits[p - 1:p - 1 + len(output)].astype(np.float64)
    logprobs = rows - rows.max(axis=1, keepdims=True)
    logprobs -= np.log(np.exp(logprobs).sum(axis=1, keepdims=True))
    ids = artifact.positions.token_ids.astype(np.int64)
    committed = artifact.positions.raw_logprobs.astype(np.float64)
    replayed = np.take_along_axis(logprobs, ids, axis=1)
    top = np.argsort(-logprobs, axis=1, kind="stable")[:, :ids.shape[1]]
    return InferenceReplay(trace_id, graph.graph_id, len(output), float(np.abs(replayed - committed).max()),
                           int((top == ids).all(axis=1).sum()), result)

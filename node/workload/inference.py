"""Inference graphs of a causal LM and a stage-2 style replay of a recorded inference from the record.

* decode graph — one decode step at sequence length L: the model on the prefix, returning the logits
  of the last position (the KV cache is an optimisation that does not change what is computed, so
  the recorded graph has none);
* verification graph — its teacher-forced prefill: the same forward returning the last hidden state
  and the logits of *every* position, linked to the decode graph (``parent_id``).
Both take every weight as an input. ``replay_recorded_inference`` binds the verification graph to
the record's prompt and output ids and the verifier's own weights, replays it with IREE and compares
the replayed raw log-probabilities with the ones the artifact committed to.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from node.protocol.artifact import decode_artifact_wire
from node.workload.bind import compute_binding
from node.workload.errors import UnknownObject
from node.workload.export import Exported, export_module
from node.workload.query import get_tensors
from node.workload.replay import ReplayResult, replay_binding_outputs
from node.workload.store import WorkloadRecord


def _ids(length: int) -> torch.Tensor:
    return torch.zeros((1, length), dtype=torch.long)


def export_decode_graph(model: torch.nn.Module, length: int, name: str) -> Exported:
    """Export one decode step (last-position logits of a length-L prefix) with the weights as inputs."""

    def call(run: Any, x: dict[str, torch.Tensor]) -> torch.Tensor:
        logits: torch.Tensor = run(input_ids=x["input_ids"], use_cache=False).logits[0, -1]
        return logits

    return export_module(model, {"input_ids": _ids(length)}, call, name=f"{name}/decode/{length}",
                         output_names=["logits.last"])


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
    decode = export_decode_graph(model, length, name).graph
    record.put_graph(decode)
    verify = export_verification_graph(model, length, name, decode.graph_id).graph
    return record.put_graph(verify)


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
    graph = record.get_graph(trace.graph_id)
    refs = {r.name: r for r in get_tensors(record, trace_id=trace_id)}
    for needed in ("input_ids.prompt", "output_ids", "artifact.wire"):
        if needed not in refs:
            raise UnknownObject(f"recorded inference lacks {needed}", obj=trace_id)
    prompt = record.get_tensor(refs["input_ids.prompt"])
    output = record.get_tensor(refs["output_ids"])
    artifact = decode_artifact_wire(record.get_tensor(refs["artifact.wire"]).tobytes())
    fed = np.concatenate([prompt, output[:-1]]).astype(np.int64)[None]
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

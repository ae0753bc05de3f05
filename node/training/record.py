"""A training run in the workload record: its processes, graphs, trace and the data its audits used.

Graphs (StableHLO, exported with torch-mlir): one replica's forward/backward — parameters and the
batch's token ids in, the declared causal-LM loss and one gradient per parameter out
(node.training.train_graph; its gradients, concatenated in parameter order, are the contribution's
`grad_local`, which the graph's `feeds` attribute names) — the replica's contribution
`grad = grad_local · (1/N)`, its distributed form — the contribution all-reduced (summed) over the
workers and the shadow, which is exactly the mean the job exchanges — and the declared optimiser
update `buf = μ·buf + grad; θ = θ − lr·buf`. Exporting the forward/backward takes ≈ 4 s for the tiny
model (744 ops, 68 kB of StableHLO text) and 219 s for SmolLM2-135M's shape (8,136 ops, 792 kB) on two
CPU cores (cached per shape and batch within a process, so the devnet's two runs export it once); an IREE
replay matches torch autograd to 5.3e-7 (tiny); see docs/training.md. The trace has one `step` and one
`collective` event per step and worker, a `commitment` per ledger entry, and `challenge`,
`checkpoint` and `response` events for every audited step; the audited Z(t−1), Z(t), the batches
and the sketches are stored as content-addressed tensors tied to those events.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch

from node.training.job import get_response_dir
from node.training.spec import RunSpec
from node.training.train_graph import get_forward_backward_graph
from node.workload.export import export_function
from node.workload.graph import compute_all_reduce_graph
from node.workload.model import Device, Graph, Link, Trace, TraceEvent
from node.workload.store import WorkloadRecord

log = logging.getLogger(__name__)
LOOPBACK_LATENCY_NS = 50_000
LOOPBACK_BANDWIDTH = 1e9


def compute_replica_contribution(grad_local: torch.Tensor, inv_n: torch.Tensor) -> torch.Tensor:
    """Return one replica's share of the mean gradient."""
    return grad_local * inv_n


def compute_sgd_momentum(params: torch.Tensor, momentum: torch.Tensor, grad: torch.Tensor, lr: torch.Tensor,
                         mu: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Return the declared update (params, momentum), as node.training.model.compute_update."""
    buf = momentum * mu + grad
    return params - lr * buf, buf


def get_device_ids(spec: RunSpec) -> tuple[str, ...]:
    """Return the job's processes as record devices: worker-0..N−1 and the shadow."""
    return (*(f"worker-{r}" for r in range(spec.workers)), "shadow")


def export_training_graphs(spec: RunSpec, n_params: int) -> tuple[Graph, Graph, Graph, Graph]:
    """Return (forward/backward, contribution, distributed contribution with the all-reduce, update) graphs."""
    v = torch.zeros(n_params, dtype=torch.float32)
    s = torch.zeros((), dtype=torch.float32)
    contribution = export_function(compute_replica_contribution, {"grad_local": v, "inv_n": s},
                                   name="training.replica-contribution", output_names=["grad"],
                                   input_roles={"grad_local": "gradient", "inv_n": "input"}).graph
    devices = get_device_ids(spec)
    distributed = compute_all_reduce_graph(contribution, ["grad"], (tuple(range(len(devices))),), devices,
                                           name="training.all-reduce[workers+shadow]")
    update = export_function(compute_sgd_momentum, {"params": v, "momentum": v, "grad": v, "lr": s, "mu": s},
                             name="training.sgd-momentum", output_names=["params", "momentum"],
                             input_roles={"params": "weight", "momentum": "state", "grad": "gradient",
                                          "lr": "input", "mu": "input"}).graph
    # the forward/backward's gradients, flattened and concatenated in parameter order, are grad_local
    feeds = (("feeds", f"{contribution.graph_id}:grad_local"), ("grad_local", "concat(grad.*) in output order"))
    forward_backward = get_forward_backward_graph(spec.shape, spec.batch_per_worker, spec.seq_len, feeds)
    return forward_backward, contribution, distributed, update


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def compute_trace(spec: RunSpec, out_dir: Path, distributed: Graph, audits: list[dict[str, Any]]) -> Trace:
    """Return the run's trace from its step timings, ledger, announcements, responses and verdicts."""
    run = spec.run_id().hex()[:16]
    reducer = next(op.op_id for op in distributed.ops if op.name == "stablehlo.all_reduce")
    ledger = {d["step"]: d for d in _read_jsonl(out_dir / "ledger.jsonl")}
    events: list[TraceEvent] = []
    for timing in _read_jsonl(out_dir / "steps.jsonl"):
        t, start, end = int(timing["step"]), int(timing["start_ns"]), int(timing["end_ns"])
        for device in get_device_ids(spec):
            if device != "shadow":
                events.append(TraceEvent(f"step-{t}-{device}", "step", f"step {t}", device, start, end))
            events.append(TraceEvent(f"allreduce-{t}-{device}", "collective", "all_reduce(grad)", device, start, end,
                                     op_ids=(reducer,)))
        if t in ledger:
            attrs = (("head", str(ledger[t]["head"])), ("roots", ",".join(ledger[t]["batch_roots"])))
            events.append(TraceEvent(f"commit-{t}", "commitment", f"ledger h({t})", "worker-0", end, end, attrs=attrs))
    for a in _read_jsonl(out_dir / "announced.jsonl"):
        t, at = int(a["step"]), int(float(a["at"]) * 1e9)
        events.append(TraceEvent(f"challenge-{t}", "challenge", f"audit of step {t}", "worker-0", at, at))
        folder = get_response_dir(out_dir, t)
        if (folder / "state.npy").exists():
            served = int((folder / "state.npy").stat().st_mtime * 1e9)
            events.append(TraceEvent(f"checkpoint-{t}", "checkpoint", f"Z({t - 1}), Z({t}) served", "shadow",
                                     min(at, served), served))
    for verdict in audits:
        t, at = int(verdict["step"]), int(float(verdict["at"]) * 1e9)
        a = verdict
        events.append(TraceEvent(f"response-{t}", "response", f"verdict {a['reason_name']}", "worker-0", at, at,
                                 attrs=(("valid", str(a["valid"]).lower()), ("reason", str(a["reason"])))))
    return Trace(f"training-{run}", distributed.graph_id, "training", tuple(sorted(events, key=lambda e: e.start_ns)))


def record_run(record: WorkloadRecord, spec: RunSpec, out_dir: Path, n_params: int,
               audits: list[dict[str, Any]]) -> str:
    """Record one run (devices, graphs, trace, audited data) and return its trace id."""
    devices = get_device_ids(spec)
    known = {d.device_id for d in record.devices()}
    for d in devices:
        if d not in known:
            record.put_device(Device(d, "127.0.0.1", "process", 8 * n_params))
    known_links = {(link.a, link.b) for link in record.links()}
    for i, a in enumerate(devices):
        for b in devices[i + 1:]:
            if (a, b) not in known_links:
                record.put_link(Link(a, b, LOOPBACK_LATENCY_NS, LOOPBACK_BANDWIDTH))
    forward_backward, contribution, distributed, update = export_training_graphs(spec, n_params)
    for g in (forward_backward, contribution, distributed, update):
        record.put_graph(g)  # idempotent: the same graph id is stored once
    trace = compute_trace(spec, out_dir, distributed, audits)
    record.put_trace(trace)
    for verdict in audits:
        store_audited_data(record, trace.trace_id, out_dir, int(verdict["step"]))
    return trace.trace_id


def store_audited_data(record: WorkloadRecord, trace_id: str, out_dir: Path, step: int) -> None:
    """Store the data an audit of `step` used, tied to its checkpoint event."""
    folder = get_response_dir(out_dir, step)
    event = f"checkpoint-{step}"
    if (folder / "state_prev.npy").exists():
        record.put_tensor(np.load(folder / "state_prev.npy"), role="checkpoint", name=f"Z({step - 1})",
                          event_id=event, trace_id=trace_id)
    if (folder / "state.npy").exists():
        record.put_tensor(np.load(folder / "state.npy"), role="checkpoint", name=f"Z({step})", event_id=event,
                          trace_id=trace_id)
    if (folder / "batch.json").exists():
        for rank, b in enumerate(json.loads((folder / "batch.json").read_text())):
            record.put_tensor(np.asarray(b["tokens"], dtype=np.int64), role="input", name=f"batch[{rank}]@{step}",
                              event_id=event, trace_id=trace_id)

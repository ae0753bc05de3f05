"""`verinfer workload demo`: record a real SmolLM2-135M inference and a tiny data-parallel training step,
then replay slices of both with IREE from the record alone (plus the verifier's own weights).
"""

from __future__ import annotations

import copy
import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from node.workload.demo_models import compute_mlp_step, make_mlp_batch
from node.workload.errors import UnknownObject
from node.workload.export import export_function, get_module_state
from node.workload.graph import compute_all_reduce_graph
from node.workload.inference import CausalLmGraphExporter, replay_recorded_inference
from node.workload.model import Device, Link, Trace, TraceEvent
from node.workload.recorder import InferenceRecorder
from node.workload.replay import decide_replay, is_replay_match, run_and_compare
from node.workload.store import WorkloadRecord

log = logging.getLogger(__name__)
MLP_OUTPUTS = ["loss", "grad.w1", "grad.w2"]
MLP_ROLES = {"w1": "weight", "w2": "weight", "y": "label"}
Say = Callable[[str], None]


@dataclass(frozen=True)
class DemoReport:
    """What the demo recorded and how the replays compared (numbers only)."""

    inference_trace: str
    verification_graph: str
    generate_s: float
    record_s: float  # the background writer's time (the serving path only enqueues)
    export_s: float
    prefill_max_logprob_error: float
    prefill_topk_equal: int
    positions: int
    prefill_compile_s: float
    prefill_iree_s: float
    layer_graph: str
    layer_max_abs_error: float
    layer_iree_s: float
    layer_eager_s: float
    training_graph: str
    training_replicas_match: int
    all_reduce_max_error: float
    training_logical_graph: str = ""  # bind it with --trace training_trace --device replica0 (docs/workload.md)
    training_trace: str = ""


def record_inference(record: WorkloadRecord, model_name: str, max_tokens: int,
                     say: Say) -> tuple[Any, str, float, float, float]:
    """Serve one real inference with recording on; return (model, trace id, generate s, record s, export s).

    The recorder's export thread exports the decode and verification graphs from its own copy of the
    model once serving is done (an in-process exporter never traces beside a generation); ``close()`` runs it.
    """
    from node.checks.fingerprint import FingerprintThresholds
    from node.engines.models import get_model_spec, materialise_model
    from node.engines.tokenizer import ModelTokenizer
    from node.engines.transformers_engine import TransformersEngine
    from node.executer.service import ExecuterService
    from node.protocol.prompt import compute_prompt_hash
    from node.protocol.sampler import SamplingParams

    spec = get_model_spec(model_name)
    files = materialise_model(spec)
    engine = TransformersEngine(files.path, model_name)
    host = socket.gethostname()
    graphs = CausalLmGraphExporter(lambda: copy.deepcopy(engine.model), model_name, files.model_id.hex(), spec.dtype)
    recorder = InferenceRecorder(record, model_name, Device(f"{host}/cpu", host, "cpu", 0), graphs=graphs,
                                 background=True)
    timed = _TimedRecorder(recorder)
    service = ExecuterService(files, ModelTokenizer(files.path, spec.chat), engine,
                              FingerprintThresholds(2, 1.0, 1.0, 0), recorder=timed)
    messages = [{"role": "user", "content": "Name three colours."}]
    prompt_ids = service.tokenizer.encode_chat(messages)
    t0 = time.perf_counter()
    served = service.infer(prompt_ids, compute_prompt_hash(files.model_id, messages=messages),
                           SamplingParams(0.7, 0.95, 0, max_tokens), 42, None, {"messages": messages})
    total = time.perf_counter() - t0
    recorder.close()  # the writer thread finishes the record, then the export thread exports the graphs
    say(f"served {len(served.generation.output_ids)} tokens in {total:.2f} s; recording cost the serving path "
        f"{timed.seconds * 1e3:.1f} ms, its writer thread {recorder.write_s * 1e3:.1f} ms; the export thread "
        f"exported the decode and verification graphs in {recorder.export_s:.1f} s")
    return engine.model, timed.trace_id, total - timed.seconds, recorder.write_s, recorder.export_s


class _TimedRecorder:
    """Wraps a recorder to time it (the demo reports the overhead)."""

    def __init__(self, inner: InferenceRecorder) -> None:
        self.inner, self.seconds, self.trace_id = inner, 0.0, ""

    def on_served(self, served: Any, started_ns: int, ended_ns: int) -> str:
        t0 = time.perf_counter()
        self.trace_id = self.inner.on_served(served, started_ns, ended_ns)
        self.seconds = time.perf_counter() - t0
        return self.trace_id


def replay_last_layer(record: WorkloadRecord, model: Any, graph_id: str, input_ids: np.ndarray[Any, Any],
                      say: Say) -> tuple[str, float, float, float]:
    """Cut the last decoder layer out of the recorded verification graph, bind it, replay it with IREE.

    The slice's cut input is the hidden state entering the layer (torch eager's, at the recorded fed
    ids padded to the graph's bucket), its other inputs the verifier's own weights; its claimed output
    is eager's hidden state leaving the layer. All of it is recorded as tensors and a binding ``demo-layer``.
    """
    from node.workload.bind import compute_binding
    from node.workload.graph import compute_decoder_layer_slice, get_parent_edge
    from node.workload.replay import replay_binding

    decoder = model.get_decoder()
    last = len(decoder.layers) - 1
    graph = record.get_graph(graph_id)
    piece = compute_decoder_layer_slice(graph, last)
    record.put_graph(piece)
    bucket = next(s.shape[1] for s in graph.inputs if s.name == "input_ids")
    ids = torch.zeros((1, bucket), dtype=torch.long)
    ids[0, :len(input_ids)] = torch.from_numpy(input_ids.astype(np.int64))
    captured: dict[str, torch.Tensor] = {}
    hook = decoder.layers[last].register_forward_hook(
        lambda _m, args, kwargs, out: captured.update(h_in=args[0] if args else kwargs["hidden_states"],
                                                      h_out=out[0] if isinstance(out, tuple) else out),
        with_kwargs=True)
    try:
        with torch.no_grad():
            decoder(input_ids=ids, use_cache=False)
            t0 = time.perf_counter()
            cos, sin = decoder.rotary_emb(captured["h_in"], torch.arange(bucket)[None])
            decoder.layers[last](captured["h_in"], position_embeddings=(cos, sin), attention_mask=None)
            eager = time.perf_counter() - t0
    finally:
        hook.remove()
    state = get_module_state(model)
    trace_id = f"demo/layer{last}/{piece.graph_id[:16]}"
    refs = {}
    for spec in (*piece.inputs, *piece.outputs):
        edge = get_parent_edge(spec.name)
        if spec.name.startswith("cut:"):
            value = captured["h_in"]
        elif spec.role == "output":
            value = captured["h_out"]
        else:
            value = state[spec.name]
        refs[spec.name] = record.put_tensor(value, role=spec.role, name=edge, event_id="layer", trace_id=trace_id)
    binding = compute_binding(piece, refs, "demo-layer")
    record.put_binding(binding)
    replay_binding(record, piece, binding)  # compile + cache
    result = replay_binding(record, piece, binding)
    say(f"last layer cut from the recorded verification graph ({len(piece.ops)} of {len(graph.ops)} ops): "
        f"IREE {result.run_s * 1e3:.1f} ms vs eager {eager * 1e3:.1f} ms, max |Δ| {result.outputs[0].max_abs_error:.2e}"
        f" ({decide_replay(result).reason.name})")
    return piece.graph_id, result.outputs[0].max_abs_error, result.run_s, eager


def _gloo_worker(rank: int, world: int, port: int, outdir: str) -> None:
    """One data-parallel replica: local step on its own batch, then a gloo all-reduce of the gradients."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        batch = make_mlp_batch(rank)
        shared = make_mlp_batch(0)
        batch["w1"], batch["w2"] = shared["w1"], shared["w2"]  # data parallel: same weights, own data
        t0 = time.time_ns()
        loss, g1, g2 = compute_mlp_step(**batch)
        t1 = time.time_ns()
        r1, r2 = g1.clone(), g2.clone()
        dist.all_reduce(r1)
        t2 = time.time_ns()
        dist.all_reduce(r2)
        t3 = time.time_ns()
        arrays = {**{k: v.numpy() for k, v in batch.items()}, "loss": loss.numpy(), "grad.w1": g1.numpy(),
                  "grad.w2": g2.numpy(), "reduced/grad.w1": r1.numpy(), "reduced/grad.w2": r2.numpy(),
                  "times": np.array([t0, t1, t2, t3], np.int64)}
        np.savez(Path(outdir) / f"rank{rank}.npz", **arrays)  # type: ignore[arg-type]
    finally:
        dist.destroy_process_group()


def run_gloo_step(world: int = 2) -> list[dict[str, np.ndarray[Any, Any]]]:
    """Run one data-parallel MLP step on `world` gloo processes; return each rank's tensors and times."""
    import tempfile

    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    with tempfile.TemporaryDirectory() as outdir:
        mp.spawn(_gloo_worker, args=(world, port, outdir), nprocs=world, join=True)  # type: ignore[attr-defined,no-untyped-call]
        return [dict(np.load(Path(outdir) / f"rank{r}.npz")) for r in range(world)]


def record_training_step(record: WorkloadRecord, say: Say) -> tuple[str, int, float]:
    """Record a real two-process (gloo) data-parallel MLP step: distributed graph, trace, data; replay it."""
    for r in ("replica0", "replica1"):
        record.put_device(Device(r, socket.gethostname(), "process", 2**30, 1e10))
    record.put_link(Link("replica0", "replica1", 20_000, 1e9))
    ranks = run_gloo_step(2)
    logical = export_function(compute_mlp_step, {k: torch.from_numpy(ranks[0][k]) for k in ("w1", "w2", "x", "y")},
                              name="mlp-step", output_names=MLP_OUTPUTS, input_roles=MLP_ROLES).graph
    record.put_graph(logical)
    dp = compute_all_reduce_graph(logical, ["grad.w1", "grad.w2"], ((0, 1),), ("replica0", "replica1"))
    record.put_graph(dp)
    trace_id = f"training/{dp.graph_id[:16]}/step0"
    local_ops = tuple(op.op_id for op in dp.ops if op.name != "stablehlo.all_reduce")
    events = []
    for i, data in enumerate(ranks):
        device = f"replica{i}"
        t0, t1, t2, t3 = (int(t) for t in data["times"])
        for name in ("w1", "w2", "x", "y", *MLP_OUTPUTS, "reduced/grad.w1", "reduced/grad.w2"):
            role = MLP_ROLES.get(name, "input" if name == "x" else "gradient" if "grad" in name else "output")
            event = f"step/{device}" if not name.startswith("reduced/") else f"allreduce/{name[8:]}/{device}"
            record.put_tensor(data[name], role=role, name=f"{device}/{name}", event_id=event, trace_id=trace_id)
        events.append(TraceEvent(f"step/{device}", "step", "local step", device, t0, t1, local_ops))
        for c, (start, end) in zip(dp.distribution.collectives if dp.distribution else (), ((t1, t2), (t2, t3)),
                                   strict=True):
            events.append(TraceEvent(f"allreduce/{c.tensor}/{device}", "collective", f"all_reduce {c.tensor}", device,
                                     start, end, (c.op_id,)))
    record.put_trace(Trace(trace_id, dp.graph_id, "training", tuple(events)))
    matches, replayed = 0, []
    for data in ranks:
        claimed = {n: data[n] for n in MLP_OUTPUTS}
        result, outs = run_and_compare(logical, {k: data[k] for k in ("w1", "w2", "x", "y")}, claimed, record)
        matches += int(is_replay_match(result))
        replayed.append(outs)
    worst = 0.0  # each rank's recorded all-reduced gradient vs the sum of the IREE-replayed local gradients
    for i in range(len(ranks)):
        for name in ("grad.w1", "grad.w2"):
            k = MLP_OUTPUTS.index(name)
            recorded = trace_input(record, trace_id, f"replica{i}/reduced/{name}")
            worst = max(worst, float(np.abs(recorded - (replayed[0][k] + replayed[1][k])).max()))
    say(f"training step (2 gloo processes): {matches}/2 replica steps replayed with IREE match; recorded "
        f"all-reduce vs sum of replayed replica gradients: max |Δ| {worst:.1e}")
    log.info("training step recorded", extra={"trace_id": trace_id, "graph_id": dp.graph_id})
    return dp.graph_id, matches, worst


def run_demo(path: Path, model_name: str = "smollm2-135m-instruct", max_tokens: int = 8,
             say: Say = lambda _s: None) -> DemoReport:
    """Record an inference and a training step into the record at path, and replay slices of both."""
    torch.set_num_threads(max(1, torch.get_num_threads()))
    with WorkloadRecord.open(path) as record:
        model, trace_id, gen_s, rec_s, export_s = record_inference(record, model_name, max_tokens, say)
        graph_id = record.resolve_graph_id(record.get_trace(trace_id).graph_id)
        if graph_id is None:
            raise UnknownObject("the export thread did not export the verification graph", obj=trace_id)
        replay = replay_recorded_inference(record, trace_id, get_module_state(model))
        say(f"verification prefill on IREE: compile {replay.replay.compile_s:.1f} s, run {replay.replay.run_s:.2f} s; "
            f"top-K equal at {replay.top_k_equal}/{replay.positions} positions; "
            f"max |Δ logprob| {replay.max_logprob_error:.2e}")
        fed = np.concatenate([np.asarray(trace_input(record, trace_id, "input_ids.prompt")),
                              np.asarray(trace_input(record, trace_id, "output_ids"))[:-1]])
        layer_id, layer_err, layer_iree, layer_eager = replay_last_layer(record, model, graph_id, fed, say)
        train_id, train_matches, ar_err = record_training_step(record, say)
        train_logical = record.get_graph_entry(train_id)["parent_id"]
        train_trace = record.trace_ids_of_graph(train_id)[0]
    return DemoReport(trace_id, graph_id, gen_s, rec_s, export_s, replay.max_logprob_error,
                      replay.top_k_equal, replay.positions, replay.replay.compile_s, replay.replay.run_s, layer_id,
                      layer_err, layer_iree, layer_eager, train_id, train_matches, ar_err, train_logical, train_trace)


def trace_input(record: WorkloadRecord, trace_id: str, name: str) -> np.ndarray[Any, Any]:
    """Return the tensor a trace recorded under a name."""
    for ref in record.tensor_refs_of_trace(trace_id):
        if ref.name == name:
            return record.get_tensor(ref)
    raise UnknownObject(f"no tensor {name!r} recorded", obj=trace_id)

"""Every served inference recorded (switchable) with its graphs exported off the serving path, and a
stage-2 style replay of it from the record."""

from __future__ import annotations

import copy
import threading
from pathlib import Path
from typing import Any

import numpy as np
import torch

from node.checks.fingerprint import FingerprintThresholds
from node.executer.service import ExecuterService
from node.protocol.prompt import compute_prompt_hash
from node.protocol.sampler import SamplingParams
from node.workload.chrome import compute_chrome_trace
from node.workload.export import get_module_state
from node.workload.graph_keys import ExportConfig, GraphKey, is_pending_id
from node.workload.inference import CausalLmGraphExporter, ProcessGraphExporter, replay_recorded_inference
from node.workload.model import Device
from node.workload.query import compute_missing, get_tensors, get_traces
from node.workload.recorder import InferenceRecorder, get_pending_graph_id
from node.workload.store import WorkloadRecord

MESSAGES = [{"role": "user", "content": "Name a colour."}]
THRESHOLDS = FingerprintThresholds(2, 1.0, 1.0, 0)
DEVICE = Device("executer/cpu0", "executer", "cpu", 2**34)


def _serve(tiny: Any, recorder: InferenceRecorder | None, seed: int) -> Any:
    service = ExecuterService(tiny.files, tiny.tokenizer, tiny.engine, THRESHOLDS, recorder=recorder)
    prompt_hash = compute_prompt_hash(tiny.files.model_id, messages=MESSAGES)
    return service.infer(tiny.tokenizer.encode_chat(MESSAGES), prompt_hash, SamplingParams(0.8, 0.95, 0, 6), seed,
                         None, {"messages": MESSAGES})


def test_recording_is_off_by_default_and_records_when_on(tmp_path: Path, tiny: Any) -> None:
    assert ExecuterService(tiny.files, tiny.tokenizer, tiny.engine, THRESHOLDS).recorder is None
    with WorkloadRecord.open(tmp_path / "rec") as rec:
        recorder = InferenceRecorder(rec, "tiny-llama", DEVICE)
        served = _serve(tiny, recorder, 5)
        [trace] = get_traces(rec, workload="inference")
        length = len(served.artifact.header.prompt_token_ids) + len(served.generation.output_ids) - 1
        assert trace.graph_id == get_pending_graph_id("tiny-llama", length)
        assert [e.kind for e in trace.events] == ["step", "commitment"]
        assert dict(trace.events[1].attrs)["artifact_root"] == served.artifact.root.hex()
        refs = {r.name: r for r in get_tensors(rec, trace_id=trace.trace_id)}
        assert list(rec.get_tensor(refs["output_ids"])) == list(served.generation.output_ids)
        assert rec.get_tensor(refs["artifact.wire"]).tobytes() == served.wire
        assert {r.role for r in refs.values()} == {"input", "output", "rng_seed"}
        assert not compute_missing(rec, trace.graph_id).graph_recorded  # the pending graph is reported missing
        assert compute_chrome_trace(trace, rec.devices())["traceEvents"]
        assert recorder.failures == 0


def tiny_exporter(tiny: Any) -> CausalLmGraphExporter:
    """The real exporter on a private copy of the tiny model (as the executer's recorder loads its own)."""
    return CausalLmGraphExporter(lambda: copy.deepcopy(tiny.engine.model), "tiny-llama", tiny.files.model_id.hex(),
                                 "float32", ExportConfig(min_bucket=32))


class GatedExporter:
    """The real exporter behind a gate, so a test can look at the record while an export is under way."""

    def __init__(self, inner: CausalLmGraphExporter, fail: bool = False) -> None:
        self.inner, self.fail = inner, fail
        self.gate = threading.Event()
        self.started = threading.Event()
        self.calls = 0

    def get_graph_key(self, length: int) -> GraphKey:
        return self.inner.get_graph_key(length)

    def is_own_key(self, key: dict[str, Any]) -> bool:
        return self.inner.is_own_key(key)

    def close(self) -> None:
        self.inner.close()

    def export_graphs(self, key: GraphKey, record: WorkloadRecord) -> tuple[str, str]:
        self.calls += 1
        self.started.set()
        assert self.gate.wait(60)
        if self.fail:
            raise RuntimeError("export failed (simulated crash of torch-mlir)")
        return self.inner.export_graphs(key, record)


def test_graphs_are_exported_off_the_serving_path_and_linked(tmp_path: Path, tiny: Any) -> None:
    torch.set_num_threads(1)
    exporter = GatedExporter(tiny_exporter(tiny))
    with WorkloadRecord.open(tmp_path / "rec") as rec:
        recorder = InferenceRecorder(rec, "tiny-llama", DEVICE, graphs=exporter)
        first = _serve(tiny, recorder, 5)  # returns while the export waits at the gate: not on the serving path
        assert exporter.started.wait(30)
        [trace] = get_traces(rec)
        assert is_pending_id(trace.graph_id) and recorder.exporting == trace.graph_id
        report = compute_missing(rec, trace.graph_id)  # honest while the export is under way
        assert not report.graph_recorded and report.pending == "export requested, not recorded yet"
        assert report.missing == ("graph",) and not report.is_verifiable
        exporter.gate.set()
        recorder.wait_for_graphs()
        resolution = rec.get_graph_resolution(trace.graph_id)
        assert resolution is not None and recorder.exported == [trace.graph_id]
        verify = rec.get_graph(resolution["verification_graph_id"])
        decode = rec.get_graph(resolution["decode_graph_id"])
        assert verify.kind == "verification" and verify.parent_id == decode.graph_id
        assert [s.name for s in decode.inputs][-2:] == ["input_ids", "position"]
        assert rec.trace_ids_of_graph(verify.graph_id) == [trace.trace_id]  # the pending trace is linked
        resolved = compute_missing(rec, trace.graph_id)
        assert resolved.graph_recorded and resolved.resolved_from == trace.graph_id
        assert resolved.graph_id == verify.graph_id and "graph" not in resolved.missing
        second = _serve(tiny, recorder, 6)  # same bucket: linked at once, nothing exported again
        recorder.wait_for_graphs()
        assert exporter.calls == 1
        assert rec.get_trace(f"inference/{second.inference_id:#066x}").graph_id == verify.graph_id
        assert sorted(rec.trace_ids_of_graph(verify.graph_id)) == sorted(
            f"inference/{s.inference_id:#066x}" for s in (first, second))
        recorder.close()
    # a second executer start on the same record re-uses the graphs: no export
    again = GatedExporter(tiny_exporter(tiny))
    again.gate.set()
    with WorkloadRecord.open(tmp_path / "rec") as rec:
        recorder = InferenceRecorder(rec, "tiny-llama", DEVICE, graphs=again)
        third = _serve(tiny, recorder, 7)
        recorder.wait_for_graphs()
        assert again.calls == 0
        assert rec.get_trace(f"inference/{third.inference_id:#066x}").graph_id == verify.graph_id
        recorder.close()


def test_a_failed_export_stays_requested_and_resumes_on_the_next_start(tmp_path: Path, tiny: Any) -> None:
    torch.set_num_threads(1)
    broken = GatedExporter(tiny_exporter(tiny), fail=True)
    broken.gate.set()
    with WorkloadRecord.open(tmp_path / "rec") as rec:
        recorder = InferenceRecorder(rec, "tiny-llama", DEVICE, graphs=broken, background=True)
        served = _serve(tiny, recorder, 5)
        recorder.close()
        assert recorder.export_failures == 1 and recorder.failures == 0
        trace = rec.get_trace(f"inference/{served.inference_id:#066x}")  # the inference itself is recorded
        assert compute_missing(rec, trace.graph_id).pending == "export requested, not recorded yet"
    with WorkloadRecord.open(tmp_path / "rec", readonly=True) as reader:  # a copied folder says the same
        assert compute_missing(reader, trace.graph_id).pending == "export requested, not recorded yet"
    working = GatedExporter(tiny_exporter(tiny))
    working.gate.set()
    with WorkloadRecord.open(tmp_path / "rec") as rec:
        recorder = InferenceRecorder(rec, "tiny-llama", DEVICE, graphs=working)  # resumes the request, serves nothing
        recorder.wait_for_graphs()
        recorder.close()
        assert working.calls == 1 and recorder.exported == [trace.graph_id]
        assert compute_missing(rec, trace.graph_id).graph_recorded


def test_stage2_replay_from_the_record(tmp_path: Path, tiny: Any) -> None:
    torch.set_num_threads(1)
    model = tiny.engine.model
    with WorkloadRecord.open(tmp_path / "rec") as rec:
        recorder = InferenceRecorder(rec, "tiny-llama", DEVICE, graphs=tiny_exporter(tiny))
        served = _serve(tiny, recorder, 9)
        recorder.wait_for_graphs()
        [trace] = get_traces(rec)
        verify = rec.get_graph(rec.resolve_graph_id(trace.graph_id) or "")
        assert verify.kind == "verification" and rec.get_graph(verify.parent_id or "").kind == "logical"
        replay = replay_recorded_inference(rec, trace.trace_id, get_module_state(model))
        assert replay.positions == len(served.generation.output_ids)
        assert replay.top_k_equal == replay.positions
        assert replay.max_logprob_error < 1e-4  # fp32 prefill vs decode: measured ~1e-6 here
        assert replay.replay.cached is False
        # a lie about the weights is visible: replaying with perturbed weights moves the log-probabilities
        bent = {k: v + 0.05 * torch.randn_like(v) if k.endswith("q_proj.weight") else v
                for k, v in get_module_state(model).items()}
        assert replay_recorded_inference(rec, trace.trace_id, bent, "bent").max_logprob_error > 1e-3
    assert np.isfinite(replay.max_logprob_error)


def test_background_recording_writes_everything_on_flush(tmp_path: Path, tiny: Any) -> None:
    with WorkloadRecord.open(tmp_path / "rec") as rec:
        recorder = InferenceRecorder(rec, "tiny-llama", DEVICE, background=True)
        served = [_serve(tiny, recorder, seed) for seed in (1, 2)]
        recorder.close()
        assert sorted(t.trace_id for t in get_traces(rec)) == sorted(
            f"inference/{s.inference_id:#066x}" for s in served)
        assert recorder.failures == 0 and recorder.write_s > 0


def test_an_executer_configured_with_a_record_records_what_it_serves(tmp_path: Path) -> None:
    from node.executer.bootstrap import ExecuterSettings, load_executer

    service, _, _ = load_executer(ExecuterSettings("tiny-llama", workload_record=tmp_path / "rec"))
    assert service.recorder is not None
    prompt_hash = compute_prompt_hash(service.files.model_id, messages=MESSAGES)
    served = service.infer(service.tokenizer.encode_chat(MESSAGES), prompt_hash, SamplingParams(0.8, 0.95, 0, 6), 3,
                           None, {"messages": MESSAGES})
    assert isinstance(service.recorder.graphs, ProcessGraphExporter)  # exported in a niced child process
    service.recorder.close()  # background mode: waits for the writer and the graph export, then closes
    service.recorder.record.close()
    with WorkloadRecord.open(tmp_path / "rec", readonly=True) as rec:
        [trace] = get_traces(rec, workload="inference")
        assert dict(trace.events[1].attrs)["artifact_root"] == served.artifact.root.hex()
        verify = rec.get_graph(rec.resolve_graph_id(trace.graph_id) or "")
        assert verify.kind == "verification"
    with WorkloadRecord.open(tmp_path / "in-process") as rec:  # the same key exported here gives the same ids
        exporter = CausalLmGraphExporter(lambda: copy.deepcopy(service.engine.model), "tiny-llama",  # type: ignore
                                         service.files.model_id.hex(), "float32")
        key = exporter.get_graph_key(int(dict(trace.events[0].attrs)["fed_tokens"]))
        assert key.pending_id == trace.graph_id  # recorded before its export finished
        assert exporter.export_graphs(key, rec)[1] == verify.graph_id


def test_a_shutdown_does_not_wait_for_an_export_and_the_next_start_resumes_it(tmp_path: Path, tiny: Any) -> None:
    torch.set_num_threads(1)
    stuck = GatedExporter(tiny_exporter(tiny))
    with WorkloadRecord.open(tmp_path / "rec") as rec:
        recorder = InferenceRecorder(rec, "tiny-llama", DEVICE, graphs=stuck, background=True)
        served = _serve(tiny, recorder, 5)
        assert stuck.started.wait(30)
        thread = recorder._exporter
        recorder.close(finish_exports=False)  # returns while the export is stuck at its gate
        assert thread is not None and thread.is_alive()
    stuck.gate.set()  # the abandoned export now meets a closed record: logged, nothing written
    thread.join(60)
    assert not thread.is_alive() and recorder.export_failures == 1
    working = GatedExporter(tiny_exporter(tiny))
    working.gate.set()
    with WorkloadRecord.open(tmp_path / "rec") as rec:
        trace = rec.get_trace(f"inference/{served.inference_id:#066x}")
        assert rec.resolve_graph_id(trace.graph_id) is None
        recorder = InferenceRecorder(rec, "tiny-llama", DEVICE, graphs=working)
        recorder.close()  # finishes the resumed export
        assert working.calls == 1 and rec.resolve_graph_id(trace.graph_id) is not None

"""Every served inference recorded (switchable), and a stage-2 style replay of it from the record."""

from __future__ import annotations

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
from node.workload.inference import record_verification_graphs, replay_recorded_inference
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


def test_stage2_replay_from_the_record(tmp_path: Path, tiny: Any) -> None:
    torch.set_num_threads(1)
    model = tiny.engine.model
    with WorkloadRecord.open(tmp_path / "rec") as rec:
        recorder = InferenceRecorder(rec, "tiny-llama", DEVICE,
                                     export_graph=lambda n: record_verification_graphs(rec, model, n, "tiny-llama"))
        served = _serve(tiny, recorder, 9)
        [trace] = get_traces(rec)
        verify = rec.get_graph(trace.graph_id)
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
    service.recorder.close()  # background mode: waits for the writer, then closes
    service.recorder.record.close()
    with WorkloadRecord.open(tmp_path / "rec", readonly=True) as rec:
        [trace] = get_traces(rec, workload="inference")
        assert dict(trace.events[1].attrs)["artifact_root"] == served.artifact.root.hex()

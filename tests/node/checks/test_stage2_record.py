"""Stage 2 from the workload record: a recorded inference replayed with IREE on the verifier's weights.

Real parts: the tiny llama served by the executer service with the recorder on, its graphs exported by
the recorder's export thread, a verifier's own export in its own record (the IREE module cache), the
executer's HTTP server with the read API. The cheaters are the calibration's (weight noise) and a
prover that links its inferences to a graph of another model (a skipped layer).
"""

from __future__ import annotations

import asyncio
import copy
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from aiohttp import web

from node.calibrate.models import make_noisy_engine, make_skip_layer_engine
from node.checks.fingerprint import FingerprintThresholds
from node.checks.stage2_record import (
    RecordedInference,
    Stage2RecordTolerance,
    check_recorded_inference,
    decide_stage2_record,
    verify_recorded_inference,
)
from node.errors import InvalidInput, Reason
from node.executer.service import ExecuterService, ServedInference
from node.protocol.prompt import compute_prompt_hash
from node.protocol.sampler import SamplingParams
from node.workload.errors import UnknownObject
from node.workload.export import get_module_state
from node.workload.graph_keys import ExportConfig
from node.workload.inference import CausalLmGraphExporter
from node.workload.model import Device
from node.workload.query import compute_missing
from node.workload.recorder import InferenceRecorder, get_trace_id
from node.workload.stage2_replay import HttpRecordReader, IreeRecordReplayer
from node.workload.store import WorkloadRecord

THRESHOLDS = FingerprintThresholds(2, 1.0, 1.0, 0)
DEVICE = Device("executer/cpu0", "executer", "cpu", 2**34)
KEY = "verifier-key"
# measured on the tiny llama (fp32, 3 honest inferences): IREE-vs-committed max |Δ raw logprob| 9.5e-7; weight noise
# 0.1 % gives 1.0e-3 .. 1.8e-3 and 1 % gives 6.4e-3 .. 1.7e-2 (docs/workload.md)
TOLERANCE = Stage2RecordTolerance(max_logprob_error=1e-4, min_top_k_agreement=1.0)
REQUESTS = [([{"role": "user", "content": "Name a colour."}], SamplingParams(0.8, 0.95, 0, 6), 5),
            ([{"role": "user", "content": "Count to three."}], SamplingParams(1.0, 1.0, 0, 10), 6),
            ([{"role": "user", "content": "Say hi."}], SamplingParams(0.0, 1.0, 0, 8), 7)]


def exporter(tiny: Any, model: torch.nn.Module | None = None) -> CausalLmGraphExporter:
    source = model if model is not None else tiny.engine.model
    return CausalLmGraphExporter(lambda: copy.deepcopy(source), "tiny-llama", tiny.files.model_id.hex(), "float32",
                                 ExportConfig(min_bucket=32))


def serve_recorded(tiny: Any, engine: Any, path: Path, graphs: CausalLmGraphExporter) -> list[ServedInference]:
    """Serve the requests with the recorder on (graphs exported by its thread) and close the record."""
    with WorkloadRecord.open(path) as rec:
        recorder = InferenceRecorder(rec, "tiny-llama", DEVICE, graphs=graphs, background=True)
        service = ExecuterService(tiny.files, tiny.tokenizer, engine, THRESHOLDS, recorder=recorder)
        served = [service.infer(tiny.tokenizer.encode_chat(m), compute_prompt_hash(tiny.files.model_id, messages=m),
                                params, seed, None, {"messages": m}) for m, params, seed in REQUESTS]
        recorder.close()
        assert recorder.failures == 0 and recorder.export_failures == 0
    return served


@pytest.fixture(scope="module")
def verifier(tiny: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[WorkloadRecord, Any]]:
    """The verifier's own record (its exports and compiled modules) and exporter, shared by the tests."""
    torch.set_num_threads(1)
    with WorkloadRecord.open(tmp_path_factory.mktemp("verifier") / "rec") as cache:
        yield cache, exporter(tiny)


def replayer(reader: Any, tiny: Any, verifier: tuple[WorkloadRecord, Any]) -> IreeRecordReplayer:
    cache, own = verifier
    return IreeRecordReplayer(reader, get_module_state(tiny.engine.model), cache=cache, own_graphs=own)


@contextmanager
def executer_server(tiny: Any, record: WorkloadRecord) -> Iterator[str]:
    """The executer's own HTTP app serving the record under /v1/workload behind KEY, on a thread."""
    from node.executer.server import create_app, load_api_settings

    service = ExecuterService(tiny.files, tiny.tokenizer, tiny.engine, THRESHOLDS)
    app = create_app(service, "profile", True, load_api_settings(None, keys=[KEY]), workload=record)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    loop = asyncio.new_event_loop()
    started = threading.Event()
    runner = web.AppRunner(app)

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
        started.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert started.wait(30)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)


def test_honest_recorded_inferences_pass_from_the_folder_and_over_http(tmp_path: Path, tiny: Any,
                                                                       verifier: Any) -> None:
    served = serve_recorded(tiny, tiny.engine, tmp_path / "prover", exporter(tiny))
    with WorkloadRecord.open(tmp_path / "prover", readonly=True) as folder:
        check = replayer(folder, tiny, verifier)
        results = [check_recorded_inference(check, get_trace_id(s.inference_id), TOLERANCE, s.artifact.root)
                   for s in served]
    for (m, decision), s in zip(results, served, strict=True):
        assert decision.valid, m
        assert m.graph_is_own_export is True and m.positions == len(s.generation.output_ids)
        assert m.top_k_agreement == 1.0 and m.logprob_error_max < 1e-5
        assert m.stage2.weight_error_max < 1e-4 and m.stage2.candidate_mismatch_rate == 0.0  # stage 2's own signals
    with WorkloadRecord.open(tmp_path / "prover") as live, executer_server(tiny, live) as url:
        reader = HttpRecordReader(url, KEY)
        over_http = check_recorded_inference(replayer(reader, tiny, verifier), get_trace_id(served[0].inference_id),
                                             TOLERANCE, served[0].artifact.root)
        reader.close()
        with pytest.raises(Exception, match="401"):
            HttpRecordReader(url, "wrong-key").get_trace(get_trace_id(served[0].inference_id))
    assert over_http[1].valid and over_http[0] == results[0][0]  # the same numbers as from the folder


def test_a_weight_noise_cheater_is_caught_from_the_record(tmp_path: Path, tiny: Any, verifier: Any) -> None:
    noisy = make_noisy_engine(tiny.engine, 0.01, seed=1)  # the calibration's weight-noise-1pct cheater
    served = serve_recorded(tiny, noisy, tmp_path / "cheater", exporter(tiny))
    with WorkloadRecord.open(tmp_path / "cheater", readonly=True) as folder:
        check = replayer(folder, tiny, verifier)
        results = [check_recorded_inference(check, get_trace_id(s.inference_id), TOLERANCE, s.artifact.root)
                   for s in served]
    for m, decision in results:
        assert not decision.valid and decision.reason in (Reason.LOGPROB_DISTANCE, Reason.CANDIDATE_MISMATCH)
        assert m.graph_is_own_export is True  # the graph is the right one: the weights behind the artifact are not
        assert m.logprob_error_max > 20 * TOLERANCE.max_logprob_error  # measured 6.4e-3 .. 1.7e-2


def test_a_graph_of_another_model_is_refused(tmp_path: Path, tiny: Any, verifier: Any) -> None:
    skipped = make_skip_layer_engine(tiny.engine, 0).model
    served = serve_recorded(tiny, tiny.engine, tmp_path / "substituted", exporter(tiny, skipped))
    with WorkloadRecord.open(tmp_path / "substituted", readonly=True) as folder:
        m, decision = check_recorded_inference(replayer(folder, tiny, verifier),
                                               get_trace_id(served[0].inference_id), TOLERANCE)
        assert m.graph_is_own_export is False and decision.reason is Reason.MODEL_MISMATCH
        assert m.logprob_error_max < 1e-5  # the verifier replayed its own graph: the artifact itself is honest
        trusting = IreeRecordReplayer(folder, get_module_state(tiny.engine.model))  # no own export: not compared
        m2, d2 = check_recorded_inference(trusting, get_trace_id(served[0].inference_id), TOLERANCE)
        assert m2.graph_is_own_export is None and d2.reason is Reason.MODEL_MISMATCH
        lenient = decide_stage2_record(m2, Stage2RecordTolerance(1e-4, 1.0, require_own_graph=False))
        assert lenient.reason is not Reason.OK  # the prover's graph (a layer skipped) disagrees with its artifact


def test_a_record_that_contradicts_itself_or_the_chain_is_a_typed_error(tmp_path: Path, tiny: Any,
                                                                        verifier: Any) -> None:
    served = serve_recorded(tiny, tiny.engine, tmp_path / "prover", exporter(tiny))
    with WorkloadRecord.open(tmp_path / "prover", readonly=True) as folder:
        check = replayer(folder, tiny, verifier)
        trace_id = get_trace_id(served[0].inference_id)
        with pytest.raises(InvalidInput) as wrong_root:
            check_recorded_inference(check, trace_id, TOLERANCE, expected_root=served[1].artifact.root)
        assert wrong_root.value.reason is Reason.ARTIFACT_ROOT_MISMATCH
        inference = check.load_inference(trace_id)
        other = RecordedInference(inference.trace_id, inference.graph_id, inference.prompt_ids,
                                  inference.output_ids[::-1].copy(), inference.artifact_wire)
        with pytest.raises(InvalidInput) as wrong_output:
            verify_recorded_inference(other)
        assert wrong_output.value.reason is Reason.OUTPUT_HASH_MISMATCH
        with pytest.raises(UnknownObject, match="no trace"):
            check.load_inference("inference/0x00")


def test_a_pending_graph_is_reported_not_replayed(tmp_path: Path, tiny: Any, verifier: Any) -> None:
    with WorkloadRecord.open(tmp_path / "rec") as rec:
        recorder = InferenceRecorder(rec, "tiny-llama", DEVICE)  # no exporter: the trace names a placeholder
        service = ExecuterService(tiny.files, tiny.tokenizer, tiny.engine, THRESHOLDS, recorder=recorder)
        m, params, seed = REQUESTS[0]
        served = service.infer(tiny.tokenizer.encode_chat(m), compute_prompt_hash(tiny.files.model_id, messages=m),
                               params, seed, None, {"messages": m})
        with pytest.raises(UnknownObject, match="not exported yet"):
            replayer(rec, tiny, verifier).load_inference(get_trace_id(served.inference_id))
        report = compute_missing(rec, rec.get_trace(get_trace_id(served.inference_id)).graph_id)
        assert report.pending is not None and report.pending.startswith("not requested")

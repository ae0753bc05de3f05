"""The executer with the vLLM engine records what it serves (runs in .venv-vllm; skipped where vllm is absent).

The recorder hook sits in ExecuterService, so it is engine-agnostic; what differs in the vLLM
environment is that torch-mlir is not installed there: the recorder records the inference (data,
seed, artifact, trace) under a placeholder graph id and a verifier exports the graphs from its own
copy of the model (the record says so: "not requested").
"""

from pathlib import Path

import pytest

pytest.importorskip("vllm")

from node.engines.models import get_model_spec, materialise_model
from node.engines.tokenizer import ModelTokenizer
from node.engines.vllm_engine import VllmEngine
from node.executer.service import ExecuterService
from node.profiles import load_profile
from node.protocol.prompt import compute_prompt_hash
from node.protocol.sampler import SamplingParams
from node.workload.query import compute_missing, get_tensors, get_traces
from node.workload.recorder import open_executer_recorder
from node.workload.store import WorkloadRecord

NAME = "smollm2-135m-instruct"
MESSAGES = [{"role": "user", "content": "Name a colour."}]


def test_the_vllm_executer_records_an_inference(tmp_path: Path) -> None:
    spec = get_model_spec(NAME)
    files = materialise_model(spec)
    tokenizer = ModelTokenizer(files.path, spec.chat)
    recorder = open_executer_recorder(tmp_path / "rec", files, spec.dtype, "cpu")
    service = ExecuterService(files, tokenizer, VllmEngine(files.path, NAME),
                              load_profile(spec)[1].fingerprint_thresholds(), recorder=recorder)
    served = service.infer(tokenizer.encode_chat(MESSAGES), compute_prompt_hash(files.model_id, messages=MESSAGES),
                           SamplingParams(0.8, 0.95, 0, 8), 3, None, {"messages": MESSAGES})
    recorder.close()
    recorder.record.close()
    assert recorder.failures == 0 and service.engine.info.backend == "vllm"
    with WorkloadRecord.open(tmp_path / "rec", readonly=True) as rec:
        [trace] = get_traces(rec, workload="inference")
        assert dict(trace.events[1].attrs)["artifact_root"] == served.artifact.root.hex()
        refs = {r.name: r for r in get_tensors(rec, trace_id=trace.trace_id)}
        assert rec.get_tensor(refs["artifact.wire"]).tobytes() == served.wire
        assert list(rec.get_tensor(refs["output_ids"])) == list(served.generation.output_ids)
        report = compute_missing(rec, trace.graph_id)
        if recorder.graphs is None:  # no torch-mlir here: the record says who must export the graphs
            assert report.pending is not None and report.pending.startswith("not requested")
        else:
            assert report.graph_recorded

"""`verinfer workload …` on a real record: ls, show, query, slice, bind, replay (exit codes), export-trace."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from node.cli_workload import workload_app
from node.workload.demo_models import compute_mlp_step, make_mlp_batch
from node.workload.export import export_function
from node.workload.model import Device, Trace, TraceEvent
from node.workload.store import WorkloadRecord

runner = CliRunner()
OUTPUTS = ["loss", "grad.w1", "grad.w2"]


@pytest.fixture(scope="module")
def record(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    path = tmp_path_factory.mktemp("cli") / "rec"
    batch = make_mlp_batch(0)
    graph = export_function(compute_mlp_step, batch, name="mlp-step", output_names=OUTPUTS,
                            input_roles={"w1": "weight", "w2": "weight", "y": "label"}).graph
    with WorkloadRecord.open(path) as rec:
        rec.put_device(Device("cpu0", "host", "cpu", 2**30))
        rec.put_graph(graph)
        for name, value in {**batch, **dict(zip(OUTPUTS, compute_mlp_step(**batch), strict=True))}.items():
            rec.put_tensor(value, role="weight" if name.startswith("w") else "input", name=name, trace_id="step0")
        rec.put_trace(Trace("step0", graph.graph_id, "training",
                            (TraceEvent("e0", "step", "step", "cpu0", 0, 1000, (graph.ops[0].op_id,)),)))
    return path, graph.graph_id


def invoke(*args: str) -> tuple[int, str]:
    result = runner.invoke(workload_app, list(args))
    return result.exit_code, result.output


def test_ls_show_query(record: tuple[Path, str]) -> None:
    path, gid = record
    code, out = invoke("ls", "--record", str(path), "--json")
    assert code == 0 and json.loads(out)["graphs"][0]["graph_id"] == gid
    code, out = invoke("show", gid, "--record", str(path), "--json")
    assert code == 0 and json.loads(out)["name"] == "mlp-step"
    assert invoke("show", gid, "--record", str(path))[0] == 0
    code, out = invoke("query", "--graph", gid, "--record", str(path), "--json")
    assert json.loads(out)["traces"] == ["step0"]
    code, out = invoke("query", "--trace", "step0", "--role", "weight", "--record", str(path), "--json")
    assert {r["name"] for r in json.loads(out)} == {"w1", "w2"}
    code, out = invoke("query", "--graph", gid, "--missing", "--record", str(path), "--json")
    assert json.loads(out)["graph_recorded"] and not json.loads(out)["verifiable"]  # nothing bound yet
    assert invoke("show", "nothing", "--record", str(path))[0] == 2
    code, out = invoke("query", "--trace", "step0", "--check", "--record", str(path), "--json")
    assert code == 0 and json.loads(out)["consistent"] and json.loads(out)["tensors"] == 7


def test_bind_replay_and_exit_codes(record: tuple[Path, str], tmp_path: Path) -> None:
    path, gid = record
    code, out = invoke("bind", gid, "--trace", "step0", "--record", str(path), "--json")
    assert code == 0 and json.loads(out)["complete"], out
    code, out = invoke("replay", gid, "--record", str(path), "--json")
    assert code == 0 and json.loads(out)["match"], out
    # a wrong claimed gradient is a mismatch (exit 1)
    with WorkloadRecord.open(path) as rec:
        batch = make_mlp_batch(0)
        loss, g1, g2 = compute_mlp_step(**batch)
        for name, value in {**batch, "loss": loss, "grad.w1": g1 * 1.01, "grad.w2": g2}.items():
            rec.put_tensor(value, role="input", name=name, trace_id="step0-lie")
        rec.put_trace(Trace("step0-lie", gid, "training", ()))
    assert invoke("bind", gid, "--trace", "step0-lie", "--name", "lie", "--record", str(path))[0] == 0
    assert invoke("replay", gid, "--binding", "lie", "--record", str(path))[0] == 1
    # missing binding, and a truncated blob: exit 2
    assert invoke("replay", gid, "--binding", "nothing", "--record", str(path))[0] == 2
    with WorkloadRecord.open(path, readonly=True) as rec:
        ref = next(r for r in rec.tensor_refs() if r.trace_id == "step0-lie" and r.name == "grad.w1")
    blob = path / "blobs" / ref.sha256[:2] / f"{ref.sha256}.safetensors"
    blob.write_bytes(blob.read_bytes()[:100])
    assert invoke("replay", gid, "--binding", "lie", "--record", str(path))[0] == 2
    code, out = invoke("query", "--trace", "step0-lie", "--check", "--record", str(path), "--json")
    assert code == 1 and json.loads(out)["damaged"] == ["grad.w1"]


def test_slice_and_export_trace(record: tuple[Path, str], tmp_path: Path) -> None:
    path, gid = record
    with WorkloadRecord.open(path, readonly=True) as rec:
        graph = rec.get_graph(gid)
    last_dot = [op.op_id for op in graph.ops if op.name == "stablehlo.dot_general"][-1]
    code, out = invoke("slice", gid, "--to", last_dot, "--record", str(path), "--json")
    assert code == 0, out
    piece = json.loads(out)
    assert 0 < piece["ops"] < len(graph.ops)
    out_file = tmp_path / "t.json"
    assert invoke("export-trace", "step0", "--out", str(out_file), "--record", str(path))[0] == 0
    events = json.loads(out_file.read_text())["traceEvents"]
    assert any(e["ph"] == "X" and e["dur"] == 1.0 for e in events)
    assert np.isfinite(len(events))


def check(*args: str) -> tuple[int, str]:
    """Invoke and return stdout alone (model loading writes progress bars to stderr)."""
    result = runner.invoke(workload_app, list(args))
    return result.exit_code, result.stdout


def test_check_inference_exit_codes(tmp_path: Path, tiny: Any) -> None:
    import copy

    from node.calibrate.models import make_noisy_engine
    from node.checks.fingerprint import FingerprintThresholds
    from node.executer.service import ExecuterService
    from node.protocol.prompt import compute_prompt_hash
    from node.protocol.sampler import SamplingParams
    from node.workload.inference import CausalLmGraphExporter
    from node.workload.recorder import InferenceRecorder, get_trace_id

    torch.set_num_threads(1)
    messages = [{"role": "user", "content": "Name a colour."}]
    graphs = CausalLmGraphExporter(lambda: copy.deepcopy(tiny.engine.model), "tiny-llama",
                                   tiny.files.model_id.hex(), "float32")
    with WorkloadRecord.open(tmp_path / "prover") as rec:
        recorder = InferenceRecorder(rec, "tiny-llama", Device("e", "e", "cpu", 0), graphs=graphs)
        served = [ExecuterService(tiny.files, tiny.tokenizer, engine, FingerprintThresholds(2, 1.0, 1.0, 0),
                                  recorder=recorder).infer(tiny.tokenizer.encode_chat(messages),
                                                           compute_prompt_hash(tiny.files.model_id, messages=messages),
                                                           SamplingParams(0.8, 0.95, 0, 6), seed, None, {})
                  for seed, engine in ((5, tiny.engine), (6, make_noisy_engine(tiny.engine, 0.01, seed=1)))]
        recorder.close()
        assert recorder.failures == 0
    common = ["--model", "tiny-llama", "--record", str(tmp_path / "prover"), "--cache", str(tmp_path / "verifier"),
              "--json", "--max-logprob-error", "1e-4"]
    code, out = check("check-inference", get_trace_id(served[0].inference_id), *common,
                      "--root", served[0].artifact.root.hex())
    assert code == 0 and json.loads(out)["reason"] == "OK" and json.loads(out)["graph_is_own_export"] is True
    code, out = check("check-inference", get_trace_id(served[1].inference_id), *common)
    assert code == 1 and json.loads(out)["reason"] in ("LOGPROB_DISTANCE", "CANDIDATE_MISMATCH")
    code, _ = check("check-inference", get_trace_id(served[0].inference_id), *common,
                    "--root", served[1].artifact.root.hex())
    assert code == 2  # the record's artifact is not the one committed
    code, _ = check("check-inference", "inference/0x00", *common)
    assert code == 2

"""Slices bind and replay: fresh names for cut edges, constant sub-graphs carried, every documented example run.

The documented examples (docs/workload.md) are the demo's: the training step's logical graph bound
per replica, its ``--to op44`` and ``--from op10 --to op44`` slices, and a decoder layer of a
verification graph (``--layer``) — here on the tiny llama, which has SmolLM2's architecture.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from node.cli_workload import workload_app
from node.workload.bind import compute_binding_from_trace
from node.workload.demo import record_training_step, replay_last_layer
from node.workload.export import Exported, get_module_state
from node.workload.graph import (
    compute_constant_values,
    compute_decoder_layer_cut,
    compute_decoder_layer_slice,
    compute_ops_between,
    compute_slice,
    compute_value_specs,
    parse_module,
)
from node.workload.inference import export_verification_graph
from node.workload.model import Device, Graph, Trace, TraceEvent
from node.workload.replay import ReplayMismatch, compute_cut_values, decide_replay, replay_arrays
from node.workload.store import WorkloadRecord

runner = CliRunner()
L = 16


def invoke(*args: str) -> tuple[int, str]:
    result = runner.invoke(workload_app, list(args))
    return result.exit_code, result.stdout


def assert_inputs_are_their_own_edges(piece: Graph) -> None:
    """The bug: a cut input named %71 while the slice's own %71 is another value (bind checked its shape)."""
    specs = compute_value_specs(piece)
    for spec in (*piece.inputs, *piece.outputs):
        assert specs[spec.name] == spec, (spec, specs[spec.name])


def assert_no_runtime_exponent(piece: Graph) -> None:
    """Every power op's exponent is computed from constants inside the slice (IREE: NaN for x<0 otherwise)."""
    parsed = parse_module(piece.mlir)
    constant = compute_constant_values(parsed)
    powers = [op for op in parsed.ops if op.name == "stablehlo.power"]
    assert powers and all(op.operands[1] in constant for op in powers)


@pytest.fixture(scope="module")
def verification(tiny: Any) -> tuple[Exported, Any]:
    torch.set_num_threads(1)
    return export_verification_graph(tiny.engine.model, L, "tiny"), tiny.engine.model


def eager_layer(model: Any, ids: torch.Tensor, layer: int) -> tuple[np.ndarray, np.ndarray]:
    decoder = model.get_decoder()
    captured: dict[str, torch.Tensor] = {}
    hook = decoder.layers[layer].register_forward_hook(
        lambda _m, a, k, out: captured.update(i=a[0] if a else k["hidden_states"],
                                              o=out[0] if isinstance(out, tuple) else out), with_kwargs=True)
    with torch.no_grad():
        decoder(input_ids=ids, use_cache=False)
    hook.remove()
    return captured["i"].numpy(), captured["o"].numpy()


def test_a_decoder_layer_slice_binds_and_replays_within_tolerance(verification: tuple[Exported, Any]) -> None:
    exported, model = verification
    layer = 1
    graph = exported.graph
    piece = compute_decoder_layer_slice(graph, layer)
    assert_inputs_are_their_own_edges(piece)
    assert_no_runtime_exponent(piece)
    hidden_in, hidden_out = compute_decoder_layer_cut(graph, layer)
    cut = [s for s in piece.inputs if s.name.startswith("cut:")]
    assert [s.name for s in cut] == [f"cut:{hidden_in}"] and [s.name for s in piece.outputs] == [f"out:{hidden_out}"]
    assert {s.name for s in piece.inputs} - {f"cut:{hidden_in}"} == \
        {n for n in (s.name for s in graph.inputs) if n.startswith(f"model.layers.{layer}.")} | \
        {"model.rotary_emb.inv_freq"}
    ids = torch.randint(0, 1000, (1, L), generator=torch.Generator().manual_seed(layer))
    h_in, h_out = eager_layer(model, ids, layer)
    state = get_module_state(model)
    inputs = {s.name: (h_in if s.name.startswith("cut:") else state[s.name].numpy()) for s in piece.inputs}
    result = replay_arrays(piece, inputs, {f"out:{hidden_out}": h_out})
    assert decide_replay(result).reason is ReplayMismatch.OK, result
    assert result.outputs[0].nonfinite_mismatches == 0 and result.outputs[0].max_abs_error < 1e-4
    lie = h_out.copy()
    lie[0, 3, 7] += 0.05
    assert decide_replay(replay_arrays(piece, inputs, {f"out:{hidden_out}": lie})).reason \
        is ReplayMismatch.OUT_OF_TOLERANCE


def test_the_from_to_layer_slice_binds_by_fresh_names(verification: tuple[Exported, Any]) -> None:
    """The issue's `--from/--to` cut of a layer: every cut edge fresh, constants carried, replay within tolerance."""
    exported, model = verification
    graph = exported.graph
    hidden_in, hidden_out = compute_decoder_layer_cut(graph, 1)
    producer = {v: op.op_id for op in graph.ops for v in op.results}
    readers = [op.op_id for op in graph.ops if hidden_in in op.operands]
    piece = compute_slice(graph, compute_ops_between(graph, readers, [producer[hidden_out]]), [hidden_out])
    assert_inputs_are_their_own_edges(piece)
    assert_no_runtime_exponent(piece)
    assert len([s for s in piece.inputs if s.name.startswith("cut:")]) > 1  # rotary cos/sin cut too
    values = {s.name: v.numpy() for s, v in ((s, exported.values[s.name]) for s in graph.inputs)}
    ids = torch.randint(0, 1000, (1, L), generator=torch.Generator().manual_seed(3))
    values["input_ids"] = ids.numpy()
    cuts = compute_cut_values(graph, piece, values)  # the parent's own values at the cut (IREE)
    _, h_out = eager_layer(model, ids, 1)
    inputs = {s.name: (cuts[s.name[4:]] if s.name.startswith("cut:") else values[s.name]) for s in piece.inputs}
    result = replay_arrays(piece, inputs, {f"out:{hidden_out}": h_out})
    assert decide_replay(result).reason is ReplayMismatch.OK and result.outputs[0].max_abs_error < 1e-4, result


def test_the_demo_layer_is_a_cut_of_the_recorded_graph(tmp_path: Path, verification: tuple[Exported, Any]) -> None:
    exported, model = verification
    with WorkloadRecord.open(tmp_path / "rec") as rec:
        rec.put_graph(exported.graph)
        ids = np.arange(5, 5 + L - 4, dtype=np.int64)  # fewer fed ids than the bucket: padded like the demo
        piece_id, err, _, _ = replay_last_layer(rec, model, exported.graph.graph_id, ids, lambda _s: None)
        piece = rec.get_graph(piece_id)
        assert piece.parent_id == exported.graph.graph_id and dict(piece.attrs)["slice_of"] == piece.parent_id
        assert err < 1e-4


@pytest.fixture(scope="module")
def training(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    """The demo's own training record (two real gloo processes)."""
    path = tmp_path_factory.mktemp("demo") / "rec"
    with WorkloadRecord.open(path) as rec:
        dp_id, matches, _ = record_training_step(rec, lambda _s: None)
        assert matches == 2
        logical = rec.get_graph_entry(dp_id)["parent_id"]
        trace = rec.trace_ids_of_graph(dp_id)[0]
    return path, logical, trace


def test_the_demo_training_record_binds_and_replays(training: tuple[Path, str, str]) -> None:
    path, logical, trace = training
    for replica in ("replica0", "replica1"):
        code, out = invoke("bind", logical, "--trace", trace, "--device", replica, "--name", replica,
                           "--record", str(path), "--json")
        assert code == 0 and json.loads(out)["complete"], out
        code, out = invoke("replay", logical, "--binding", replica, "--record", str(path), "--json")
        assert code == 0 and json.loads(out)["reason"] == "OK", out


def test_the_documented_mlp_slices_bind_and_replay(training: tuple[Path, str, str]) -> None:
    path, logical, trace = training
    code, out = invoke("slice", logical, "--to", "op44", "--record", str(path), "--json")
    assert code == 0, out
    upstream = json.loads(out)
    assert upstream["outputs"] == ["loss"]
    code, out = invoke("slice", logical, "--from", "op10", "--to", "op44", "--record", str(path), "--json")
    assert code == 0, out
    between = json.loads(out)
    assert between["outputs"] == ["loss"] and all(n.startswith("cut:%") or n == "x" for n in between["inputs"])
    with WorkloadRecord.open(path, readonly=True) as rec:
        assert_inputs_are_their_own_edges(rec.get_graph(between["graph_id"]))
    code, out = invoke("bind", upstream["graph_id"], "--trace", trace, "--device", "replica0", "--record", str(path),
                       "--json")
    assert code == 0 and json.loads(out)["complete"], out
    assert invoke("replay", upstream["graph_id"], "--record", str(path))[0] == 0
    # the cut edges are not recorded: without --derive-cuts the slice cannot be replayed (exit 2) ...
    code, out = invoke("bind", between["graph_id"], "--trace", trace, "--device", "replica0", "--name", "plain",
                       "--record", str(path), "--json")
    assert code == 0 and not json.loads(out)["replayable"]
    assert invoke("replay", between["graph_id"], "--binding", "plain", "--record", str(path))[0] == 2
    # ... with it they are replayed from the parent on the trace's inputs, and the recorded loss is compared
    code, out = invoke("bind", between["graph_id"], "--trace", trace, "--device", "replica0", "--derive-cuts",
                       "--record", str(path), "--json")
    assert code == 0 and json.loads(out)["complete"], out
    code, out = invoke("replay", between["graph_id"], "--record", str(path), "--json")
    assert code == 0 and json.loads(out)["reason"] == "OK", out


def test_a_lying_cut_activation_is_a_mismatch(tmp_path: Path, training: tuple[Path, str, str]) -> None:
    """Activations the prover recorded (full mode) bind by the parent's names; a wrong one shows."""
    path, logical, trace = training
    with WorkloadRecord.open(path) as rec:
        graph = rec.get_graph(logical)
        piece = compute_slice(graph, compute_ops_between(graph, ["op10"], ["op44"]))
        refs = rec.tensor_refs_of_trace(trace)
        values = {s.name: rec.get_tensor(r) for s, r in ((s, next(r for r in refs if r.name == f"replica0/{s.name}"))
                                                        for s in graph.inputs)}
        cuts = compute_cut_values(graph, piece, values)
        for edge, value in cuts.items():
            rec.put_tensor(value * (1.5 if edge == "%29" else 1.0), role="activation", name=edge, trace_id="lie")
        rec.put_tensor(np.float32(rec.get_tensor(next(r for r in refs if r.name == "replica0/loss"))), role="output",
                       name="loss", trace_id="lie")
        rec.put_tensor(values["x"], role="input", name="x", trace_id="lie")
        rec.put_device(Device("cpu0", "h", "cpu", 1))
        rec.put_trace(Trace("lie", logical, "training", (TraceEvent("e", "step", "s", "cpu0", 0, 1),)))
        binding = compute_binding_from_trace(piece, rec.tensor_refs_of_trace("lie"), rec.get_trace("lie"))
        assert {s.name for s in piece.inputs} <= set(binding.as_dict())
    assert "%29" in cuts  # the one-hot labels, cut
    result = replay_arrays(piece, {s.name: (cuts[s.name[4:]] * (1.5 if s.name == "cut:%29" else 1.0)
                                            if s.name.startswith("cut:") else values[s.name]) for s in piece.inputs},
                           {"loss": values_loss(path, trace)})
    assert decide_replay(result).reason is ReplayMismatch.OUT_OF_TOLERANCE


def values_loss(path: Path, trace: str) -> np.ndarray:
    with WorkloadRecord.open(path, readonly=True) as rec:
        return rec.get_tensor(next(r for r in rec.tensor_refs_of_trace(trace) if r.name == "replica0/loss"))

"""Export a tiny-llama decoder layer with weights as inputs, replay it and its slices with IREE."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from node.workload.bind import compute_binding, compute_binding_report
from node.workload.errors import BindingError, TamperedTensor, UnknownObject
from node.workload.export import Exported, export_module
from node.workload.graph import compute_ops_between, compute_ops_upstream, compute_slice, compute_value_specs
from node.workload.replay import is_replay_match, replay_arrays, replay_binding
from node.workload.store import WorkloadRecord

T = 7


def export_layer(model: Any, seed: int = 0) -> tuple[Exported, torch.Tensor]:
    decoder = model.get_decoder()
    layer = decoder.layers[0]
    h = torch.randn(1, T, model.config.hidden_size, generator=torch.Generator().manual_seed(seed))
    cos, sin = decoder.rotary_emb(h, torch.arange(T)[None])

    def call(run: Any, x: dict[str, torch.Tensor]) -> torch.Tensor:
        out: torch.Tensor = run(x["hidden"], position_embeddings=(x["cos"], x["sin"]), attention_mask=None)
        return out

    exported = export_module(layer, {"hidden": h, "cos": cos, "sin": sin}, call, name="tiny-layer0",
                             output_names=["out"])
    with torch.no_grad():
        expected = call(lambda *a, **k: layer(*a, **k), {"hidden": h, "cos": cos, "sin": sin})
    return exported, expected


@pytest.fixture(scope="module")
def layer(tiny: Any) -> tuple[Exported, torch.Tensor]:
    torch.set_num_threads(1)
    return export_layer(tiny.engine.model)


def test_weights_are_graph_inputs_and_the_id_is_stable(tiny: Any, layer: tuple[Exported, torch.Tensor]) -> None:
    exported, _ = layer
    graph = exported.graph
    roles = {s.name: s.role for s in graph.inputs}
    assert roles["self_attn.q_proj.weight"] == "weight" and roles["hidden"] == "input"
    assert sum(r == "weight" for r in roles.values()) == 9
    assert "dense_resource" not in graph.mlir
    assert export_layer(tiny.engine.model, seed=1)[0].graph.graph_id == graph.graph_id  # same shapes, same graph


def test_iree_replay_matches_torch_and_is_cached(tmp_path: Path, layer: tuple[Exported, torch.Tensor]) -> None:
    exported, expected = layer
    graph = exported.graph
    with WorkloadRecord.open(tmp_path / "rec") as rec:
        rec.put_graph(graph)
        refs = {n: rec.put_tensor(v, role=s.role, name=n)
                for s in graph.inputs for n, v in [(s.name, exported.values[s.name])]}
        refs["out"] = rec.put_tensor(expected, role="output", name="out")
        binding = compute_binding(graph, refs, "eager")
        rec.put_binding(binding)
        assert compute_binding_report(graph, binding, "exact").is_complete
        first = replay_binding(rec, graph, rec.get_binding(graph.graph_id, "eager"))
        second = replay_binding(rec, graph, binding)
    assert not first.cached and second.cached
    assert is_replay_match(first) and first.outputs[0].max_abs_error < 1e-4
    # a claim that is off by more than the tolerance is a mismatch
    wrong = expected.numpy().copy()
    wrong[0, 3, 5] += 0.01
    inputs = {s.name: exported.values[s.name].numpy() for s in graph.inputs}
    assert not is_replay_match(replay_arrays(graph, inputs, {"out": wrong}))


def test_binding_checks_and_report(tmp_path: Path, layer: tuple[Exported, torch.Tensor]) -> None:
    exported, expected = layer
    graph = exported.graph
    with WorkloadRecord.open(tmp_path / "rec") as rec:
        ref_h = rec.put_tensor(exported.values["hidden"], role="input", name="hidden")
        ref_bad = rec.put_tensor(np.zeros((1, T + 1, 128), np.float32), role="input", name="hidden2")
        with pytest.raises(BindingError, match="hidden"):
            compute_binding(graph, {"hidden": ref_bad}, "b")
        with pytest.raises(BindingError, match="nope"):
            compute_binding(graph, {"nope": ref_h}, "b")
        partial = compute_binding(graph, {"hidden": ref_h}, "partial")
        report = compute_binding_report(graph, partial, "blackbox")
        assert report.bound == ("hidden",) and set(report.missing) == {"cos", "sin", "out"}
        assert "self_attn.q_proj.weight" in compute_binding_report(graph, partial, "exact").missing
        assert len(compute_binding_report(graph, partial, "full").missing) > 100  # every internal edge
        with pytest.raises(UnknownObject, match="lacks inputs"):
            rec.put_graph(graph)
            replay_binding(rec, graph, partial)
        # a tampered bound tensor is refused on replay
        out_ref = rec.put_tensor(expected, role="output", name="out")
        blob = rec.root / "blobs" / out_ref.sha256[:2] / f"{out_ref.sha256}.safetensors"
        data = bytearray(blob.read_bytes())
        data[-2] ^= 0x10
        blob.write_bytes(bytes(data))
        refs = {s.name: rec.put_tensor(exported.values[s.name], role=s.role, name=s.name) for s in graph.inputs}
        with pytest.raises(TamperedTensor, match=out_ref.sha256):
            replay_binding(rec, graph, compute_binding(graph, {**refs, "out": out_ref}, "t"))


def test_slice_of_the_input_norm_replays_like_torch(tiny: Any, layer: tuple[Exported, torch.Tensor]) -> None:
    exported, _ = layer
    graph = exported.graph
    first_dot = next(op for op in graph.ops if op.name == "stablehlo.dot_general")
    norm_value = first_dot.operands[0]  # the normalised hidden state, reshaped to (T, hidden)
    producer = next(op for op in graph.ops if norm_value in op.results)
    roots = [op.op_id for op in graph.ops if any(v == "%arg9" for v in op.operands)]  # ops reading "hidden"
    between = compute_slice(graph, compute_ops_between(graph, roots, [producer.op_id]), [norm_value])
    assert "hidden" in {s.name for s in between.inputs}  # plus cut edges (SSA names) from side branches
    assert any(s.name.startswith("cut:%") and s.role == "activation" for s in between.inputs)
    piece = compute_slice(graph, compute_ops_upstream(graph, [producer.op_id]), [norm_value])
    assert piece.parent_id == graph.graph_id and len(piece.ops) < len(graph.ops) // 3
    assert {s.name for s in piece.inputs} == {"hidden", "input_layernorm.weight"}
    assert compute_value_specs(piece)[f"out:{norm_value}"].shape == (T, 128)
    norm = tiny.engine.model.get_decoder().layers[0].input_layernorm
    with torch.no_grad():
        expected = norm(exported.values["hidden"]).reshape(T, 128).numpy()
    inputs = {s.name: exported.values[s.name].numpy() for s in piece.inputs}
    result = replay_arrays(piece, inputs, {f"out:{norm_value}": expected})
    assert is_replay_match(result), result

"""The training step's forward/backward graph: exported, in the record, and the real computation (IREE vs torch)."""

import time

import numpy as np
import pytest
import torch

from node.training.corpus import get_batch_ids, load_corpus
from node.training.model import build_model, compute_declared_init, compute_local_gradient
from node.training.record import export_training_graphs
from node.training.spec import RunSpec
from node.training.train_graph import (
    GRAPH_NAME,
    compute_slice_scatter,
    export_forward_backward,
    get_forward_backward_graph,
)

SPEC = RunSpec(steps=4)
# measured (tiny model, float32, IREE llvm-cpu vs torch autograd with SDPA, step 1's batch of rank 0):
# loss |Δ| = 1.0e-6 (of 10.80), gradients max |Δ| = 5.3e-7, max |Δ| / max |g| = 3.0e-6 — float32 order noise
# (eager vs SDPA attention, IREE's vs torch's reductions); the bounds leave 10× headroom over it
LOSS_TOL = 1e-5
GRAD_ABS_TOL = 5e-6


@pytest.fixture(scope="module")
def exported():
    t0 = time.perf_counter()
    ex = export_forward_backward(SPEC)
    print(f"export {time.perf_counter() - t0:.1f} s, {len(ex.graph.mlir)} chars, {len(ex.graph.ops)} ops")
    return ex


def test_slice_scatter_decomposition_matches_aten():
    base, src = torch.randn(2, 3, 8), torch.randn(2, 3, 4)
    for start, end in ((0, 4), (4, 8), (2, 6), (-4, None)):
        assert torch.equal(compute_slice_scatter(base, src, 2, start, end),
                           torch.slice_scatter(base, src, 2, start, end))


def test_the_forward_backward_is_exported_with_weights_and_ids_as_inputs(exported):
    g = exported.graph
    model = build_model(SPEC)
    params = dict(model.named_parameters())
    assert g.kind == "logical" and g.name == GRAPH_NAME and "dense_resource" not in g.mlir
    assert [s.name for s in g.inputs if s.role == "weight"] == list(params)
    ids = next(s for s in g.inputs if s.name == "input_ids")
    assert ids.role == "input" and tuple(ids.shape) == (SPEC.batch_per_worker, SPEC.seq_len + 1)
    assert [s.name for s in g.outputs] == ["loss", *(f"grad.{n}" for n in params)]
    for s, p in zip(g.outputs[1:], params.values(), strict=True):
        assert tuple(s.shape) == tuple(p.shape)
    assert "stablehlo.dot_general" in g.mlir
    # the weights are inputs: another initialisation exports the same graph (its id is stable across runs)
    assert export_forward_backward(SPEC.model_copy(update={"init_seed": 3})).graph.graph_id == g.graph_id


def test_the_training_graphs_chain_forward_backward_into_the_contribution():
    n = sum(p.numel() for p in build_model(SPEC).parameters())
    fwd_bwd, contribution, distributed, update = export_training_graphs(SPEC, n)
    attrs = dict(fwd_bwd.attrs)
    assert attrs["feeds"] == f"{contribution.graph_id}:grad_local"
    assert distributed.parent_id == contribution.graph_id and update.name == "training.sgd-momentum"
    assert fwd_bwd.graph_id not in {contribution.graph_id, distributed.graph_id, update.graph_id}
    hits = get_forward_backward_graph.cache_info().hits
    again = export_training_graphs(SPEC.model_copy(update={"init_seed": 5, "lsh_nonce": "11" * 32}), n)[0]
    assert again.graph_id == fwd_bwd.graph_id and get_forward_backward_graph.cache_info().hits == hits + 1


def test_iree_replay_of_the_graph_matches_torch_autograd(exported):
    from node.workload.replay import CompiledGraph, compile_graph

    model = build_model(SPEC)
    compute_declared_init(model, 7)  # other weights than the export's example values: they are inputs
    corpus = load_corpus(SPEC.corpus_files, SPEC.seq_len)
    windows = corpus.samples[get_batch_ids(SPEC, len(corpus.samples), 1, 0)]
    loss, grad = compute_local_gradient(model, windows)
    state = {n: p.detach() for n, p in model.named_parameters()}
    state.update({n: b.detach() for n, b in model.named_buffers()})
    args = [state[s.name].numpy() if s.name in state else windows.astype(np.int64) for s in exported.graph.inputs]
    out = CompiledGraph(compile_graph(exported.graph)).run(args)
    got_grad = np.concatenate([o.reshape(-1) for o in out[1:]])
    assert got_grad.shape == grad.shape
    err = np.abs(got_grad - grad.numpy())
    rel = err.max() / np.abs(grad.numpy()).max()
    print(f"loss torch {loss:.7f} iree {float(out[0]):.7f}; grad max|Δ| {err.max():.3g}, max|Δ|/max|g| {rel:.3g}")
    assert abs(float(out[0]) - loss) <= LOSS_TOL
    assert err.max() <= GRAD_ABS_TOL
    offset = 0
    for s, o in zip(exported.graph.outputs[1:], out[1:], strict=True):
        ref = grad.numpy()[offset:offset + o.size].reshape(o.shape)
        offset += o.size
        assert np.isfinite(o).all(), s.name
        assert np.abs(o - ref).max() <= GRAD_ABS_TOL, s.name


def test_the_record_holds_the_forward_backward_graph(tmp_path):
    from node.training.record import record_run
    from node.workload.store import WorkloadRecord

    n = sum(p.numel() for p in build_model(SPEC).parameters())
    fwd_bwd, contribution, distributed, _ = export_training_graphs(SPEC, n)
    with WorkloadRecord.open(tmp_path / "rec") as rec:
        trace_id = record_run(rec, SPEC, tmp_path / "run", n, [])  # no steps logged: graphs and devices only
    with WorkloadRecord.open(tmp_path / "rec", readonly=True) as rec:
        stored = rec.get_graph(fwd_bwd.graph_id)
        assert stored.name == GRAPH_NAME and dict(stored.attrs)["feeds"] == f"{contribution.graph_id}:grad_local"
        assert rec.get_trace(trace_id).graph_id == distributed.graph_id

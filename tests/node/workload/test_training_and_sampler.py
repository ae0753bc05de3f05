"""A data-parallel training step as a distributed graph; the canonical sampler as a StableHLO graph."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from node.protocol.sampler import SamplingParams
from node.workload.demo_models import compute_mlp_step, make_mlp_batch
from node.workload.errors import UnknownObject
from node.workload.export import export_function
from node.workload.graph import compute_all_reduce_graph
from node.workload.model import Device
from node.workload.query import compute_missing, get_graph_summaries, get_logical_graph_id
from node.workload.replay import is_replay_match, replay_arrays
from node.workload.sampler_graph import compile_sampler, export_sampler_graph, measure_sampler_agreement
from node.workload.store import WorkloadRecord

OUTPUTS = ["loss", "grad.w1", "grad.w2"]
ROLES = {"w1": "weight", "w2": "weight", "y": "label"}


def test_manual_backward_matches_autograd() -> None:
    batch = make_mlp_batch(3)
    w1, w2 = batch["w1"].clone().requires_grad_(), batch["w2"].clone().requires_grad_()
    logits = torch.relu(batch["x"] @ w1.T) @ w2.T
    torch.nn.functional.cross_entropy(logits, batch["y"]).backward()
    loss, g1, g2 = compute_mlp_step(**batch)
    torch.testing.assert_close(loss, torch.nn.functional.cross_entropy(logits, batch["y"]))
    assert w1.grad is not None and w2.grad is not None
    torch.testing.assert_close(g1, w1.grad)
    torch.testing.assert_close(g2, w2.grad)


def test_data_parallel_step_records_and_replays(tmp_path: Path) -> None:
    batch = make_mlp_batch(0)
    logical = export_function(compute_mlp_step, batch, name="mlp-step", output_names=OUTPUTS, input_roles=ROLES).graph
    dp = compute_all_reduce_graph(logical, ["grad.w1", "grad.w2"], ((0, 1),), ("r0", "r1"))
    assert [c.kind for c in dp.distribution.collectives] == ["all_reduce", "all_reduce"]  # type: ignore[union-attr]
    assert "stablehlo.all_reduce" in dp.mlir and "replica_groups = dense<[[0, 1]]>" in dp.mlir
    assert compute_all_reduce_graph(logical, ["grad.w1", "grad.w2"], ((0, 1),), ("r0", "r1")).graph_id == dp.graph_id
    other = compute_all_reduce_graph(logical, ["grad.w1", "grad.w2"], ((0,), (1,)), ("r0", "r1"))
    assert other.graph_id != dp.graph_id  # another replica grouping is another distributed graph
    with WorkloadRecord.open(tmp_path / "rec") as rec:
        with pytest.raises(UnknownObject, match="r0"):  # devices first
            rec.put_graph(logical) and rec.put_graph(dp)
        for r in ("r0", "r1"):
            rec.put_device(Device(r, "host", "process", 2**30))
        rec.put_graph(dp)
        assert get_logical_graph_id(rec, dp.graph_id) == logical.graph_id
        assert [s["kind"] for s in get_graph_summaries(rec)] == ["distributed", "logical"]
        assert not compute_missing(rec, logical.graph_id).is_verifiable
    # each replica's local step replays with IREE; the all-reduce is checked as the sum of replica gradients
    replicas = [make_mlp_batch(0), make_mlp_batch(1)]
    for r in replicas[1:]:
        r["w1"], r["w2"] = replicas[0]["w1"], replicas[0]["w2"]  # data parallel: same weights, other data
    local = [compute_mlp_step(**r) for r in replicas]
    for r, out in zip(replicas, local, strict=True):
        result = replay_arrays(logical, {k: v.numpy() for k, v in r.items()},
                               {n: t.numpy() for n, t in zip(OUTPUTS, out, strict=True)})
        assert is_replay_match(result), result
    reduced = local[0][1] + local[1][1]
    assert not torch.allclose(reduced, local[0][1] * 2)  # the replicas really saw different data


@pytest.fixture(scope="module")
def small_sampler():  # type: ignore[no-untyped-def]
    return compile_sampler(export_sampler_graph(vocab=512, k=5))


@pytest.mark.parametrize("params", [SamplingParams(0.7, 0.9, 50), SamplingParams(1.0), SamplingParams(1.3, 0.95)],
                         ids=str)
def test_sampler_graph_picks_like_the_protocol(small_sampler, params: SamplingParams) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(7)
    rows = [(rng.normal(size=512).astype(np.float32) * 3, int(rng.integers(0, 2**32))) for _ in range(40)]
    agreement = measure_sampler_agreement(small_sampler, rows, params, 5)
    # measured on this CPU: every pick and candidate list equal; weights differ by a few units of 2^-32
    # (IREE's exp and reduction order differ from numpy's), which moves a pick only when v lies that close
    # to a boundary
    assert agreement.candidates_equal == agreement.positions
    assert agreement.chosen_equal == agreement.positions
    assert agreement.max_weight_diff < 2**16


def test_split_a_batched_step_into_examples() -> None:
    from node.workload.bind import compute_example_inputs
    from node.workload.replay import run_and_compare

    batch = make_mlp_batch(5, batch=4)
    one = compute_example_inputs(batch, {"x", "y"}, 0)
    graph = export_function(compute_mlp_step, one, name="mlp-step-b1", output_names=OUTPUTS, input_roles=ROLES).graph
    grads = []
    for i in range(4):
        inputs = {k: v.numpy() for k, v in compute_example_inputs(batch, {"x", "y"}, i).items()}
        _, outs = run_and_compare(graph, inputs, {})
        grads.append(outs[1])
    _, batch_grad_w1, _ = compute_mlp_step(**batch)
    np.testing.assert_allclose(np.mean(grads, axis=0), batch_grad_w1.numpy(), atol=1e-6)


def test_a_real_gloo_step_is_recorded_and_replayed(tmp_path: Path) -> None:
    from node.workload.bind import compute_order_violations
    from node.workload.demo import record_training_step

    with WorkloadRecord.open(tmp_path / "rec") as rec:
        graph_id, matches, worst = record_training_step(rec, lambda _s: None)
        [trace] = rec.traces()
        assert trace.graph_id == graph_id and rec.get_graph(graph_id).kind == "distributed"
        assert sorted(e.kind for e in trace.events) == ["collective"] * 4 + ["step"] * 2
        assert compute_order_violations(rec.get_graph(graph_id), trace) == []
    assert matches == 2 and worst < 1e-6  # gloo's sum vs the sum of the IREE-replayed local gradients

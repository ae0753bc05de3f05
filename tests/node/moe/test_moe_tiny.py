"""MoE commitments and duties on the tiny random Mixtral and on an upcycled tiny llama (fast)."""

import dataclasses

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from node.engines.models import get_model_spec, materialise_model
from node.moe.attacks import ATTACKS
from node.moe.calibration import Duties, TokenSequence, fit_limits, run_campaign, summarise
from node.moe.model import TINY_MOE_NAME, UpcycleSpec, build_upcycled_moe, materialise_moe
from node.moe.trace import build_commitment, record_trace
from node.moe.validate import (
    MoeLimits,
    decide_expert,
    decide_link,
    load_expert,
    load_router,
    load_shared,
    verify_expert,
    verify_link,
    verify_router,
)
from node.protocol.moe import ExpertKey, InvalidMoe, MoeReason, find_routing_gaps, verify_expert_leaves

TOKENS = [1, *range(200, 240)]


@pytest.fixture(scope="module")
def tiny_moe():
    torch.set_num_threads(1)
    folder = materialise_moe(TINY_MOE_NAME)
    return folder, AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def honest(tiny_moe):
    _, model = tiny_moe
    trace = record_trace(model, TOKENS)
    return trace, build_commitment(trace)


def test_every_routed_position_has_one_leaf_in_its_experts_tree(honest):
    trace, c = honest
    assert len(c.router) == trace.num_layers * len(TOKENS)
    assert sum(len(v) for v in c.experts.values()) == trace.num_layers * len(TOKENS) * 2  # top-2
    assert find_routing_gaps(c) == []
    root = c.root()
    for key in c.expert_keys():
        assert verify_expert_leaves(c.leaves_of(key), c.expert_proof(key), root)


def test_recorded_expert_outputs_mix_into_the_models_own_block_output(honest):
    trace, c = honest
    for layer in range(trace.num_layers):
        mixed = np.zeros_like(trace.mixed[layer])
        for e in range(trace.num_experts):
            rows = trace.outputs.get(ExpertKey(layer, e))
            if rows is not None:
                w = np.array([x.weight for x in c.leaves_of(ExpertKey(layer, e))], dtype=np.float32)[:, None]
                np.add.at(mixed, rows.positions, rows.outputs * w)
        assert np.max(np.abs(mixed - trace.mixed[layer])) < 1e-6 * max(1.0, float(np.max(np.abs(mixed))))


def test_one_expert_loads_alone_and_an_unknown_expert_is_a_typed_error(tiny_moe):
    folder, model = tiny_moe
    w = load_expert(folder, ExpertKey(1, 2))
    experts = model.model.layers[1].mlp.experts
    assert torch.equal(w.gate_up, experts.gate_up_proj.data[2]) and torch.equal(w.down, experts.down_proj.data[2])
    assert w.nbytes() == (experts.gate_up_proj[2].numel() + experts.down_proj[2].numel()) * 4
    for bad in (ExpertKey(1, 4), ExpertKey(7, 0)):
        with pytest.raises(InvalidMoe) as info:
            load_expert(folder, bad)
        assert info.value.moe_reason == MoeReason.EXPERT_UNKNOWN and str(bad) in str(info.value)


def test_honest_duties_measure_no_difference_and_accept(tiny_moe, honest):
    folder, _ = tiny_moe
    trace, c = honest
    limits = MoeLimits(1e-4, 0, 1e-4, 1e-4)
    for key in c.expert_keys():
        check = verify_expert(load_expert(folder, key), c.leaves_of(key), trace.get_expert_inputs(key), row_block=1)
        assert decide_expert(check, limits) == MoeReason.OK, check
    rl = [r for r in c.router if r.layer == 1]
    router = verify_router(load_router(folder, 1), rl, trace.inputs[1, [r.position for r in rl]])
    assert router.choice_mismatches == 0 and router.max_weight_error < 1e-6
    link = verify_link(load_shared(folder), TOKENS, c, trace)
    assert decide_link(link, limits) == MoeReason.OK and link.max_input_rel_error < 1e-6


def test_a_tampered_input_row_is_named_by_its_position(tiny_moe, honest):
    folder, _ = tiny_moe
    trace, c = honest
    key = ExpertKey(0, 1)
    rows = trace.get_expert_inputs(key).copy()
    rows[3, 0] += 1e-3
    check = verify_expert(load_expert(folder, key), c.leaves_of(key), rows)
    assert check.input_hash_mismatches == 1 and check.first_bad_position == c.leaves_of(key)[3].position
    assert decide_expert(check, MoeLimits(1e-4, 0, 1e-4, 1e-4)) == MoeReason.EXPERT_INPUT_HASH_MISMATCH


def test_a_payload_output_that_is_not_the_committed_one_fails_the_link(tiny_moe, honest):
    folder, _ = tiny_moe
    trace, c = honest
    key = ExpertKey(1, 0)
    rows = trace.outputs[key]
    changed = dataclasses.replace(rows, outputs=rows.outputs * 1.001)
    link = verify_link(load_shared(folder), TOKENS, c, dataclasses.replace(trace, outputs={**trace.outputs,
                                                                                            key: changed}))
    assert link.output_hash_mismatches == len(rows.positions)


def test_tiny_campaign_each_attack_caught_by_its_duty_and_no_honest_rejection(tiny_moe):
    folder, model = tiny_moe
    seqs = [TokenSequence(tuple(TOKENS[:10 + i]), tuple(range(300 + 7 * i, 320 + 7 * i))) for i in range(4)]
    results = list(run_campaign(model, Duties(folder, load_shared(folder)), seqs, ATTACKS))
    limits = fit_limits(results)
    table = summarise(results, limits)
    assert table["honest"]["any"] == 0.0
    assert table["int8-expert"]["expert"] == 1.0 and table["swapped-expert"]["expert"] == 1.0
    assert table["cheap-router"]["router"] == 1.0
    assert table["cheap-router"]["link"] == 1.0  # the link holds every router and recomputes routing too
    # the forgery passes the expert's own holder: only the link duty (shared layers) sees it
    assert table["forged-inputs"]["expert"] == 0.0 and table["forged-inputs"]["link"] == 1.0


def test_upcycling_without_noise_reproduces_the_dense_model(tmp_path):
    dense = materialise_model(get_model_spec("tiny-llama")).path
    build_upcycled_moe(dense, tmp_path, UpcycleSpec(num_experts=4, top_k=2, noise=0.0, seed=3))
    moe = AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    ref = AutoModelForCausalLM.from_pretrained(str(dense), dtype=torch.float32).eval()
    ids = torch.tensor([TOKENS])
    with torch.no_grad():
        a, b = moe(ids).logits, ref(ids).logits
    assert torch.max(torch.abs(a - b)).item() < 1e-4  # top-2 weights sum to 1 over identical experts
    perturbed = tmp_path / "noisy"
    perturbed.mkdir()
    build_upcycled_moe(dense, perturbed, UpcycleSpec(noise=0.02, seed=3))
    noisy = AutoModelForCausalLM.from_pretrained(str(perturbed), dtype=torch.float32).eval()
    e = noisy.model.layers[0].mlp.experts.gate_up_proj.data
    assert not torch.equal(e[0], e[1])
    mlp = ref.model.layers[0].mlp
    ratio = e[0] / torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).detach()
    assert 0.015 < float(ratio.std()) < 0.025  # the declared σ = 0.02


def test_a_consistent_forgery_has_no_hash_conflict_but_fails_the_link_walk(tiny_moe):
    from node.moe.attacks import forge_inputs_consistently
    from node.moe.validate import count_input_hash_conflicts

    folder, model = tiny_moe
    key = ExpertKey(0, 1)  # layer 0: the walk has a next layer to compare
    trace = forge_inputs_consistently(model, TOKENS, key, 2)
    c = build_commitment(trace)
    assert count_input_hash_conflicts(c) == 0
    check = verify_expert(load_expert(folder, key), c.leaves_of(key), trace.get_expert_inputs(key))
    assert decide_expert(check, MoeLimits(1e-4, 0, 1e-4, 1e-4)) == MoeReason.OK  # its holder is fooled
    link = verify_link(load_shared(folder), TOKENS, c, trace)
    assert link.worst_layer == 0 and decide_link(link, MoeLimits(1e-4, 0, 1e-4, 1e-4)) == MoeReason.LINK_MISMATCH


def test_link_walks_on_one_shared_model_from_many_threads_equal_the_walks_one_at_a_time(tiny_moe, honest):
    """The devnet's validators share one loaded model: concurrent walks must neither mix nor leave stand-ins."""
    from concurrent.futures import ThreadPoolExecutor

    folder, _ = tiny_moe
    trace, c = honest
    shared = load_shared(folder)
    blocks = [layer.mlp for layer in shared.model.layers]
    key = ExpertKey(1, 0)
    rows = trace.outputs[key]
    forged = dataclasses.replace(trace, outputs={**trace.outputs,
                                                 key: dataclasses.replace(rows, outputs=rows.outputs * 1.01)})
    cases = [trace, forged] * 6
    alone = [verify_link(shared, TOKENS, c, t) for t in cases[:2]]
    with ThreadPoolExecutor(6) as pool:
        together = list(pool.map(lambda t: verify_link(shared, TOKENS, c, t), cases))
    assert together == alone * 6
    assert [layer.mlp for layer in shared.model.layers] == blocks

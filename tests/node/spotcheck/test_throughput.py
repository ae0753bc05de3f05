"""The declared-throughput check: step cost from the model's shape, work and device time, the idle-capacity verdict."""

from dataclasses import replace

import pytest
from transformers import LlamaConfig, LlamaForCausalLM

from node.spotcheck.errors import InvalidSpotParams
from node.spotcheck.sim import get_model_shape
from node.spotcheck.throughput import ModelShape, compute_meter_seconds, compute_overlap_steps, compute_step_flops
from node.spotcheck.verify import WindowMeasurement, decide_window
from tests.node.spotcheck.test_verify import DECL, POLICY, STEPS, blocks, measure_window  # noqa: F401

S = 1_000_000_000
TINY = ModelShape(layers=2, hidden=128, intermediate=256, heads=4, kv_heads=2, vocab=49152)


def test_a_step_costs_what_its_matmuls_count():
    # per layer and token: q, o 128·128, k, v 128·64, gate/up/down 128·256; attention 2·32²·128; lm_head 128·49152
    per_token = 2 * 128 * 128 + 2 * 128 * 64 + 3 * 128 * 256
    expected = 2 * (2 * (32 * per_token + 2 * 32 * 32 * 128) + 128 * 49152)
    assert compute_step_flops(TINY, 32) == expected == 32_505_856


def test_the_step_cost_matches_torch_s_own_flop_count():
    """The analytic count against torch's FlopCounterMode on a real llama forward (window, last logits)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    config = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                         attn_implementation="eager")  # explicit matmuls: torch's counter skips fused SDPA
    model = LlamaForCausalLM(config).eval()
    ids = torch.zeros((1, 24), dtype=torch.int64)
    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        hidden = model.model(input_ids=ids).last_hidden_state
        model.lm_head(hidden[:, -1])
    assert compute_step_flops(get_model_shape(model), 24) == counter.get_total_flops()


def test_a_shape_that_is_not_a_llama_is_refused():
    with pytest.raises(InvalidSpotParams):
        ModelShape(layers=2, hidden=130, intermediate=256, heads=4, kv_heads=2, vocab=10)
    with pytest.raises(InvalidSpotParams):
        compute_step_flops(TINY, 0)


def test_steps_count_by_their_share_inside_the_window():
    steps = [(0, 10), (10, 20), (20, 30)]
    assert compute_overlap_steps(steps, 0, 30) == 3
    assert compute_overlap_steps(steps, 5, 25) == pytest.approx(2.0)
    assert compute_overlap_steps(steps, 30, 40) == 0
    assert compute_overlap_steps([(7, 7)], 0, 10) == 1  # an instantaneous step counts where it ends


def test_the_meter_is_interpolated_and_only_its_span_counts():
    samples = [(0, 0), (10 * S, 4 * S), (20 * S, 6 * S)]
    assert compute_meter_seconds(samples, 0, 20 * S) == pytest.approx(6.0)
    assert compute_meter_seconds(samples, 5 * S, 15 * S) == pytest.approx(3.0)  # 2 s + 1 s
    assert compute_meter_seconds(samples, 15 * S, 40 * S) == pytest.approx(1.0)  # nothing after the last sample
    assert compute_meter_seconds(samples[:1], 0, S) is None


def measurement(declared_flops: float, capacity_flops: float, registry: float = 1e9, catalog: float = 1e9
                ) -> WindowMeasurement:
    return WindowMeasurement("dev", 0, 10, 5, 5, 0, 0, 0, 0, 0, 0, (5.0,) * 10, (0,) * 5, 100, 100, 100,
                             declared_steps=1.0, declared_flops=declared_flops, device_s=1.0,
                             capacity_flops=capacity_flops, registry_flops=registry, catalog_flops=catalog)


def test_idle_capacity_fails_below_the_least_utilisation_only():
    policy = POLICY.model_copy(update={"min_utilisation": 0.5})
    assert decide_window(measurement(0.6e9, 1e9), policy).passed
    assert decide_window(measurement(0.4e9, 1e9), policy).failures == ("idle_capacity",)
    assert decide_window(measurement(0.0, 0.0), policy).failures == ("idle_capacity",)  # no capacity accounted
    assert decide_window(measurement(0.4e9, 1e9), POLICY).passed  # the check is off without a threshold


def test_a_registered_compute_that_is_not_the_catalogue_s_is_a_capacity_failure():
    assert decide_window(measurement(1e9, 1e9, registry=2e9), POLICY).failures == ("capacity",)


def test_measure_window_counts_declared_work_against_the_catalogue(blocks):  # noqa: F811
    # ten steps of 10 ms each between 0 and 910 ms; a window [0, 1 s) on a device of 1 GFLOP/s at half share
    decl = replace(DECL, registry_flops=1e9, catalog_flops=1e9, achieved_share=0.5, step_flops=10_000_000)
    m = measure_window(decl, 0, STEPS, [], blocks, lambda s: None, bounds_ns=(0, S), device_s=0.2)
    assert m.declared_steps == pytest.approx(10) and m.declared_flops == pytest.approx(1e8)
    assert m.capacity_flops == pytest.approx(1e8) and m.utilisation == pytest.approx(1.0)
    wall = measure_window(decl, 0, STEPS, [], blocks, lambda s: None, bounds_ns=(0, S))  # a dedicated device
    assert wall.device_s == 1.0 and wall.utilisation == pytest.approx(0.2)


def test_a_fabricated_step_fails_the_token_audit():
    """A step recorded with a token its logits do not give (recorded, not computed) is a fabricated step."""
    import numpy as np

    from node.spotcheck.workload import InferenceWorkload, WorkloadReplayer, build_model, compute_prompt

    model = build_model()
    workload = InferenceWorkload(model, compute_prompt(3, 8, int(model.config.vocab_size)), sampling_seed=3)
    for _ in range(4):
        workload.step()
    fake = workload.fabricate_step(np.random.default_rng(0))
    workload.step()
    replayer = WorkloadReplayer(model, np.asarray(workload.tokens), 8, sampling_seed=3)
    assert [replayer.check_token(s) for s in range(4)] == [True] * 4
    assert replayer.check_token(fake) is False and replayer.check_token(fake + 1) is True
    assert replayer.check_token(fake + 2) is None  # past the recorded tokens: nothing to check
    assert WorkloadReplayer(model, np.asarray(workload.tokens), 8, sampling_seed=4).check_token(0) is False
    m = measure_window(DECL, 0, STEPS, [], blocks_of(), lambda s: None, audited=[0, fake, fake + 2],
                       check_token=replayer.check_token)
    assert (m.audited_steps, m.fabricated_steps) == (2, 1)
    assert set(decide_window(m, POLICY).failures) == {"fabricated_step", "too_few_challenges"}  # no exchanges here


def blocks_of():
    import numpy as np

    from node.spotcheck.stuffing import compute_stuffing
    from tests.node.spotcheck.test_verify import PARAMS, SEED

    out = np.empty((PARAMS.n_blocks, PARAMS.words), dtype=np.uint64)
    compute_stuffing(SEED, PARAMS, out)
    return out

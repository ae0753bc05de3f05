"""A validator configured with one expert holds only it and judges only what it was assigned (tiny MoE)."""

import pydantic
import pytest
import torch
from transformers import AutoModelForCausalLM

from node.moe.attacks import int8_expert
from node.moe.config import DutyValidator, MoeDutiesConfig
from node.moe.model import TINY_MOE_NAME, materialise_moe
from node.moe.trace import build_commitment, record_trace
from node.moe.validate import MoeLimits
from node.protocol.moe import ROUTER, ExpertKey, InvalidMoe, MoeReason, compute_expert_assignment

TOKENS = [1, *range(400, 430)]
LIMITS = MoeLimits(1e-4, 0, 1e-4, 1e-4)


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)
    folder = materialise_moe(TINY_MOE_NAME)
    return folder, AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()


def test_config_takes_canonical_distinct_duties_only():
    assert MoeDutiesConfig(experts=("layer1.e0", "layer1.router")).keys() == {ExpertKey(1, 0), ExpertKey(1, ROUTER)}
    assert MoeDutiesConfig().keys() is None
    for bad in (("layer1.e0", "layer1.e0"), ("layer01.e0",), ("expert5",)):
        with pytest.raises(pydantic.ValidationError):
            MoeDutiesConfig(experts=bad)


def test_one_expert_validator_holds_one_expert_and_catches_it_quantised(tiny):
    folder, model = tiny
    key = ExpertKey(1, 2)
    validator = DutyValidator(folder, MoeDutiesConfig(experts=(str(key),)), LIMITS)
    experts = model.model.layers[1].mlp.experts
    assert validator.weight_bytes() == (experts.gate_up_proj[2].numel() + experts.down_proj[2].numel()) * 4
    honest = record_trace(model, TOKENS)
    assert validator.check(build_commitment(honest), honest, TOKENS, [key]) == {str(key): MoeReason.OK}
    with int8_expert(model, key):
        cheat = record_trace(model, TOKENS)
    assert validator.check(build_commitment(cheat), cheat, TOKENS, [key]) == {
        str(key): MoeReason.EXPERT_FINGERPRINT_MISMATCH}
    with pytest.raises(InvalidMoe, match=r"layer1\.e3"):
        validator.check(build_commitment(honest), honest, TOKENS, [ExpertKey(1, 3)])


def test_a_drawn_validator_loads_a_duty_it_did_not_preload(tiny):
    # the draw takes every validator, whatever it preloads (issue 30, finding 4): a duty not configured is loaded
    folder, model = tiny
    trace = record_trace(model, TOKENS)
    c = build_commitment(trace)
    configs = {bytes([i]) * 20: MoeDutiesConfig(experts=(f"layer{i // 8}.e{i % 4}", f"layer{i // 8}.router"))
               for i in range(16)}
    configs[b"\xff" * 20] = MoeDutiesConfig(experts=("shared",))
    holders = [cfg.holder(address, 100) for address, cfg in configs.items()]
    duties = [k for k in c.experts if c.experts[k]] + [ExpertKey(0, ROUTER), ExpertKey(1, ROUTER)]
    assignment = compute_expert_assignment(b"\x42" * 32, duties, holders, 2)
    loaded_on_demand = 0
    for key, chosen in assignment.items():
        for address in chosen:
            validator = DutyValidator(folder, configs[address], LIMITS)
            if not validator.holds(key):
                loaded_on_demand += 1
                validator.load(key)
            assert validator.check(c, trace, TOKENS, [key]) == {str(key): MoeReason.OK}
    assert loaded_on_demand > 0  # preloaded duties narrowed nothing

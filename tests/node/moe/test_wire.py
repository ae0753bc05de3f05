"""The duty slice: what one MoE duty fetches, bound to moeRoot alone; every tampering a typed error or a rejection."""

import struct

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from node.moe.attacks import int8_expert
from node.moe.config import DutyValidator, MoeDutiesConfig
from node.moe.model import TINY_MOE_NAME, materialise_moe
from node.moe.trace import build_commitment, record_trace
from node.moe.validate import MoeLimits
from node.moe.wire import MAX_SLICE, MoeShape, decode_duty_slice, encode_duty_slice
from node.protocol.moe import ExpertKey, InvalidMoe, MoeReason, expert_leaf_size

PROMPT = [1, *range(200, 220)]
OUTPUT = list(range(300, 321))
FED = [*PROMPT, *OUTPUT[:-1]]
LIMITS = MoeLimits(1e-4, 0, 1e-4, 1e-4)
DUTIES = ("layer1.e2", "layer0.e0", "layer1.router", "shared")


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)
    folder = materialise_moe(TINY_MOE_NAME)
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    config = model.config
    shape = MoeShape(config.num_hidden_layers, config.num_local_experts, config.num_experts_per_tok,
                     config.hidden_size)
    trace = record_trace(model, FED)
    validator = DutyValidator(folder, MoeDutiesConfig(experts=DUTIES), LIMITS)
    return folder, model, shape, trace, build_commitment(trace), validator


def _slice(trace, commitment, duty):
    return encode_duty_slice(commitment, trace, ExpertKey.parse(duty), PROMPT, OUTPUT, b"\x01" * 32, b"\x02" * 32)


@pytest.mark.parametrize("duty", DUTIES)
def test_an_honest_slice_decodes_against_moe_root_and_its_duty_accepts(tiny, duty):
    _, _, shape, trace, c, validator = tiny
    piece = decode_duty_slice(_slice(trace, c, duty), ExpertKey.parse(duty), c.root(), shape)
    assert validator.check_slice(piece) is MoeReason.OK
    if duty == "shared":
        assert (piece.prompt_ids, piece.output_ids) == (tuple(PROMPT), tuple(OUTPUT))
        assert np.array_equal(piece.inputs, trace.inputs)
        assert (piece.artifact_root, piece.fingerprint_hash) == (b"\x01" * 32, b"\x02" * 32)


def test_an_expert_slice_carries_only_that_experts_leaves_and_rows(tiny):
    _, _, shape, trace, c, _ = tiny
    key = ExpertKey(1, 2)
    raw = _slice(trace, c, "layer1.e2")
    n = len(c.leaves_of(key))
    head = 4 + 1 + 4 + 8 + 4 + 32 + shape.layers * shape.experts * 36
    assert len(raw) == head + n * (expert_leaf_size() + 4 * shape.hidden)


def test_the_int8_expert_is_rejected_from_its_slice_alone(tiny):
    _, model, shape, _, _, validator = tiny
    key = ExpertKey(1, 2)
    with int8_expert(model, key):
        trace = record_trace(model, FED)
    c = build_commitment(trace)
    piece = decode_duty_slice(_slice(trace, c, "layer1.e2"), key, c.root(), shape)
    assert validator.check_slice(piece) is MoeReason.EXPERT_FINGERPRINT_MISMATCH
    other = decode_duty_slice(_slice(trace, c, "layer0.e0"), ExpertKey(0, 0), c.root(), shape)
    assert validator.check_slice(other) is MoeReason.OK  # the attack touched nothing else


def test_a_slice_for_another_root_duty_or_shape_is_a_typed_error(tiny):
    _, _, shape, trace, c, _ = tiny
    raw = _slice(trace, c, "layer1.e2")
    cases = [(raw, ExpertKey(1, 2), b"\x00" * 32, shape, MoeReason.EXPERT_ROOT_MISMATCH),
             (raw, ExpertKey(1, 3), c.root(), shape, MoeReason.MOE_MALFORMED),
             (raw, ExpertKey(1, 2), c.root(), MoeShape(shape.layers, shape.experts, shape.top_k, shape.hidden + 1),
              MoeReason.MOE_MALFORMED),
             (raw[:-1], ExpertKey(1, 2), c.root(), shape, MoeReason.MOE_MALFORMED),
             (raw + b"\x00", ExpertKey(1, 2), c.root(), shape, MoeReason.MOE_MALFORMED),
             (b"", ExpertKey(1, 2), c.root(), shape, MoeReason.MOE_MALFORMED),
             (b"\x00" * (MAX_SLICE + 1), ExpertKey(1, 2), c.root(), shape, MoeReason.MOE_MALFORMED)]
    for data, key, root, want_shape, reason in cases:
        with pytest.raises(InvalidMoe) as info:
            decode_duty_slice(data, key, root, want_shape)
        assert info.value.moe_reason is reason


def test_a_changed_leaf_count_or_leaf_byte_does_not_rebuild_the_root(tiny):
    _, _, shape, trace, c, _ = tiny
    raw = bytearray(_slice(trace, c, "layer1.e2"))
    head = 4 + 1 + 4 + 8 + 4 + 32
    index = 1 * shape.experts + 2
    count = struct.unpack_from(">I", raw, head + 36 * index)[0]
    flipped = bytearray(raw)
    flipped[head + shape.layers * shape.experts * 36 + 20] ^= 1  # inside the first leaf's input hash
    for data in (bytes(flipped),):
        with pytest.raises(InvalidMoe) as info:
            decode_duty_slice(data, ExpertKey(1, 2), c.root(), shape)
        assert info.value.moe_reason is MoeReason.EXPERT_ROOT_MISMATCH
    fewer = bytearray(raw)
    struct.pack_into(">I", fewer, head + 36 * index, count - 1)  # the summary no longer opens moeRoot
    with pytest.raises(InvalidMoe) as info:
        decode_duty_slice(bytes(fewer), ExpertKey(1, 2), c.root(), shape)
    assert info.value.moe_reason is MoeReason.EXPERT_ROOT_MISMATCH


def test_served_rows_that_are_not_the_committed_ones_are_rejected_by_the_duty(tiny):
    _, _, shape, trace, c, validator = tiny
    for duty, reason in (("layer1.e2", MoeReason.EXPERT_INPUT_HASH_MISMATCH),
                         ("layer1.router", MoeReason.EXPERT_INPUT_HASH_MISMATCH),
                         ("shared", MoeReason.EXPERT_INPUT_HASH_MISMATCH)):
        raw = bytearray(_slice(trace, c, duty))
        if duty == "shared":  # the first input row sits after the tokens, router leaves and expert leaves
            rows_at = len(raw) - 4 * shape.hidden * (trace.inputs.shape[0] * trace.inputs.shape[1]
                                                     + sum(len(v) for v in c.experts.values()))
        else:
            rows_at = len(raw) - 4 * shape.hidden * (len(c.leaves_of(ExpertKey(1, 2))) if duty != "layer1.router"
                                                     else trace.inputs.shape[1])
        raw[rows_at + 2] ^= 0x40
        piece = decode_duty_slice(bytes(raw), ExpertKey.parse(duty), c.root(), shape)
        assert validator.check_slice(piece) is reason, duty


def test_a_nan_row_is_a_typed_error_not_a_crash(tiny):
    _, _, shape, trace, c, validator = tiny
    raw = bytearray(_slice(trace, c, "layer1.e2"))
    rows_at = len(raw) - 4 * shape.hidden * len(c.leaves_of(ExpertKey(1, 2)))
    raw[rows_at:rows_at + 4] = struct.pack(">f", float("nan"))
    piece = decode_duty_slice(bytes(raw), ExpertKey(1, 2), c.root(), shape)
    with pytest.raises(InvalidMoe) as info:
        validator.check_slice(piece)
    assert info.value.moe_reason is MoeReason.MOE_MALFORMED


def test_a_duty_the_validator_does_not_hold_is_refused(tiny):
    _, _, shape, trace, c, validator = tiny
    piece = decode_duty_slice(_slice(trace, c, "layer0.e1"), ExpertKey(0, 1), c.root(), shape)
    with pytest.raises(InvalidMoe) as info:
        validator.check_slice(piece)
    assert info.value.moe_reason is MoeReason.EXPERT_UNKNOWN


@pytest.mark.parametrize("duty", DUTIES)
def test_the_readers_cap_bounds_every_honest_slice_and_is_exact_for_router_and_link(tiny, duty):
    from node.moe.wire import compute_max_slice_size

    _, _, shape, trace, c, _ = tiny
    raw = _slice(trace, c, duty)
    cap = compute_max_slice_size(shape, ExpertKey.parse(duty), max_positions=len(FED))
    assert len(raw) == cap if duty in ("shared", "layer1.router") else len(raw) < cap

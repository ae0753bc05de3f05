import pytest
import torch

from node.protocol.ledger import InvalidTraining, TrainingReason
from node.training.model import TrainState, compute_lr, compute_update
from node.training.shadow import ShadowState
from node.training.spec import RunSpec

SPEC = RunSpec(keep_checkpoints=3, steps=10)


def direct(grads):
    s = TrainState(0, torch.ones(4), torch.zeros(4))
    out = [s]
    for t, g in enumerate(grads, start=1):
        s = compute_update(s, g, compute_lr(SPEC, t), SPEC.momentum)
        out.append(s)
    return out


def test_shadow_lags_one_step_and_serves_the_last_k_states():
    grads = [torch.full((4,), float(t)) for t in range(1, 7)]
    expected = direct(grads)
    shadow = ShadowState(SPEC, expected[0])
    for t, g in enumerate(grads, start=1):
        shadow.on_gradient(t, g)
        assert shadow.latest.step == t - 1  # Z(t−1) while the workers hold Z(t)
    for t in (3, 4, 5, 6):
        assert torch.equal(shadow.get_state(t).params, expected[t].params)
        assert torch.equal(shadow.get_state(t).momentum, expected[t].momentum)
    with pytest.raises(InvalidTraining) as e:
        shadow.get_state(2)
    assert e.value.training_reason == TrainingReason.CHECKPOINT_MISSING


def test_shadow_refuses_a_gradient_out_of_order():
    shadow = ShadowState(SPEC, TrainState(0, torch.ones(4), torch.zeros(4)))
    shadow.on_gradient(1, torch.ones(4))
    shadow.on_gradient(3, torch.ones(4))
    with pytest.raises(InvalidTraining):
        shadow.on_gradient(4, torch.ones(4))

import itertools

import numpy as np
import pytest
import torch

from node.protocol.ledger import InvalidTraining, TrainingReason
from node.training.corpus import load_corpus
from node.training.model import (
    TrainState,
    build_model,
    compute_local_gradient,
    compute_lr,
    compute_update,
    get_params_vector,
    state_from_vector,
)
from node.training.spec import RunSpec

SPEC = RunSpec(steps=10, warmup_steps=2)


def test_declared_init_is_reproducible_from_the_seed():
    a = get_params_vector(build_model(SPEC))
    assert torch.equal(a, get_params_vector(build_model(SPEC)))
    assert not torch.equal(a, get_params_vector(build_model(SPEC.model_copy(update={"init_seed": 1}))))


def test_update_is_torch_sgd_with_momentum():
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(50))
    opt = torch.optim.SGD([p], lr=0.1, momentum=0.9)
    state = TrainState(0, p.detach().clone(), torch.zeros(50))
    for _ in range(3):
        g = torch.randn(50)
        p.grad = g.clone()
        opt.step()
        state = compute_update(state, g, 0.1, 0.9)
    assert torch.allclose(state.params, p.detach(), atol=1e-6)
    assert state.step == 3


def test_schedule_warms_up_then_decays():
    lrs = [compute_lr(SPEC, t) for t in range(1, 11)]
    assert lrs[0] == SPEC.lr_peak / 2 and lrs[1] == SPEC.lr_peak
    assert all(a >= b for a, b in itertools.pairwise(lrs[1:])) and lrs[-1] >= 0.1 * SPEC.lr_peak - 1e-12


def test_local_gradient_is_deterministic_and_batch_dependent():
    torch.set_num_threads(1)
    model = build_model(SPEC)
    samples = load_corpus(SPEC.corpus_files, SPEC.seq_len).samples
    loss, g = compute_local_gradient(model, samples[:2])
    assert np.isfinite(loss) and loss > 5
    assert torch.equal(g, compute_local_gradient(model, samples[:2])[1])
    assert not torch.equal(g, compute_local_gradient(model, samples[2:4])[1])


@pytest.mark.parametrize("z,reason", [
    (np.zeros(10, dtype=np.float64), TrainingReason.CHECKPOINT_DTYPE),
    (np.zeros(9, dtype=np.float32), TrainingReason.CHECKPOINT_SHAPE),
    (np.array([0, 0, 0, 0, np.nan, 0, 0, 0, 0, 0], dtype=np.float32), TrainingReason.CHECKPOINT_NON_FINITE),
])
def test_bad_checkpoints_are_typed_errors(z, reason):
    with pytest.raises(InvalidTraining) as e:
        state_from_vector(3, z, 5)
    assert e.value.training_reason == reason and "step 3" in str(e.value)


def test_state_round_trips_through_its_vector():
    z = np.arange(10, dtype=np.float32)
    s = state_from_vector(1, z, 5)
    assert np.array_equal(s.vector(), z)


def test_named_values_are_read_without_building_z():
    import numpy as np
    import torch

    from node.training.model import TrainState, get_named_values

    state = TrainState(3, torch.arange(10, dtype=torch.float32), -torch.arange(10, dtype=torch.float32) - 1)
    positions = np.array([0, 4, 9, 10, 15, 19])
    assert get_named_values(state, positions).tolist() == state.vector()[positions].tolist()

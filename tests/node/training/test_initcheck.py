import numpy as np
import pytest
import torch
from safetensors import safe_open

from node.engines.models import get_model_spec, materialise_model
from node.training.initcheck import compute_init_measurement, is_init_accepted
from node.training.model import build_model, get_params_vector
from node.training.spec import SMOLLM2_135M, RunSpec

ALPHA = 1e-3


def measure(spec: RunSpec, params: np.ndarray):
    return compute_init_measurement(spec, params, sample=200_000, seed=5)


def test_honest_inits_pass_over_several_seeds():
    for seed in range(8):
        spec = RunSpec(init_seed=100 + seed)
        m = measure(spec, get_params_vector(build_model(spec)).numpy())
        assert m.norms_exact and m.tensors == 15
        assert is_init_accepted(m, ALPHA), m


@pytest.mark.parametrize("std", [0.018, 0.022])
def test_a_wrong_scale_is_rejected(std):
    spec = RunSpec()
    model = build_model(spec)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 2:
                p.normal_(0, std, generator=torch.Generator().manual_seed(3))
    m = measure(spec, get_params_vector(model).numpy())
    assert not is_init_accepted(m, ALPHA) and m.min_p_value < 1e-6


def test_moved_norms_are_rejected():
    spec = RunSpec()
    params = get_params_vector(build_model(spec)).numpy().copy()
    params[-1] = 1.001  # the final norm's last weight
    assert not is_init_accepted(measure(spec, params), ALPHA)


def test_the_real_smollm2_weights_are_not_a_declared_init():
    files = materialise_model(get_model_spec("smollm2-135m-instruct"))
    spec = RunSpec(shape=SMOLLM2_135M)
    model = build_model(spec)
    with safe_open(str(files.path / "model.safetensors"), "pt") as f:
        state = {k: f.get_tensor(k) for k in f.keys()}
    missing = model.load_state_dict(state, strict=False)
    assert not [k for k in missing.missing_keys if k != "lm_head.weight"]  # tied to the embedding
    m = measure(spec, get_params_vector(model).numpy())
    assert not is_init_accepted(m, ALPHA)
    assert m.min_p_value < 1e-100 and not m.norms_exact


def test_the_moment_tests_pass_honest_inits_and_catch_a_lightly_pretrained_one_with_reset_norms():
    from node.training.initcheck import compute_moment_measurement, is_moment_accepted
    from node.training.report import compute_stolen_init

    for seed in range(4):
        spec = RunSpec(init_seed=200 + seed)
        m = compute_moment_measurement(spec, get_params_vector(build_model(spec)).numpy())
        assert m.tests == 45 and is_moment_accepted(m, ALPHA), m
    spec = RunSpec()
    stolen = compute_stolen_init(spec, steps=100, lr=0.1, reset_norms=True)
    assert is_init_accepted(measure(spec, stolen), ALPHA)  # the KS gap: it passes the KS test
    m = compute_moment_measurement(spec, stolen)
    assert not is_moment_accepted(m, ALPHA) and m.min_p_value < 1e-100, m


def test_a_wrong_scale_fails_the_variance_test():
    from node.training.initcheck import compute_moment_measurement, is_moment_accepted

    spec = RunSpec()
    params = get_params_vector(build_model(spec)).numpy() * np.float32(1.01)  # 1 % too wide, norms too
    params[params == np.float32(1.01)] = 1.0
    m = compute_moment_measurement(spec, params)
    assert not is_moment_accepted(m, ALPHA) and m.worst.endswith("variance"), m

"""Every committed model profile loads, and a calibrated one carries the rates the contract registration needs."""

import tomllib
from pathlib import Path

import pytest

from node.profiles import ModelProfile

PROFILES = sorted((Path(__file__).resolve().parents[2] / "config" / "profiles").glob("*.toml"))


@pytest.mark.parametrize("path", PROFILES, ids=lambda p: p.name)
def test_a_committed_profile_loads(path: Path) -> None:
    raw = tomllib.loads(path.read_text())
    profile = ModelProfile.model_validate(raw)
    model, dtype = path.name.removesuffix(".toml").rsplit(".", 1)
    assert (profile.meta.model, profile.meta.dtype) == (model, dtype)
    if profile.meta.calibrated and profile.stage2 is not None:
        thresholds = profile.stage2_thresholds()
        assert thresholds.max_weight_error > 0 and thresholds.max_temperature_deviation > 0
        assert 0 <= raw["rates"]["alpha_upper_95"] <= 1 and raw["rates"]["honest_runs_held_out"] > 0
        assert all(0 <= b <= 1 for b in raw["rates"]["beta_64_tokens"].values())


def test_there_is_a_profile_per_calibrated_precision() -> None:
    names = {p.name for p in PROFILES}
    assert {"smollm2-135m-instruct.float32.toml", "smollm2-135m-instruct.bfloat16.toml"} <= names

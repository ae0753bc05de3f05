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


def test_per_length_thresholds_round_trip_and_unknown_names_are_refused():
    import tomllib

    import pydantic

    from node.calibrate.report import render_profile
    from node.profiles import ModelProfile

    flat = {"weight_error_max": 4.0, "sampler_margin_max": 4.0, "logprob_distance_max": 1.0,
            "candidate_mismatch_rate": 1.0, "surprisal_z": float("inf"), "distance2": 1.4, "distance2@16": 1.4,
            "distance2@64": 0.8, "temperature_deviation": float("inf"), "temperature_t": 9.0, "temperature_t@16": 9.0,
            "temperature_t@64": 4.0, "kept_mass_shift": float("inf"), "kept_mass_score": float("inf"),
            "kept_mass_t": float("inf"),
            "fingerprint_exponent_mismatches_max": 20, "fingerprint_mantissa_mean_max": 10.0,
            "fingerprint_sign_mismatches_max": 5}
    text = render_profile("m", "bfloat16", flat, {"alpha": 0.0, "alpha_upper": 0.01, "honest_runs": 300, "beta": {}},
                          "test")
    profile = ModelProfile.model_validate(tomllib.loads(text))
    t = profile.stage2_thresholds()
    assert t.by_length == ((16, (("max_distance2", 1.4), ("max_temperature_t", 9.0))),
                           (64, (("max_distance2", 0.8), ("max_temperature_t", 4.0))))
    raw = tomllib.loads(text)
    raw["stage2"]["by_length"]["64"]["max_typo"] = 1.0
    with pytest.raises(pydantic.ValidationError, match="unknown thresholds"):
        ModelProfile.model_validate(raw)


def test_per_source_projection_thresholds_load_and_must_name_registered_sources(tmp_path):
    import pydantic

    from node.engines.models import ProjectionConfig, get_model_spec
    from node.errors import FatalError
    from node.profiles import load_profile
    from node.protocol.projection import LAST_HIDDEN

    raw = {"meta": {"model": "m", "dtype": "bfloat16", "calibrated": True, "source": "test"},
           "projection": {"max_distance": 0.03, "by_length": {"64": 0.025},
                          "by_source": {"0": {"max_distance": 0.002, "by_length": {"64": 0.00125}}}}}
    t = ModelProfile.model_validate(raw).projection_thresholds()
    assert t is not None and t.for_source(0).at(64) == 0.00125 and t.for_source(LAST_HIDDEN).at(64) == 0.025
    for bad in ("255", "first", "-1"):
        with pytest.raises(pydantic.ValidationError, match="by_source"):
            ModelProfile.model_validate({**raw, "projection": {**raw["projection"],
                                                               "by_source": {bad: {"max_distance": 0.1}}}})
    path = tmp_path / "m.bfloat16.toml"
    path.write_text('[meta]\nmodel = "m"\ndtype = "bfloat16"\ncalibrated = true\nsource = "test"\n\n'
                    '[projection]\nmax_distance = 0.03\n\n[projection.by_source."0"]\nmax_distance = 0.002\n')
    spec = get_model_spec("smollm2-135m-instruct-bf16").model_copy(update={"profile": str(path)})
    ours = spec.model_copy(update={"projection": ProjectionConfig(layers=(0, "last"), k=1, bits=16)})
    assert load_profile(ours)[1].projection.by_source["0"].max_distance == 0.002
    other = spec.model_copy(update={"projection": ProjectionConfig(layers=(5, "last"), k=1, bits=16)})
    with pytest.raises(FatalError, match="registers"):
        load_profile(other)

"""The stock-sampler decision, profile section, registry entry and sampler names."""

import math
import tomllib
from pathlib import Path

import pytest

from node.checks.stock import StockMeasurements
from node.checks.stock_decision import StockThresholds, compute_stock_scores_digest, decide_stock
from node.engines.models import ModelSpec, get_model_spec, load_registry
from node.errors import FatalError
from node.profiles import ModelProfile
from node.protocol.errors import InvalidParams, Reason
from node.protocol.vllm_sampler import SAMPLERS, require_known_sampler


def measured(**changes) -> StockMeasurements:
    base = {"positions": 64, "difr_mean": 0.0, "difr_max": 0.0, "difr_q90": 0.0, "difr_mismatch_rate": 0.0,
            "masked_choices": 0, "surprisal_z": 0.5, "surprisal_mean": 1.0, "entropy_mean": 1.0}
    return StockMeasurements(**{**base, **changes})


T = StockThresholds(max_difr_mean=0.01, max_difr_max=0.05, max_surprisal_z_abs=5.0,
                    by_length=((16, (("max_difr_mean", 0.02),)), (64, (("max_difr_mean", 0.005),))))


def test_each_signal_names_its_reason_in_order():
    assert decide_stock(measured(), T).valid
    assert decide_stock(measured(difr_mean=0.5, difr_max=9.0), T).reason is Reason.TOKEN_DIFR_MAX
    assert decide_stock(measured(difr_mean=0.02, difr_max=0.04), T).reason is Reason.TOKEN_DIFR
    assert decide_stock(measured(surprisal_z=-6.0), T).reason is Reason.SURPRISAL  # two-sided
    assert decide_stock(measured(surprisal_z=6.0), T).reason is Reason.SURPRISAL


def test_per_length_thresholds():
    assert decide_stock(measured(positions=64, difr_mean=0.007, difr_max=0.01), T).reason is Reason.TOKEN_DIFR
    assert decide_stock(measured(positions=32, difr_mean=0.007, difr_max=0.01), T).valid  # the 16-token bucket
    assert decide_stock(measured(positions=8, difr_mean=0.015, difr_max=0.02), T).reason is Reason.TOKEN_DIFR


def test_an_unmeasured_decided_signal_raises_and_an_undecided_one_is_ignored():
    with pytest.raises(ValueError):
        decide_stock(measured(difr_mean=math.nan), T)
    surprisal_only = StockThresholds(max_surprisal_z_abs=5.0)
    assert decide_stock(measured(difr_mean=math.nan, difr_max=math.nan), surprisal_only).valid


def test_the_digest_binds_the_numbers():
    a, b = measured(), measured(difr_max=1e-9)
    assert compute_stock_scores_digest(a) != compute_stock_scores_digest(b)
    assert decide_stock(a, T).scores_digest == compute_stock_scores_digest(a)
    assert len(compute_stock_scores_digest(measured(difr_mean=math.nan))) == 32  # non-finite values are encoded


def test_the_stock_registry_entry_is_its_own_model_with_the_stock_profile():
    specs = load_registry()
    stock, fp32 = specs["smollm2-135m-instruct-vllm-stock"], specs["smollm2-135m-instruct"]
    assert stock.sampler == "vllm-seeded" and fp32.sampler == "canonical"
    assert (stock.package, stock.gguf_file, stock.dtype) == (fp32.package, fp32.gguf_file, fp32.dtype)
    assert all(spec.sampler in SAMPLERS for spec in specs.values())


def test_an_unknown_sampler_is_refused():
    with pytest.raises(InvalidParams) as err:
        require_known_sampler("sglang-seeded")
    assert err.value.reason is Reason.UNKNOWN_SAMPLER
    assert require_known_sampler("vllm-seeded") == "vllm-seeded"
    spec = get_model_spec("tiny-llama").model_dump()
    spec["sampler"] = "sglang-seeded"
    with pytest.raises(ValueError):
        ModelSpec(**spec)


def test_the_executer_serves_a_stock_sampler_model_with_its_stock_service():
    # docs/protocol.md §13.1: the canonical executer is not built for it; the stock service is (transformers
    # backend: vLLM's rule over its logits), and what it cannot do is refused at start-up
    from node.executer.bootstrap import ExecuterSettings, load_executer
    from node.executer.stock import StockService

    service, _, profile = load_executer(ExecuterSettings("smollm2-135m-instruct-vllm-stock"))
    assert isinstance(service, StockService) and profile.stock is not None
    with pytest.raises(FatalError) as err:
        load_executer(ExecuterSettings("smollm2-135m-instruct-vllm-stock", workload_record=Path("unused")))
    assert err.value.reason is Reason.UNKNOWN_SAMPLER


def test_a_stock_section_loads_and_a_profile_without_it_says_why():
    text = """
[meta]
model = "m"
dtype = "float32"
calibrated = true
source = "test"

[stock]
max_difr_mean = 0.01
max_difr_max = 0.5
max_surprisal_z_abs = inf

[stock.by_length.32]
max_difr_mean = 0.004
"""
    profile = ModelProfile.model_validate(tomllib.loads(text))
    t = profile.stock_thresholds()
    assert (t.max_difr_mean, t.max_surprisal_z_abs) == (0.01, math.inf)
    assert t.by_length == ((32, (("max_difr_mean", 0.004),)),)
    with pytest.raises(FatalError) as err:
        profile.fingerprint_thresholds()
    assert err.value.reason is Reason.UNKNOWN_SAMPLER
    no_stock = ModelProfile.model_validate(tomllib.loads(text.split("[stock]")[0]))
    with pytest.raises(FatalError) as err:
        no_stock.stock_thresholds()
    assert err.value.reason is Reason.UNKNOWN_SAMPLER
    with pytest.raises(ValueError):
        bad = text.replace("[stock.by_length.32]", "[stock.by_length.32]\nmax_x = 1")
        ModelProfile.model_validate(tomllib.loads(bad))

"""node.calibrate.stock_fit on synthetic records: the floor from the logit noise, selection, held-out rates."""

import math
import tomllib

import pytest

from node.calibrate.fit import is_calibration_split
from node.calibrate.stock import plan
from node.calibrate.stock_fit import (
    SAFETY,
    choose_stock_thresholds,
    compute_margin_floor,
    held_out,
    render_stock_profile,
    select_stock_signals,
    tokens_needed,
)
from node.profiles import ModelProfile


def signals(n: int, difr: float, z: float) -> dict:
    return {"positions": n, "difr_mean": difr / 4, "difr_max": difr, "difr_q90": 0.0, "difr_mismatch_rate": 0.0,
            "masked_choices": 0, "surprisal_z": z, "surprisal_mean": 1.0, "entropy_mean": 1.0,
            "surprisal_z_abs": abs(z)}


def record(kind: str, name: str, i: int, difr: float, z: float, temperature: float = 0.7, **extra) -> dict:
    return {"key": f"stock/{kind}/{name}/{i}", "kind": kind, "name": name, "temperature": temperature, "top_p": 1.0,
            "lengths": {str(n): signals(n, difr if n >= 32 else 0.0, z) for n in (16, 32, 64)}, **extra}


def campaign() -> list[dict]:
    honest = [record("honest", "vllm", i, 0.0, (-1) ** i * 1.5, logit_noise_max=1e-4) for i in range(60)]
    attacks = [record("attack", "wrong-seed", i, 2.0, 0.0) for i in range(20)]
    attacks += [record("attack", "wrong-seed", 100 + i, 2.0, 0.0, temperature=0.0) for i in range(4)]  # no-ops
    attacks += [record("attack", "other-model-tiny", i, 9.0, 30.0) for i in range(20)]
    return honest + attacks


def test_the_floor_is_the_measured_logit_noise_bound():
    records = campaign()
    assert compute_margin_floor(records) == SAFETY * 2 * 1e-4 / 0.7
    t = choose_stock_thresholds(records)
    assert t["difr_max"] == t["difr_mean"] == compute_margin_floor(records)  # every honest margin is 0
    assert t["surprisal_z_abs"] == 1.5 + 2


def test_selection_keeps_the_max_and_drops_what_catches_nothing_new():
    records = campaign()
    kept = select_stock_signals(records, choose_stock_thresholds(records))
    # the mean adds nothing to the max; surprisal catches other-model-tiny at 16 tokens, where no margin shows
    assert math.isfinite(kept["difr_max"]) and math.isinf(kept["difr_mean"]) and math.isfinite(kept["surprisal_z_abs"])
    no_16 = [{**r, "lengths": {k: v for k, v in r["lengths"].items() if k != "16"}} for r in records]
    assert math.isinf(select_stock_signals(no_16, choose_stock_thresholds(no_16))["surprisal_z_abs"])


def test_held_out_rates_skip_no_ops_and_count_lengths():
    records = campaign()
    t = select_stock_signals(records, choose_stock_thresholds(records))
    rates = held_out(records, t)
    assert rates["honest"]["64"][0] == 0
    held = sum(not is_calibration_split(r["key"]) for r in records if r["name"] == "wrong-seed"
               and r["temperature"] > 0)
    assert rates["wrong-seed"]["64"] == (held, held) and rates["wrong-seed"]["16"][0] == 0
    assert tokens_needed(rates["wrong-seed"]) == "32" and tokens_needed({"16": (0, 3)}) == "> 16"


def test_the_rendered_profile_loads():
    records = campaign()
    t = select_stock_signals(records, choose_stock_thresholds(records))
    profile = ModelProfile.model_validate(tomllib.loads(render_stock_profile(t, records, (0, 30))))
    assert profile.stock_thresholds().max_difr_max == t["difr_max"]


def test_the_plan_spreads_attacks_and_extends():
    small, large = list(plan(10, 2)), list(plan(20, 4))
    assert sum(r.kind == "honest" for r in small) == 10 and sum(r.kind == "attack" for r in small) == 14
    assert {r.key for r in small} <= {r.key for r in large}
    assert small[0].kind == "honest" and small[-1].kind == "honest"  # attack rounds sit among the honest runs


def test_per_position_rates_and_tokens_for():
    from node.calibrate.stock_fit import per_position_rates, tokens_for

    records = [{**record("attack", "bf16", i, 0.1, 0.0), "margins": [0.0] * 60 + [0.5] * 4} for i in range(10)]
    records.append({**record("attack", "bf16", 99, 0.1, 0.0, temperature=0.0), "margins": [0.5] * 64})  # counted
    held = [r for r in records if not is_calibration_split(r["key"])]
    over, n = per_position_rates(records, 0.1)["bf16"]
    assert n == 64 * len(held) and over == sum(4 if r["temperature"] else 64 for r in held)
    assert tokens_for(0.0) == math.inf and tokens_for(1.0) == 1.0
    assert tokens_for(0.1) == pytest.approx(math.log(0.001) / math.log(0.9))

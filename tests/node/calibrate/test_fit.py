import math
import statistics
import tomllib

import pytest

from node.calibrate.fit import (
    ORDER,
    choose_pooled_thresholds,
    choose_thresholds,
    first_violation,
    held_out_rates,
    is_calibration_split,
    select_signals,
    upper_bound,
)
from node.calibrate.report import render_profile
from node.profiles import ModelProfile


def signals(**over):
    base = {name: 0.0 for name in ORDER}
    base.update(stage1="OK", fingerprint_error="", fingerprint_exponent_mismatches_max=0,
                fingerprint_sign_mismatches_max=0)
    base.update(over)
    return base


def record(key, kind, name, **over):
    return {"key": key, "kind": kind, "name": name, "lengths": {"16": signals(**over), "64": signals(**over)}}


def keys(split, n, prefix):
    out, i = [], 0
    while len(out) < n:
        key = f"{prefix}/{i}"
        if is_calibration_split(key) == split:
            out.append(key)
        i += 1
    return out


def test_split_is_a_fixed_function_of_the_key():
    assert is_calibration_split("honest/threads1/3") == is_calibration_split("honest/threads1/3")
    share = sum(is_calibration_split(f"k/{i}") for i in range(2000)) / 2000
    assert 0.45 < share < 0.55


def test_thresholds_follow_the_documented_rules():
    cal = [record(k, "honest", "threads2", weight_error_max=1e-6 * (j + 1), surprisal_z=float(j) - 1,
                  fingerprint_exponent_mismatches_max=j, sampler_margin_max=0.0)
           for j, k in enumerate(keys(True, 3, "honest/a"))]
    held = [record(k, "honest", "threads2", weight_error_max=1.0) for k in keys(False, 3, "honest/b")]
    t = choose_thresholds(cal + held)  # held-out values never move a threshold
    assert t["weight_error_max"] == pytest.approx(4 * 3e-6)
    assert t["sampler_margin_max"] == pytest.approx(4 * 3e-6)  # floor: the weight noise
    assert t["surprisal_z"] == pytest.approx(1 + 2)
    assert t["fingerprint_exponent_mismatches_max"] == 2 * 2 + 1


def test_rates_count_held_out_rejections_and_who_caught_them():
    cal = [record(k, "honest", "x", weight_error_max=1e-6) for k in keys(True, 4, "honest/c")]
    held = [record(k, "honest", "x", weight_error_max=1e-6) for k in keys(False, 5, "honest/d")]
    attacks = [record(k, "attack", "int8", weight_error_max=0.5) for k in keys(False, 3, "attack/int8")]
    attacks += [record(k, "attack", "int8", stage1="CHOSEN_MISMATCH") for k in keys(False, 1, "attack/int8x")]
    records = cal + held + attacks
    t = choose_thresholds(records)
    rates = held_out_rates(records, t)
    assert (rates["honest"]["16"].n, rates["honest"]["16"].rejected) == (5, 0)
    assert (rates["int8"]["64"].n, rates["int8"]["64"].rejected) == (4, 4)
    assert rates["int8"]["64"].caught_by == {"weight_error_max": 3, "stage1:CHOSEN_MISMATCH": 1}
    assert first_violation(signals(stage1="CHOSEN_MISMATCH"), t, use_stage1=False) == ""


def test_a_signal_that_catches_nothing_new_on_the_calibration_half_is_dropped():
    cal = [record(k, "honest", "x", weight_error_max=1e-6, sampler_margin_max=1e-6) for k in keys(True, 4, "h/e")]
    # margin fires with weight error on every calibration attack; surprisal alone catches the prefill one
    attacks = [record(k, "attack", "int8", weight_error_max=0.5, sampler_margin_max=0.5) for k in keys(True, 3, "a/f")]
    attacks += [record(k, "attack", "prefill", surprisal_z=50.0) for k in keys(True, 2, "a/g")]
    # a held-out attack only margin would catch must not keep it (selection sees the calibration half only)
    attacks += [record(k, "attack", "odd", sampler_margin_max=0.5) for k in keys(False, 2, "a/h")]
    records = cal + attacks
    t = select_signals(records, choose_thresholds(records))
    assert t["sampler_margin_max"] == math.inf
    assert t["weight_error_max"] == pytest.approx(4e-6) and t["surprisal_z"] < math.inf
    assert t["fingerprint_exponent_mismatches_max"] < math.inf  # the fingerprint is never dropped


def test_upper_bound_matches_the_closed_form_for_zero_failures():
    assert upper_bound(0, 300) == pytest.approx(1 - 0.05 ** (1 / 300), rel=1e-6)
    assert upper_bound(5, 5) == 1.0
    assert 0.01 < upper_bound(1, 100) < 0.05  # exact Clopper-Pearson: 0.0466


def test_profile_round_trips_through_the_loader():
    t = {name: 0.5 for name in ORDER}
    t["fingerprint_exponent_mismatches_max"] = 3
    t["fingerprint_sign_mismatches_max"] = 1
    t["sampler_margin_max"] = math.inf  # a dropped signal
    text = render_profile("m", "float32", t, {"alpha": 0.0, "alpha_upper": 0.01, "honest_runs": 300,
                                               "beta": {"int8": 0.0}}, "test")
    profile = ModelProfile.model_validate(tomllib.loads(text))
    assert profile.meta.calibrated and profile.stage2 is not None
    th = profile.stage2_thresholds()
    assert th.max_sampler_margin == math.inf
    assert th.max_weight_error == 0.5 and th.fingerprint.max_exponent_mismatches == 3
    assert math.isclose(tomllib.loads(text)["rates"]["alpha_upper_95"], 0.01)


def test_top_p_lies_under_greedy_decoding_are_no_ops_and_not_counted():
    from node.calibrate.fit import is_no_op

    greedy = {"key": "attack/top-p-lie/0", "kind": "attack", "name": "top-p-lie", "temperature": 0.0,
              "lengths": {"16": signals()}}
    assert is_no_op(greedy)
    assert not is_no_op({**greedy, "temperature": 0.7})
    assert not is_no_op({**greedy, "name": "temperature-lie"})


def test_sweep_tokens_follow_the_geometric_rule():
    from node.calibrate.sweep import summarise_sweep, tokens_for

    assert tokens_for(0.5) == 10  # 0.5^10 < 0.001 <= 0.5^9
    assert tokens_for(0.0) == math.inf and tokens_for(1.0) == 1.0
    ok = {"stage1": "OK", "temperature_t": 1.0}
    lie = {"stage1": "OK", "temperature_t": 9.0}
    rows = [{"name": "noise-1pct", "weight_errors": [0.1, 0.0, 0.1, 0.0] * 16,
             "lengths": {"16": ok, "32": lie, "64": lie}}]
    row = next(r for r in summarise_sweep(rows, {"weight_error_max": 0.05, "temperature_t": 5.0})
               if r["variant"] == "noise-1pct")
    assert row["q"] == 0.5 and row["detected"] == {"16": 1, "32": 1, "64": 1}
    assert row["decided"] == {"16": 0, "32": 1, "64": 1}  # the whole decision, per prefix


def test_the_toploc_baseline_applies_the_median_only_where_it_was_recorded():
    from node.calibrate.fit import TOPLOC, first_violation

    old = {"stage1": "OK", "fingerprint_exponent_mismatches_max": 0, "fingerprint_mantissa_mean_max": 1.0}
    assert first_violation(old, dict(TOPLOC), use_stage1=False) == ""
    assert first_violation({**old, "fingerprint_mantissa_median_max": 9.0}, dict(TOPLOC), use_stage1=False) \
        == "fingerprint_mantissa_median_max"
    assert first_violation({**old, "fingerprint_mantissa_median_max": 8.0}, dict(TOPLOC), use_stage1=False) == ""


def _pooled_records(values_by_length):
    records = []
    for i, values in enumerate(zip(*values_by_length.values(), strict=True)):
        key = next(f"honest/x/{j}" for j in range(i * 1000, i * 1000 + 1000) if is_calibration_split(f"honest/x/{j}"))
        records.append({"key": key, "kind": "honest", "name": "x",
                        "lengths": {n: {"stage1": "OK", "temperature_deviation": v}
                                    for n, v in zip(values_by_length, values, strict=True)}})
    return records


def test_a_pooled_threshold_is_six_sigma_per_length_and_above_every_honest_value():
    sixteen = [0.01, 0.03, 0.05, 0.02, 0.04]
    sixty_four = [0.005, 0.01, 0.012, 0.008, 0.009]
    t = choose_pooled_thresholds(_pooled_records({"16": sixteen, "64": sixty_four}), "temperature_deviation")
    assert t["16"] == pytest.approx(statistics.fmean(sixteen) + 6 * statistics.pstdev(sixteen))
    assert t["64"] == pytest.approx(statistics.fmean(sixty_four) + 6 * statistics.pstdev(sixty_four))
    constant = choose_pooled_thresholds(_pooled_records({"16": [0.02] * 5}), "temperature_deviation")
    assert constant["16"] == pytest.approx(1.25 * 0.02)  # zero spread: never below the honest values


def test_an_average_threshold_never_falls_below_a_longer_lengths():
    from node.calibrate.fit import SHRINKING

    tight_at_32 = {"16": [0.05, 0.06, 0.04], "32": [0.010, 0.011, 0.012], "64": [0.02, 0.03, 0.025]}
    t = choose_pooled_thresholds(_pooled_records(tight_at_32), "temperature_deviation")
    own_64 = statistics.fmean(tight_at_32["64"]) + 6 * statistics.pstdev(tight_at_32["64"])
    assert "temperature_deviation" in SHRINKING
    assert t["64"] == pytest.approx(own_64) and t["32"] == pytest.approx(own_64)  # raised to the 64-token one
    assert t["16"] > own_64  # its own, larger threshold is kept
    assert list(t) == ["16", "32", "64"]


def test_a_growing_signal_keeps_its_own_per_length_thresholds():
    from node.calibrate.fit import compute_non_increasing_envelope

    assert compute_non_increasing_envelope({"16": 2.0, "32": 3.0, "64": 2.5}) == {"16": 3.0, "32": 3.0, "64": 2.5}
    growing = [{"key": r["key"], "kind": "honest", "name": "x",
                "lengths": {n: {"stage1": "OK", "kept_mass_t": v * float(n)} for n in ("16", "64")}}
               for r, v in zip(_pooled_records({"16": [0.0] * 3}), (0.1, 0.12, 0.11), strict=True)]
    t = choose_pooled_thresholds(growing, "kept_mass_t")  # not SHRINKING: 16's threshold stays below 64's
    assert t["16"] < t["64"]


def test_a_response_is_judged_by_the_longest_length_bucket_not_above_it():
    from node.calibrate.fit import first_violation, thresholds_at

    t = {"distance2": 1.5, "distance2@16": 1.5, "distance2@64": 0.8, "temperature_t": math.inf, "temperature_t@64": 3.0}
    assert thresholds_at(t, 8)["distance2"] == 1.5  # shorter than every bucket: the flat (largest) one
    assert thresholds_at(t, 40)["distance2"] == 1.5 and thresholds_at(t, 64)["distance2"] == 0.8
    assert thresholds_at(t, 500)["temperature_t"] == math.inf  # a signal not decided on stays off
    assert first_violation({"stage1": "OK", "positions": 64, "distance2": 1.0}, t) == "distance2"
    assert first_violation({"stage1": "OK", "positions": 32, "distance2": 1.0}, t) == ""


def test_a_signal_older_records_lack_gets_no_threshold():
    base = {"stage1": "OK", **{k: 0.1 for k in ("weight_error_max", "sampler_margin_max", "logprob_distance_max",
                                                "candidate_mismatch_rate", "distance2", "surprisal_z",
                                                "fingerprint_exponent_mismatches_max",
                                                "fingerprint_mantissa_mean_max", "fingerprint_sign_mismatches_max")}}
    records = [{"key": r["key"], "kind": "honest", "name": "x", "lengths": {"16": dict(base)}}
               for r in _pooled_records({"16": [0.0] * 3})]
    assert choose_thresholds(records)["temperature_deviation"] == float("inf")


def test_the_kept_mass_score_is_derived_exactly_where_older_records_lack_it():
    from node.calibrate.fit import with_derived_signals
    from node.checks.stage2 import compute_kept_mass_score

    old = {"stage1": "OK", "positions": 16, "kept_mass_shift": 0.01}
    assert with_derived_signals(old)["kept_mass_score"] == compute_kept_mass_score(0.01, 16) == 0.04
    assert with_derived_signals({**old, "kept_mass_score": 7.0})["kept_mass_score"] == 7.0  # measured wins
    assert "kept_mass_score" not in with_derived_signals({"stage1": "OK", "positions": 16})


def test_heavy_tailed_signals_are_reported_never_decided():
    from node.calibrate.fit import HEAVY_TAILED, select_signals

    key = next(f"attack/top-p-lie/{i}" for i in range(100) if is_calibration_split(f"attack/top-p-lie/{i}"))
    only_the_score_sees_it = {"key": key, "kind": "attack", "name": "top-p-lie", "lengths": {"64": {
        "stage1": "OK", "positions": 64, "weight_error_max": 0.0, "kept_mass_t": 1.0, "kept_mass_score": 0.05}}}
    thresholds = {"weight_error_max": 0.1, "kept_mass_t": 4.0, "kept_mass_score": 0.01, "kept_mass_shift": 0.002}
    kept = select_signals([only_the_score_sees_it], thresholds)
    assert all(kept[name] == math.inf for name in HEAVY_TAILED)  # even where it alone catches an attack


def test_fresh_runs_are_all_counted_and_never_change_the_thresholds(tmp_path):
    from node.calibrate.report import fresh_lines, write_report

    calibration = [record(k, "honest", "x", weight_error_max=0.001) for k in keys(True, 4, "honest/x")]
    held_out = [record(k, "honest", "x", weight_error_max=0.001) for k in keys(False, 2, "honest/x")]
    fresh = [record(k, "honest", "y", weight_error_max=w) for k, w in
             zip(keys(True, 2, "fresh/y") + keys(False, 1, "fresh/y"), (0.001, 0.002, 0.5), strict=True)]
    lines = "\n".join(fresh_lines(fresh, choose_thresholds(calibration + held_out)))
    assert "| 16 | 33.3 % (1/3) |" in lines and "weight_error_max 1" in lines  # both halves of the fresh runs count
    plain, _ = write_report(calibration + held_out, tmp_path / "a", "m", "float32")
    with_fresh, _ = write_report(calibration + held_out, tmp_path / "b", "m", "float32", fresh=fresh)
    assert plain == with_fresh and "fresh honest runs" in (tmp_path / "b" / "report.md").read_text()


def test_campaign_notes_become_a_report_section_and_change_no_threshold(tmp_path):
    from node.calibrate.report import write_report

    runs = [record(k, "honest", "x", weight_error_max=0.001) for k in keys(True, 4, "honest/x") + keys(False, 2,
                                                                                                            "honest/x")]
    plain, _ = write_report(runs, tmp_path / "a", "m", "float32")
    noted, _ = write_report(runs, tmp_path / "b", "m", "float32", notes="No vLLM runs: *not measured*.\n")
    report = (tmp_path / "b" / "report.md").read_text()
    assert plain == noted and "## The campaign\n\nNo vLLM runs: *not measured*.\n" in report
    assert report.index("## The campaign") < report.index("## Thresholds")
    assert "## The campaign" not in (tmp_path / "a" / "report.md").read_text()


def test_the_mantissa_mean_threshold_is_never_below_four_quanta():
    from node.protocol.fingerprint import TOPK

    clean = [record(k, "honest", "x") for k in keys(True, 4, "honest/x")]  # no mantissa error in any run
    one_quantum = signals(fingerprint_mantissa_mean_max=1 / TOPK)
    threshold = choose_thresholds(clean)["fingerprint_mantissa_mean_max"]
    assert threshold == 4 / TOPK and not first_violation(one_quantum, {"fingerprint_mantissa_mean_max": threshold})
    noisy = [*clean, record(keys(True, 5, "honest/x")[-1], "honest", "x", fingerprint_mantissa_mean_max=0.5)]
    assert choose_thresholds(noisy)["fingerprint_mantissa_mean_max"] == 2.0  # above a quantum: four times the largest
    assert choose_thresholds(clean)["weight_error_max"] == 0.0  # other magnitudes are not quantised

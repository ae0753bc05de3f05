"""From calibration records to thresholds, error rates and a profile (measure, then decide).

Runs are split by a hash of their key into a calibration half (thresholds are chosen there) and a
held-out half (error rates are reported there). Threshold rule, per signal, over every prefix
length of the calibration half's honest runs:
- error magnitudes (weight error, logprob distance, candidate mismatch, fingerprint mantissa): four
  times the largest honest value (numerical noise has a longer tail than a few hundred runs show;
  in fp32 the attacks measured sit 10^3-10^5 above it, so the margin costs nothing). The fingerprint
  mantissa mean is quantised (one mantissa unit in one of TOPK values is 1/TOPK): its largest honest
  value counts as at least that one quantum, so a calibration half that happened to see no mantissa
  error does not set a threshold of 0 (Gemma-3-270M fp32: 0 in every calibration-half honest run, one
  quantum in three held-out batched runs and in an honest devnet inference);
- sampler margin: four times the larger of the largest honest margin and the largest honest weight
  error (a margin below the numerical noise of the weights is noise);
- counts (fingerprint exponent / sign mismatches): twice the largest honest count, plus one;
- surprisal z: the largest honest z plus two (z is ~N(0, 1) for honest sampling);
- pooled estimates (the temperature fit and its t-value, the kept-mass shift, distance2: averages
  over positions or standardised by their spread): one threshold per calibrated length (the
  profile's [stage2.by_length]; the flat one, their maximum, below the shortest): the
  honest mean plus six standard deviations (an average over many positions is close to normal
  across runs: six sigma is ~1e-9 one-sided), and never below 1.25 times the largest honest value.
  A max-based safety factor would bury them: under bf16 noise a temperature lie moves the fit by
  0.1 where honest runs spread by ~0.01. Per length, because their honest spread shrinks with the
  positions averaged (bf16: honest distance2 up to 1.16 at 16 tokens, 0.67 at 64), so one
  threshold would be set by the shortest responses and blind at the longer ones. For the averages
  and the temperature t-value (SHRINKING) a length's threshold is never below a longer length's:
  their honest spread cannot grow with the positions averaged, so a shorter length whose sample
  happened to be tighter has a thin tail estimate, not a tighter truth (the first bf16 fit set
  temperature_deviation to 0.085 at 32 tokens under 0.134 at 64, and its one held-out false
  positive was 0.098 at 32). The kept-mass t-value is left alone: it is mostly exact zeros, and its
  honest maximum grows with length (bf16 calibration half: 1.67 at 16 tokens, 2.02 at 64).
A signal some honest records lack (recorded only by later campaigns) gets no threshold (inf).
The kept-mass mean and score (HEAVY_TAILED) are reported, never decided on. Then the distribution
signals are selected on the calibration half too (the fingerprint, the
activation commitment, is always kept): going from the least specific signal up, a signal whose
every rejection of an attack run is also made by the signals kept is dropped (its threshold
becomes inf: measured and reported, not decided on). Each signal kept adds its own tail of honest
noise to the false-positive rate, so one that catches nothing new only costs.
α is the held-out honest rejection rate with a one-sided 95 % Clopper-Pearson upper bound; β per
attack is its held-out acceptance rate.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import statistics
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from node.checks.decision import T_VALUES, compute_beyond_calibration_scale, select_length_bucket
from node.checks.stage2 import compute_kept_mass_score
from node.protocol.fingerprint import TOPK

LENGTHS = ("16", "32", "64", "128")
MAGNITUDES = ("weight_error_max", "logprob_distance_max", "candidate_mismatch_rate",
              "fingerprint_mantissa_mean_max")
COUNTS = ("fingerprint_exponent_mismatches_max", "fingerprint_sign_mismatches_max")
POOLED = ("temperature_t", "kept_mass_t", "kept_mass_score", "kept_mass_shift", "temperature_deviation", "distance2")
POOLED_SIGMAS = 6.0
# Measured, never decided on: the kept-mass mean is a sum of rare per-position spikes (one honest bf16
# position moved the top_p cut by 0.105), not near-normal, so the six-sigma rule does not bound it (the
# first bf16 campaign: held-out honest 0.0131 over a 0.0071 threshold); its t-value decides instead.
HEAVY_TAILED = ("kept_mass_score", "kept_mass_shift")
SHRINKING = ("temperature_t", "kept_mass_shift", "temperature_deviation", "distance2")
ORDER = ("weight_error_max", "temperature_t", "kept_mass_t", "kept_mass_score", "kept_mass_shift",
         "temperature_deviation", "sampler_margin_max", "logprob_distance_max",
         "candidate_mismatch_rate", "distance2",
         "surprisal_z", "fingerprint_exponent_mismatches_max", "fingerprint_mantissa_mean_max",
         "fingerprint_sign_mismatches_max")
BASELINE_ONLY = ("fingerprint_mantissa_median_max",)  # recorded since the bf16 campaign; TOPLOC's baseline uses it
TOPLOC = {"fingerprint_exponent_mismatches_max": 38, "fingerprint_mantissa_mean_max": 10.0,
          "fingerprint_mantissa_median_max": 8.0}
SELECTABLE = tuple(name for name in ORDER if not name.startswith("fingerprint_"))
SAFETY = 4.0
QUANTA = {"fingerprint_mantissa_mean_max": 1 / TOPK}  # the smallest nonzero value a quantised magnitude takes


def is_calibration_split(key: str) -> bool:
    """Return True for the calibration half, False for the held-out half (a fixed hash of the key)."""
    return hashlib.sha256(key.encode()).digest()[0] % 2 == 0


def rows(records: Iterable[dict[str, Any]], kind: str | None = None,
         split: bool | None = None) -> Iterable[tuple[dict[str, Any], str, dict[str, Any]]]:
    """Yield (record, length, signals) for records of a kind and split."""
    for r in records:
        if (kind is None or r["kind"] == kind) and (split is None or is_calibration_split(r["key"]) == split):
            for length, signals in r["lengths"].items():
                yield r, length, with_derived_signals(signals)


def with_derived_signals(signals: dict[str, Any]) -> dict[str, Any]:
    """Return a record's signals with those that are exact functions of recorded ones filled in where missing."""
    if "kept_mass_score" in signals or "kept_mass_shift" not in signals:
        return signals
    return {**signals, "kept_mass_score": compute_kept_mass_score(float(signals["kept_mass_shift"]),
                                                                  int(signals["positions"]))}


def choose_thresholds(records: list[dict[str, Any]]) -> dict[str, float]:
    """Return a threshold per signal from the calibration half's honest runs."""
    honest = [s for _, _, s in rows(records, "honest", True) if s["stage1"] == "OK"]
    if not honest:
        raise ValueError("no honest calibration runs")
    top = {name: max(float(s[name]) for s in honest) for name in ORDER if all(name in s for s in honest)}
    out = {name: SAFETY * max(top[name], QUANTA.get(name, 0.0)) for name in MAGNITUDES}
    out.update({name: 2 * top[name] + 1 for name in COUNTS})
    out["sampler_margin_max"] = SAFETY * max(top["sampler_margin_max"], top["weight_error_max"])
    out["surprisal_z"] = top["surprisal_z"] + 2
    for name in POOLED:
        per_length = choose_pooled_thresholds(records, name) if name in top else {}
        out[name] = max(per_length.values(), default=math.inf)
        out.update({f"{name}@{length}": value for length, value in per_length.items()})
    return out


def choose_pooled_thresholds(records: list[dict[str, Any]], name: str) -> dict[str, float]:
    """Return per length: honest mean + POOLED_SIGMAS sd, at least 1.25 × the largest honest value at that length.

    For a SHRINKING signal, also at least every longer length's threshold.
    """
    by_length: dict[str, list[float]] = {}
    for _, length, s in rows(records, "honest", True):
        if s["stage1"] == "OK" and math.isfinite(float(s[name])):
            by_length.setdefault(length, []).append(float(s[name]))
    own = {length: max(statistics.fmean(v) + POOLED_SIGMAS * statistics.pstdev(v), 1.25 * max(v))
           for length, v in sorted(by_length.items(), key=lambda item: int(item[0]))}
    return compute_non_increasing_envelope(own) if name in SHRINKING else own


def compute_non_increasing_envelope(per_length: dict[str, float]) -> dict[str, float]:
    """Return per length the largest threshold at that length or any longer one."""
    longest_first = sorted(per_length, key=int, reverse=True)
    running = itertools.accumulate((per_length[n] for n in longest_first), max)
    return dict(sorted(zip(longest_first, running, strict=True), key=lambda item: int(item[0])))


def thresholds_at(thresholds: dict[str, float], positions: int) -> dict[str, float]:
    """Return the thresholds for a response of this many positions: a used pooled signal's per-length one.

    The bucket is the longest calibrated length not above the positions (a longer response is less
    noisy than its bucket); shorter than every bucket, the flat threshold (the largest) applies;
    longer than every bucket, t-values scale as in the decision (compute_beyond_calibration_scale).
    """
    lengths = {int(key.split("@")[1]) for key in thresholds if "@" in key}
    bucket = select_length_bucket(lengths, positions)
    if bucket is None:
        return thresholds
    scale = compute_beyond_calibration_scale(positions, max(lengths))
    overrides = {key.split("@")[0]: value for key, value in thresholds.items() if key.endswith(f"@{bucket}")}
    return {**thresholds, **{name: value * scale if f"max_{name}" in T_VALUES else value
                             for name, value in overrides.items() if math.isfinite(thresholds.get(name, math.inf))}}


def select_signals(records: list[dict[str, Any]], thresholds: dict[str, float]) -> dict[str, float]:
    """Return the thresholds with signals redundant on the calibration half's attacks set to inf."""
    attacks = [s for _, _, s in rows(records, "attack", True)]
    kept = {**thresholds, **{name: math.inf for name in HEAVY_TAILED if name in thresholds}}
    for name in reversed(SELECTABLE):
        trial = {k: v for k, v in kept.items() if k != name}
        if all(bool(first_violation(s, trial)) == bool(first_violation(s, kept)) for s in attacks):
            kept[name] = math.inf
    return kept


def first_violation(signals: dict[str, Any], thresholds: dict[str, float], use_stage1: bool = True) -> str:
    """Return what rejects these signals first: a stage-1 reason, a stage-2 signal, or "" if accepted."""
    if use_stage1 and signals["stage1"] != "OK":
        return f"stage1:{signals['stage1']}"
    if signals.get("fingerprint_error"):
        return f"fingerprint:{signals['fingerprint_error']}"
    if "positions" in signals:
        thresholds = thresholds_at(thresholds, int(signals["positions"]))
    for name in (*ORDER, *BASELINE_ONLY):
        if name in thresholds and name in signals and float(signals[name]) > thresholds[name]:
            return name
    return ""


def upper_bound(failures: int, n: int, confidence: float = 0.95) -> float:
    """Return the one-sided Clopper-Pearson upper bound on a binomial rate."""
    if n == 0:
        return 1.0
    if failures >= n:
        return 1.0
    lo, hi = failures / n, 1.0
    for _ in range(60):  # bisection on P(X <= failures; n, p) = 1 - confidence
        mid = (lo + hi) / 2
        cdf = sum(math.comb(n, i) * mid**i * (1 - mid) ** (n - i) for i in range(failures + 1))
        lo, hi = (mid, hi) if cdf > 1 - confidence else (lo, mid)
    return hi


@dataclass
class Rates:
    """Held-out outcome counts for one group at one length."""

    n: int = 0
    rejected: int = 0
    caught_by: Counter[str] = field(default_factory=Counter)

    @property
    def rate(self) -> float:
        """Return the rejection rate."""
        return self.rejected / self.n if self.n else float("nan")


NO_OP_AT_GREEDY = ("top-p-lie",)  # under T = 0 top_p changes no output: the "lie" is not an attack there


def is_no_op(record: dict[str, Any]) -> bool:
    """Check whether an attack run changed nothing a validator could or should see."""
    return record["kind"] == "attack" and record["name"] in NO_OP_AT_GREEDY and float(record["temperature"]) == 0.0


def held_out_rates(records: list[dict[str, Any]], thresholds: dict[str, float],
                   use_stage1: bool = True, split: bool | None = False) -> dict[str, dict[str, Rates]]:
    """Return rejection counts per group ("honest" or attack name) and length on the held-out half.

    `split=None` counts every record: for fresh runs recorded after the thresholds were fixed.
    """
    out: dict[str, dict[str, Rates]] = {}
    for r, length, signals in rows(records, None, split):
        if is_no_op(r):
            continue
        group = "honest" if r["kind"] == "honest" else r["name"]
        rates = out.setdefault(group, {}).setdefault(length, Rates())
        why = first_violation(signals, thresholds, use_stage1)
        rates.n += 1
        if why:
            rates.rejected += 1
            rates.caught_by[why.split(":")[0] if why.startswith("fingerprint:") else why] += 1
    return out


"""Benchmark the memory spot checks (issue 18) on this machine and write bench-results/spotcheck.json.

1. Stuffing: fill rate (MB/s) of the layered construction and Z, the least time to recompute one kept block
   (its cone), for the default 64 MiB pool.
2. Answer cost: per labels and per state challenge, against the workload's step time flat out (tiny-llama and
   SmolLM2-135M); the signatures (verify the verifier's challenge + sign the answer on the device; sign the
   challenge + verify the answer on the pinger); the share of a device's time that answering takes at the
   default rate (goal ≤ 1 %), computed and measured end to end (a flat-out device with and without a pinger).
3. Latency: challenge → answer on the pinger's clock for honest devices, idle and under load (a CPU hog,
   forced GC), p50/p99/max and the share above each candidate X.
Usage: python scripts/bench_spotcheck.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from eth_account import Account
from rich.console import Console
from rich.table import Table

from node.spotcheck.answers import compute_challenge_indices, compute_labels_digest, compute_state_answer
from node.spotcheck.auth import (
    compute_challenge_digest,
    is_answer_signed_by,
    sign_answer,
    sign_challenge,
    verify_challenge,
)
from node.spotcheck.sim import SimConfig, SimDeviceSpec, run_cluster, run_sim
from node.spotcheck.stuffing import StuffingParams, compute_block_on_demand, compute_cone_costs, compute_stuffing
from node.spotcheck.wire import Answer, Challenge
from node.spotcheck.workload import MODEL_NAME, SMOL_NAME, InferenceWorkload, build_model, compute_prompt

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench-results" / "spotcheck.json"
X_CANDIDATES_MS = (50, 100, 150, 250, 500)
console = Console()


def bench_stuffing(mib: int) -> dict[str, float]:
    """Return the fill rate and Z for a pool of `mib` MiB."""
    params = StuffingParams(n_blocks=(mib << 20) // 16384)
    seed = b"\x01" * 32
    out = np.empty((params.n_blocks, params.words), dtype=np.uint64)
    t0 = time.perf_counter()
    compute_stuffing(seed, params, out)
    fill_s = time.perf_counter() - t0
    costs = compute_cone_costs(seed, params)
    cheapest = int(costs.argmin())
    t0 = time.perf_counter()
    block = compute_block_on_demand(seed, params, cheapest, out[cheapest - 1] if cheapest else None)
    z_s = time.perf_counter() - t0
    assert np.array_equal(block, out[cheapest])
    return {"pool_mib": mib, "fill_s": fill_s, "fill_mb_s": params.total_bytes / fill_s / 1e6, "z_min_s": z_s,
            "cone_min_blocks": int(costs.min()), "cone_fraction_of_fill": float(costs.min()) /
            (params.n_blocks * params.layers)}


def bench_answer_cost(model_name: str, state_tokens: int, seconds: float, rate_hz: float, share: float, count: int,
                      sign_ms: float) -> dict[str, Any]:
    """Return the workload's step time and each answer's cost (in-process, one thread), signatures included."""
    torch.set_num_threads(1)
    model = build_model(model_name)
    workload = InferenceWorkload(model, compute_prompt(0, state_tokens, int(model.config.vocab_size)), sampling_seed=0)
    workload.step()  # warm-up
    workload.steps = 0
    workload.tokens = workload.tokens[:state_tokens]
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds or workload.steps < 3:
        _, state = workload.step()
    step_s = (time.perf_counter() - t0) / workload.steps
    params = StuffingParams(n_blocks=(64 << 20) // 16384)
    blocks = np.zeros((params.n_blocks, params.words), dtype=np.uint64)
    nonces = [bytes([i]) * 32 for i in range(50)]
    t0 = time.perf_counter()
    for n in nonces:
        compute_state_answer(state, n)
    state_s = (time.perf_counter() - t0) / len(nonces)
    t0 = time.perf_counter()
    for n in nonces:
        compute_labels_digest(n, compute_challenge_indices(n, params.n_blocks, count), blocks)
    labels_s = (time.perf_counter() - t0) / len(nonces)
    busy = rate_hz * (share * labels_s + (1 - share) * state_s + sign_ms / 1e3)
    return {"model": model_name, "state_tokens": state_tokens, "step_ms": step_s * 1e3, "steps_per_s": 1 / step_s,
            "state_answer_ms": state_s * 1e3, "labels_answer_ms": labels_s * 1e3, "device_signatures_ms": sign_ms,
            "rate_hz": rate_hz, "answer_share_of_time": busy}


def bench_signatures(n: int) -> dict[str, float]:
    """Return the per-challenge signature costs: device (verify challenge, sign answer), pinger (sign, verify)."""
    verifier, operator = Account.create(), Account.create()
    allowed = frozenset({verifier.address})
    challenges = [Challenge(device_id="dev", seq=i, nonce=f"{i:064x}", kind="labels",
                            count=64, issued_ms=1_700_000_000_000 + i, verifier=verifier.address) for i in range(n)]
    t0 = time.perf_counter()
    signed = [sign_challenge(verifier, c, "run") for c in challenges]
    pinger_sign = (time.perf_counter() - t0) / n
    t0 = time.perf_counter()
    digests = [verify_challenge(c, "run", allowed) for c in signed]
    device_verify = (time.perf_counter() - t0) / n
    answers = [Answer(device_id="dev", seq=c.seq, nonce=c.nonce, kind="labels", digest="cd" * 32) for c in signed]
    t0 = time.perf_counter()
    answered = [sign_answer(operator, d, a) for d, a in zip(digests, answers, strict=True)]
    device_sign = (time.perf_counter() - t0) / n
    t0 = time.perf_counter()
    ok = [is_answer_signed_by(a, compute_challenge_digest(c, "run"), operator.address)
          for a, c in zip(answered, signed, strict=True)]
    pinger_verify = (time.perf_counter() - t0) / n
    assert all(ok)
    return {"n": n, "device_verify_challenge_ms": device_verify * 1e3, "device_sign_answer_ms": device_sign * 1e3,
            "device_total_ms": (device_verify + device_sign) * 1e3, "pinger_sign_challenge_ms": pinger_sign * 1e3,
            "pinger_verify_answer_ms": pinger_verify * 1e3}


def summarise(records: list[Any], device_ids: set[str]) -> dict[str, Any]:
    """Return p50/p99/max and the share above each candidate X of the answered latencies."""
    lat = np.array([(r.received_ns - r.sent_ns) / 1e6 for r in records
                    if r.device_id in device_ids and r.received_ns is not None and r.answer_json])
    missing = sum(1 for r in records if r.device_id in device_ids and r.answer_json is None)
    return {"n": int(lat.size), "missing": missing, "p50_ms": float(np.percentile(lat, 50)),
            "p99_ms": float(np.percentile(lat, 99)), "max_ms": float(lat.max()),
            "share_over_x": {str(x): float((lat > x).mean()) for x in X_CANDIDATES_MS}}


LATENCY_SCENARIOS = (  # name, flat out, CPU hog, forced GC
    ("idle", False, False, False),
    ("cpu_hog", False, True, False),
    ("cpu_hog_gc", False, True, True),
    ("flat_out", True, False, False),
    ("flat_out_hog_gc", True, True, True),
)


def bench_latency(run_s: float, rate_hz: float, answer_path: str = "prioritised") -> dict[str, Any]:
    """Return latency summaries of three honest devices per scenario (paced 100 ms or flat out; hog; forced GC).

    answer_path "prioritised" is the device as it is (workload thread niced, 0.5 ms GIL switch interval);
    "plain" is the device before issue 31 (no nice, Python's 5 ms switch interval), for the comparison.
    """
    out: dict[str, Any] = {}
    plain = answer_path == "plain"
    for name, flat, hog, gc_pressure in LATENCY_SCENARIOS:
        roster = tuple(SimDeviceSpec(device_id=f"h{i}", gc_pressure=gc_pressure) for i in range(3))
        config = SimConfig(devices=roster, run_s=run_s, rate_hz=rate_hz, cpu_hog=hog, arena_mib=16,
                           step_interval_ms=0.0 if flat else 100.0, workload_nice=0 if plain else 10,
                           switch_interval_ms=5.0 if plain else 0.5)
        cluster = run_cluster(config, lambda kind, payload: None)
        out[name] = summarise(cluster.records, {d.device_id for d in roster})
        out[name]["gc_pause_ms_max"] = max((p for log in cluster.logs for p in log.gc_pauses_ms), default=0.0)
        out[name]["steps"] = sum(len(log.steps) for log in cluster.logs)
        serve = [x for log in cluster.logs for x in log.serve_ms]  # on the device: recv returned → answer sent
        out[name]["device_serve_ms"] = {"p50": float(np.percentile(serve, 50)), "p99": float(np.percentile(serve, 99)),
                                        "max": max(serve)} if serve else {}
        out[name]["load"] = __import__("os").getloadavg()[0]
    return out


def bench_throughput(run_s: float, window_s: float, repeats: int) -> dict[str, Any]:
    """Return the honest declared-throughput calibration: achieved FLOP per device second, per model and window.

    Honest devices run flat out (four tiny-llama, two of them under forced GC, one SmolLM2), without and with a
    CPU hog; the verifier's measurement (record → declared steps × the step cost it computes → ÷ metered CPU
    seconds) gives each window's rate. A gaps cheater (90 % undeclared) runs beside them for comparison.
    """
    roster = (SimDeviceSpec(device_id="t0"), SimDeviceSpec(device_id="t1"),
              SimDeviceSpec(device_id="t2", gc_pressure=True), SimDeviceSpec(device_id="t3", gc_pressure=True),
              SimDeviceSpec(device_id="smol", model=SMOL_NAME, state_tokens=16),
              SimDeviceSpec(device_id="gaps-90", behaviour="gaps", gaps_fraction=0.9),
              SimDeviceSpec(device_id="gaps-50", behaviour="gaps", gaps_fraction=0.5))
    rates: dict[str, list[float]] = {}
    for i in range(repeats):
        for hog in (False, True):
            config = SimConfig(devices=roster, run_s=run_s, window_s=window_s, arena_mib=16, cpu_hog=hog)
            result = run_sim(config, ROOT / "bench-results" / "spotcheck-throughput", lambda kind, payload: None)
            for d, spec in zip(result.devices, roster, strict=True):
                key = spec.behaviour + ":" + spec.model if spec.behaviour != "gaps" else spec.device_id
                for m in d.measurements:
                    if m.device_s > 0:
                        rates.setdefault(key, []).append(m.declared_flops / m.device_s)
            console.print(f"throughput run {i} hog={hog}: load {__import__('os').getloadavg()[0]:.1f}")
    return {k: {"n": len(v), "min": min(v), "median": float(np.median(v)), "max": max(v), "rates": v}
            for k, v in rates.items()}


def bench_end_to_end_cost(run_s: float, rate_hz: float, repeats: int) -> dict[str, Any]:
    """Return a flat-out device's steps/s without challenges (rate ~0) and at the given rate, alternated."""
    runs: dict[str, list[float]] = {"without": [], "with": []}
    for _ in range(repeats):
        for label, rate in (("without", 1e-3), ("with", rate_hz)):
            config = SimConfig(devices=(SimDeviceSpec(device_id="flat"),), run_s=run_s, rate_hz=rate, cpu_hog=False,
                               arena_mib=16, step_interval_ms=0.0)
            steps = run_cluster(config, lambda kind, payload: None).logs[0].steps
            inside = [s for s in steps if s[2] - steps[0][2] > 1e9]  # skip the first second
            runs[label].append(len(inside) / ((inside[-1][2] - inside[0][1]) / 1e9))
    without, with_ = float(np.median(runs["without"])), float(np.median(runs["with"]))
    return {"steps_per_s_without": without, "steps_per_s_with": with_, "throughput_loss": 1 - with_ / without,
            "runs": runs}


def main() -> None:
    """Run the benchmarks, print a table and write JSON."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", choices=("latency", "throughput"), help="run one part, write its own JSON")
    args = parser.parse_args()
    if args.only:
        run_part(args.only, args.quick)
        return
    config = SimConfig()
    run_s = 8.0 if args.quick else 30.0
    results: dict[str, Any] = {"machine": {"cpus": __import__("os").cpu_count()}}
    results["stuffing"] = bench_stuffing(16 if args.quick else 64)
    results["signatures"] = bench_signatures(200)
    sign_ms = results["signatures"]["device_total_ms"]
    results["answer_cost"] = bench_answer_cost(MODEL_NAME, config.state_tokens, 3.0, config.rate_hz,
                                               config.labels_share, config.labels_count, sign_ms)
    results["answer_cost_smollm2"] = bench_answer_cost(SMOL_NAME, 16, 3.0 if args.quick else 10.0, config.rate_hz,
                                                       config.labels_share, config.labels_count, sign_ms)
    results["end_to_end_cost"] = bench_end_to_end_cost(run_s / 2, config.rate_hz, 1 if args.quick else 3)
    results["latency"] = bench_latency(run_s, config.rate_hz)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(results, indent=1))
    table = Table(title="spot checks on this machine")
    table.add_column("metric")
    table.add_column("value")
    s, c, e = results["stuffing"], results["answer_cost"], results["end_to_end_cost"]
    g, smol = results["signatures"], results["answer_cost_smollm2"]
    rounded = {k: [round(x) for x in v] for k, v in e["runs"].items()}
    rows = [
        ("stuffing fill rate", f"{s['fill_mb_s']:.1f} MB/s ({s['pool_mib']} MiB in {s['fill_s']:.2f} s)"),
        ("Z (cheapest kept block's cone)", f"{s['z_min_s'] * 1e3:.0f} ms ({s['cone_fraction_of_fill']:.0%} of a fill)"),
        ("signatures, device: verify challenge + sign answer", f"{g['device_verify_challenge_ms']:.3f} + "
                                                             f"{g['device_sign_answer_ms']:.3f} ms"),
        ("signatures, pinger: sign challenge / verify answer", f"{g['pinger_sign_challenge_ms']:.3f} / "
                                                              f"{g['pinger_verify_answer_ms']:.3f} ms"),
        ("workload step tiny-llama / SmolLM2-135M", f"{c['step_ms']:.2f} / {smol['step_ms']:.1f} ms"),
        ("state answer tiny / SmolLM2; labels answer", f"{c['state_answer_ms']:.2f} / {smol['state_answer_ms']:.2f}; "
                                                       f"{c['labels_answer_ms']:.2f} ms"),
        (f"answer share of time at {c['rate_hz']} Hz (goal ≤ 1 %), tiny / SmolLM2",
         f"{c['answer_share_of_time']:.2%} / {smol['answer_share_of_time']:.2%}"),
        ("end-to-end throughput loss (median)", f"{e['throughput_loss']:.2%} ({e['steps_per_s_without']:.0f} → "
                                                f"{e['steps_per_s_with']:.0f} steps/s; runs {rounded})"),
    ]
    for name, lat in results["latency"].items():
        over = ", ".join(f">{x}: {v:.1%}" for x, v in lat["share_over_x"].items())
        rows.append((f"latency {name}", f"p50 {lat['p50_ms']:.1f} p99 {lat['p99_ms']:.1f} max {lat['max_ms']:.1f} ms "
                                        f"(n={lat['n']}, missing {lat['missing']}; {over}; GC max "
                                        f"{lat['gc_pause_ms_max']:.1f} ms)"))
    for row in rows:
        table.add_row(*row)
    console.print(table)
    console.print(f"wrote {OUT}")


def run_part(part: str, quick: bool) -> None:
    """Run only the latency comparison or only the throughput calibration; write bench-results/spotcheck-<part>.json."""
    config = SimConfig()
    if part == "latency":
        run_s = 8.0 if quick else 20.0
        out: dict[str, Any] = {path: bench_latency(run_s, config.rate_hz, path) for path in ("plain", "prioritised")}
        for path, scenarios in out.items():
            for name, lat in scenarios.items():
                console.print(f"{path:12s} {name:16s} p50 {lat['p50_ms']:7.1f} p99 {lat['p99_ms']:7.1f} max "
                              f"{lat['max_ms']:7.1f} ms  n={lat['n']} missing {lat['missing']} steps {lat['steps']} "
                              f"load {lat['load']:.1f}; device serve p99 {lat['device_serve_ms'].get('p99', 0):.1f} "
                              f"max {lat['device_serve_ms'].get('max', 0):.1f} ms")
    else:
        out = bench_throughput(20.0 if quick else 30.0, 10.0, 1 if quick else 2)
        for key, v in out.items():
            console.print(f"{key:28s} n={v['n']} FLOP per device-s min {v['min'] / 1e9:.2f} median "
                          f"{v['median'] / 1e9:.2f} max {v['max'] / 1e9:.2f} G")
    path = ROOT / "bench-results" / f"spotcheck-{part}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    console.print(f"wrote {path}")


if __name__ == "__main__":
    main()

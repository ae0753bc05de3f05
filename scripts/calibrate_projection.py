"""Measure projection fingerprints (protocol v2) against TOPLOC (v1) on a real registered model and precision.

Phase ``record`` runs honest operators at the claimed precision (--model, --dtype; default SmolLM2-135M
claimed in bf16) — threads2, threads1, nocache, batch4: the profile's honest variation — and cheaters
(weight noise 0.1 / 0.3 / 1 %, for bf16 also 0.1 % formed in float32; int8; a skipped layer; for fp32
claims bf16 execution; the v1-fitting attack: the last four layers replaced by fitted linear maps whose
last hidden state is fitted to the real one on public prompts), each checked by one fp32 validator
prefill and one prefill at the claimed precision (the same one for fp32 claims). Per run it stores the
executer's and the validator's last hidden state and the recorded decoder layers (layers 0–7 and three
deeper ones, `recorded_layers`; npz under --dir).
Phase ``analyse`` computes, for every fingerprint config (layers, k, bits), the per-run distance at
16 / 32 / 64 tokens, chooses a threshold on the calibration half's honest runs (fit.py's pooled rule:
mean + 6 sd, at least 1.25 × the largest), and reports held-out false positives and detection, beside
TOPLOC with the bf16 profile's thresholds; it writes JSON and a markdown table.
Usage: OMP_WAIT_POLICY=PASSIVE nice -n 10 python scripts/calibrate_projection.py record --prompts 12
       python scripts/calibrate_projection.py analyse --validator bf16
       (another campaign: record --model gemma-3-270m --dtype float32 --dir /tmp/s5/gemma, then analyse
       --validator fp32 --dir /tmp/s5/gemma)
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from node.calibrate.fit import is_calibration_split
from node.calibrate.models import (
    _rebind,
    _SkippedLayer,
    load_engine,
    make_int8_engine,
    make_noisy_engine,
    make_skip_layer_engine,
)
from node.calibrate.runs import Lab, RunSpec, generate, load_prompts
from node.engines.base import GenerationRequest
from node.engines.models import get_model_spec, materialise_model
from node.engines.tokenizer import ModelTokenizer
from node.engines.transformers_engine import TransformersEngine
from node.profiles import load_profile
from node.protocol.fingerprint import build_fingerprint, verify_fingerprint
from node.protocol.hashing import keccak256
from node.protocol.projection import (
    compute_projected_fingerprint,
    compute_projection_distance,
    compute_projection_matrix,
    compute_source_seed,
    decode_projected_fingerprint,
)
from node.protocol.seed import run_seed

HONEST_BY_BACKEND = {"transformers": ("threads2", "threads1", "nocache", "batch4"),
                     "vllm": ("vllm",)}  # vllm: recorded by --vllm in .venv-vllm
HONEST_ALL = (*HONEST_BY_BACKEND["transformers"], *HONEST_BY_BACKEND["vllm"])
HONEST: list[str] = list(HONEST_ALL)  # the honest population the thresholds are calibrated on (--backends)
ATTACKS = ("noise-0.1pct", "noise-0.3pct", "noise-1pct", "int8", "skip-layer", "fit-v1", "noise-0.1pct-f32",
           "bf16-as-fp32", "noise-0.1pct-deep", "noise-0.3pct-deep")
REPORTED = (*ATTACKS, "int8-fitted", "vllm")  # vllm: reported like an attack when its backend is left out
LAYERS: list[int] = []  # the recorded decoder layers of the campaign (set by record, or read from the runs)
LENGTHS = (16, 32, 64)
POOLED_SIGMAS = 6.0
VALIDATOR = ["val"]  # "val": the fp32 validator's prefill; "bf16": a validator at the claimed precision
DEFAULT_DIR = Path("/tmp/s5/runs")


def recorded_layers(num_layers: int) -> tuple[int, ...]:
    """Return the decoder layers a campaign records: 0–7 and three deeper ones (SmolLM2's 30: 14, 21, 28)."""
    return (*range(8), num_layers // 2 - 1, (3 * num_layers) // 4 - 1, num_layers - 2)


def fit_skipped(num_layers: int) -> tuple[int, ...]:
    """Return the layers the v1-fitting attack replaces: the last four."""
    return tuple(range(num_layers - 4, num_layers))


class _FittedLayer(torch.nn.Module):
    """A decoder layer replaced by a fitted linear map of its input (the v1-fitting attack's cheap layer)."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = weight

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return (hidden_states.float() @ self.weight).to(hidden_states.dtype)


def make_noisy_engine_f32(base: TransformersEngine, relative: float, seed: int) -> TransformersEngine:
    """Return the model with every weight w replaced by bf16(w · (1 + relative · N(0, 1))), the product formed in
    float32. make_noisy_engine forms 1 + relative · N in the weights' dtype: in bfloat16 (spacing 2⁻⁷ above 1,
    2⁻⁸ below) that factor is 1 for ~97 % of weights at 0.1 % and 1 − 2⁻⁸ for most of the rest, a sparse
    shrink rather than symmetric noise; this arm is the symmetric version, rounded once."""
    model = copy.deepcopy(base.model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            noise = torch.randn(p.shape, generator=generator, dtype=torch.float32)
            p.copy_((p.float() * (1 + relative * noise)).to(p.dtype))
    return _rebind(base, model)


def make_noisy_deep_engine(base: TransformersEngine, relative: float, seed: int) -> TransformersEngine:
    """Return the model with every weight past decoder layer 0 noised as make_noisy_engine does: the embedding
    table (tied to the LM head) and layer 0 exact. The attack on an early source: the registered sources are
    public, so an operator can compute them exactly and cheat only where no source looks."""
    model = copy.deepcopy(base.model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embed_tokens" in name or ".layers.0." in name:
                continue
            p.mul_(1 + relative * torch.randn(p.shape, generator=generator, dtype=p.dtype))
    return _rebind(base, model)


def _ridge(x: np.ndarray, y: np.ndarray, lam: float = 1e-3) -> np.ndarray:
    """Return W (with a bias row folded into x) minimising |[x 1] W − y|² + lam |W|²."""
    xa = np.concatenate([x, np.ones((len(x), 1))], axis=1).astype(np.float64)
    return np.linalg.solve(xa.T @ xa + lam * len(x) * np.eye(xa.shape[1]), xa.T @ y.astype(np.float64))


class _Affine(torch.nn.Module):
    def __init__(self, w: np.ndarray) -> None:
        super().__init__()
        self.w = torch.tensor(w[:-1], dtype=torch.float32)
        self.b = torch.tensor(w[-1], dtype=torch.float32)

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return (hidden_states.float() @ self.w + self.b).to(hidden_states.dtype)


def make_fit_v1_engine(real: TransformersEngine, lab: Lab, prompts: range) -> TransformersEngine:
    """Return the cheap model: layers FIT_SKIPPED dropped, one affine map fitted in their place, and an affine
    correction of the final norm's output fitted to the real last hidden state, on public prompts."""
    probe = copy.copy(real)
    n = real.model.config.num_hidden_layers
    skipped = fit_skipped(n)
    probe.options = type(real.options)(**{**real.options.__dict__, "record_layers": (skipped[0] - 1, n - 2)})
    texts = [(request[0], gen.output_ids) for request, gen in zip(*_batch(real, lab, "public", "fit", prompts),
                                                                   strict=True)]
    pres = [probe.prefill(ids, out) for ids, out in texts]
    x = np.concatenate([p.layers[0] for p in pres if p.layers is not None])
    w_mid = _ridge(x, np.concatenate([p.layers[1] for p in pres if p.layers is not None]))
    model = copy.deepcopy(real.model)
    layers = model.get_decoder().layers
    layers[skipped[0]] = _Affine(w_mid)  # stands for the last four layers (its output is what layer n − 2 claims)
    for j in skipped[1:]:
        layers[j] = _SkippedLayer()
    cheap = copy.copy(real)
    cheap.model, cheap.decoder, cheap.lm_head = model, model.get_decoder(), model.get_output_embeddings()
    cheap.fast_prefill = False  # its layers are no longer a stock Llama decoder's
    normed = np.concatenate([cheap.prefill(ids, out).hidden for ids, out in texts])
    w_last = _Affine(_ridge(normed, np.concatenate([p.hidden for p in pres])))
    cheap.decoder.norm = torch.nn.Sequential(cheap.decoder.norm, w_last)
    return cheap


def _batch(engine: Any, lab: Lab, kind: str, name: str, indices: range | list[int]) -> tuple[list[Any], list[Any]]:
    """Return the requests (ids, params, seed) of run specs and one batched generation of all of them."""
    requests = []
    for i in indices:
        ids, params, user_seed, iid = lab.request(RunSpec(kind, name, i))
        requests.append((ids, params, run_seed(user_seed, iid)))
    gens = engine.generate([GenerationRequest(ids, params, seed, lab.k) for ids, params, seed in requests])
    return requests, gens


def build(model: str, dtype: str, attacks: bool = True, vllm: bool = False) -> tuple[Lab, dict[str, Any]]:
    """Return the lab (fp32 validator, honest at the claimed precision) and every generator, all recording
    the campaign's layers (LAYERS, set here from the model's depth)."""
    spec = get_model_spec(model)
    files = materialise_model(spec)
    validator = load_engine(files.path, model)
    num_layers = validator.model.config.num_hidden_layers
    LAYERS[:] = recorded_layers(num_layers)
    opts = {"record_layers": tuple(LAYERS)}
    validator.options = dataclasses.replace(validator.options, record_layers=tuple(LAYERS))  # hooks: read per call
    honest = validator if dtype == "float32" else load_engine(files.path, model, dtype=dtype, **opts)
    lab = Lab(files, ModelTokenizer(files.path, spec.chat), validator, {}, load_prompts(), 64, honest=honest,
              dtype=dtype)
    if vllm:  # the vLLM backend's honest operator only (its engine and two transformers ones fit in memory)
        from node.engines.vllm_engine import VllmEngine, VllmOptions

        return lab, {"vllm": VllmEngine(files.path, model, VllmOptions(dtype=dtype, record_layers=tuple(LAYERS)))}
    gens: dict[str, Any] = {
        "threads2": honest, "nocache": load_engine(files.path, model, dtype=dtype, kv_cache=False, **opts)}
    if not attacks:
        return lab, gens
    gens |= {
        "noise-0.1pct": make_noisy_engine(honest, 0.001, seed=7),
        "noise-0.3pct": make_noisy_engine(honest, 0.003, seed=7),
        "noise-1pct": make_noisy_engine(honest, 0.01, seed=7),
        "noise-0.1pct-deep": make_noisy_deep_engine(honest, 0.001, seed=7),
        "noise-0.3pct-deep": make_noisy_deep_engine(honest, 0.003, seed=7),
        "int8": make_int8_engine(validator),
        "skip-layer": make_skip_layer_engine(honest, layer=num_layers // 2),
        # fitted on public prompts the campaign never uses (the last 8 of the prompt set)
        "fit-v1": make_fit_v1_engine(honest, lab, range(len(lab.prompts) - 8, len(lab.prompts))),
    }
    if dtype == "bfloat16":
        gens["noise-0.1pct-f32"] = make_noisy_engine_f32(honest, 0.001, seed=7)
    else:
        gens["bf16-as-fp32"] = load_engine(files.path, model, dtype="bfloat16", **opts)
    return lab, gens


def record(out: Path, prompts: range, model: str, dtype: str, attacks: bool = True, vllm: bool = False) -> None:
    """Run honest and attack arms not yet recorded; store hidden states per run.

    Honest single-request variants generate one request at a time; batch4 in batches of four; each
    cheater generates all its prompts in one batch (a cheater may batch; it only adds batch numerics).
    """
    torch.set_num_threads(1)  # the machine is shared: one thread, except the threads2 arm
    out.mkdir(parents=True, exist_ok=True)
    lab, gens = build(model, dtype, attacks, vllm)

    def save(spec: RunSpec, ids: tuple[int, ...], gen: Any) -> None:
        pre = lab.validator.prefill(ids, gen.output_ids)
        # a validator at the claimed precision ("bf16_*" keys whatever the precision: the first campaign's names)
        own = pre if lab.honest is lab.validator else lab.honest.prefill(ids, gen.output_ids)
        path = out / (spec.key.replace("/", "_") + ".npz")
        np.savez(path, exec_hidden=gen.hidden, exec_layers=np.asarray(gen.layers),
                 val_hidden=pre.hidden, val_layers=np.asarray(pre.layers), bf16_hidden=own.hidden,
                 bf16_layers=np.asarray(own.layers),
                 output_ids=np.array(gen.output_ids), prompt_ids=np.array(ids), prompt_rows=len(ids), key=spec.key,
                 kind=spec.kind, name=spec.name, layers=np.array(LAYERS), model=lab.files.spec.name, dtype=dtype)
        print(spec.key, file=sys.stderr, flush=True)

    def done(kind: str, name: str, i: int) -> bool:
        return (out / f"{kind}_{name}_{i}.npz").exists()

    for name in ("threads2", *ATTACKS, "batch4", "nocache", "threads1", "vllm"):
        if name not in gens and (name not in HONEST_ALL or name == "vllm" or vllm):
            continue
        kind = "honest" if name in HONEST_ALL else "attack"
        todo = [i for i in prompts if not done(kind, name, i)]
        if not todo:
            continue
        if kind == "attack":
            requests, batch = _batch(gens[name], lab, kind, name, todo)
            for i, (ids, _, _), gen in zip(todo, requests, batch, strict=True):
                save(RunSpec(kind, name, i), ids, gen)
            continue
        for i in todo:
            spec = RunSpec(kind, name, i)
            ids, params, user_seed, iid = lab.request(spec)
            if name == "batch4":
                gen = lab.honest.generate([GenerationRequest(*_req(lab, spec, s)) for s in range(4)])[0]
            else:
                torch.set_num_threads(2 if name == "threads2" else 1)
                gen = generate(gens.get(name, lab.honest), lab, ids, params, run_seed(user_seed, iid))
                torch.set_num_threads(1)
            save(spec, ids, gen)


def _req(lab: Lab, spec: RunSpec, shift: int) -> tuple[Any, ...]:
    ids, params, user_seed, iid = lab.request(spec, shift)
    return ids, params, run_seed(user_seed, iid + shift), lab.k


# ---- analysis ----------------------------------------------------------------------------------

def source_rows(run: Any, side: str, layer: str) -> np.ndarray:
    """Return one side's rows of a source: 'last' (the last hidden state) or a recorded layer number."""
    if layer == "last":
        return np.asarray(run[f"{side}_hidden"])
    return np.asarray(np.asarray(run[f"{side}_layers"])[LAYERS.index(int(layer))])


def toploc_thresholds() -> Any:
    """Return the TOPLOC (v1) thresholds of the registered entry's profile: the baseline v2 is compared with."""
    profile = load_profile(get_model_spec(REGISTERED[0]))[1].fingerprint
    if profile is None:
        raise SystemExit(f"{REGISTERED[0]}'s profile has no [fingerprint] section")
    return profile


def toploc_caught(run: Any, rows: int, t: Any) -> bool:
    """Return whether TOPLOC with the profile's thresholds (compared with the fp32 validator, as deployed)
    rejects the run's first `rows` rows."""
    p = int(run["prompt_rows"])
    ms = verify_fingerprint(run["val_hidden"][:rows], p, build_fingerprint(run["exec_hidden"][:rows], p))
    return any(m.exponent_mismatches > t.max_exponent_mismatches or m.mantissa_error_mean > t.max_mantissa_error_mean
               or m.sign_mismatches > t.max_sign_mismatches for m in ms)


def source_distances(run: Any, layers: tuple[str, ...], k: int, bits: int, tokens: int, seed: bytes) -> list[float]:
    """Return per source the projection distance over the rows the protocol projects for `tokens` generated
    tokens (rows P − 1 … P + tokens − 2: the last prompt row and the fed-back ones), k dims split over the
    sources. The decision (node.checks.projection) holds each source to its own threshold."""
    per = k // len(layers)
    first = int(run["prompt_rows"]) - 1
    out = []
    for j, layer in enumerate(layers):
        ex = source_rows(run, "exec", layer)[first:first + tokens]
        va = source_rows(run, VALIDATOR[0], layer)[first:first + tokens]
        matrix = compute_projection_matrix(compute_source_seed(seed, j), per, ex.shape[1])
        blob = compute_projected_fingerprint(ex, matrix, bits)
        codes = decode_projected_fingerprint(blob, tokens, per, bits)
        out.append(compute_projection_distance(codes, va, matrix, bits))
    return out


def pooled_threshold(values: list[float]) -> float:
    """Return fit.py's pooled rule: mean + 6 sd, at least 1.25 × the largest."""
    return max(statistics.fmean(values) + POOLED_SIGMAS * statistics.pstdev(values), 1.25 * max(values))


def sources() -> tuple[tuple[str, ...], ...]:
    """Return the analysed source sets over the recorded layers (SmolLM2: deep = 28, 3/4 = 21, mid = 14)."""
    mid, three_quarters, deep = (str(x) for x in LAYERS[-3:])
    return (
        ("last",), (deep,), (three_quarters,), (mid,), ("7",), ("6",), ("5",), ("4",), ("3",), ("2",), ("1",), ("0",),
        ("7", "last"), ("7", deep), (mid, "last"), ("3", "last"), ("3", "7"), ("1", "7"),
        ("0", "last"), ("1", "last"), ("0", deep), ("1", deep), ("0", "7"), ("0", "1"),
    )


CODES = ((2, 16), (4, 8), (8, 4), (16, 2), (32, 1), (4, 16), (8, 8), (16, 4), (32, 2), (16, 8), (32, 4), (32, 8))


def configs() -> list[tuple[tuple[str, ...], int, int]]:
    """Return every analysed (sources, k, bits): k dims in all, split over the sources."""
    return [(layers, k, bits) for layers in sources() for k, bits in CODES]


SMOLLM2_LAYERS = (0, 1, 2, 3, 4, 5, 6, 7, 14, 21, 28)  # the first campaign's runs carry no "layers" entry


def load_runs(src: Path) -> list[dict[str, Any]]:
    """Return a campaign's runs (plus the fitted attack) and set LAYERS from them."""
    runs = [dict(np.load(p, allow_pickle=False)) for p in sorted(src.glob("*.npz"))]
    if not runs:
        raise SystemExit(f"no runs under {src}")
    LAYERS[:] = [int(x) for x in runs[0].get("layers", SMOLLM2_LAYERS)]
    for r in runs:  # honest runs of a backend the thresholds are not calibrated for: measured, never fitted
        if str(r["kind"]) == "honest" and str(r["name"]) not in HONEST:
            r["kind"] = "off-backend"
    return add_fitted_attack(runs)


FIT_PUBLIC = range(0, 6)  # int8-fitted: the prompts whose real activations the attacker fits on (then left out)


def add_fitted_attack(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Return runs plus "int8-fitted": the int8 cheater's rows (last hidden state and every recorded layer)
    corrected by an affine map fitted, on public prompts FIT_PUBLIC, to the real model's rows on the same
    text (the attack that knows the fingerprint and fits a cheaper model to it); the fit prompts are dropped."""
    int8 = [r for r in runs if str(r["name"]) == "int8"]
    public = [r for r in int8 if int(str(r["key"]).rsplit("/", 1)[1]) in FIT_PUBLIC]
    maps: dict[str | int, np.ndarray] = {"hidden": _ridge(np.concatenate([r["exec_hidden"] for r in public]),
                             np.concatenate([r["bf16_hidden"] for r in public]))}
    for j in range(len(LAYERS)):
        maps[j] = _ridge(np.concatenate([r["exec_layers"][j] for r in public]),
                         np.concatenate([r["bf16_layers"][j] for r in public]))

    def correct(x: np.ndarray, w: np.ndarray) -> np.ndarray:
        return np.asarray((x.astype(np.float64) @ w[:-1] + w[-1]).astype(np.float32))

    fitted = []
    for r in int8:
        if any(r is q for q in public):
            continue
        layers = np.stack([correct(r["exec_layers"][j], maps[j]) for j in range(len(LAYERS))])
        fitted.append({**r, "exec_hidden": correct(r["exec_hidden"], maps["hidden"]), "exec_layers": layers,
                       "name": "int8-fitted", "key": str(r["key"]).replace("int8", "int8-fitted")})
    return runs + fitted


WHY_GROUPS = {"honest": HONEST, "noise-0.1pct": ("noise-0.1pct",), "noise-0.1pct-f32": ("noise-0.1pct-f32",),
              "noise-0.3pct": ("noise-0.3pct",),
              "noise-1pct": ("noise-1pct",), "skip-layer": ("skip-layer",), "fit-v1": ("fit-v1",)}
OVER_GROUPS = ("noise-0.1pct", "noise-0.1pct-f32", "noise-0.3pct")


def relative_distance(run: Any, layer: str, tokens: int = 64) -> float:
    """Return the mean over the projected rows of |executer − validator| / |validator| (unquantised)."""
    first = int(run["prompt_rows"]) - 1
    ex = source_rows(run, "exec", layer)[first:first + tokens].astype(np.float64)
    va = source_rows(run, VALIDATOR[0], layer)[first:first + tokens].astype(np.float64)
    return float(np.mean(np.linalg.norm(ex - va, axis=1) / np.linalg.norm(va, axis=1)))


def why_table(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Return, per single source, the min / mean / max relative distance of each group's runs (all 12 prompts)
    and the separation: how many 0.1 % noise runs exceed the largest honest run of the same source."""
    table: dict[str, Any] = {}
    for layer in ("last", *[str(n) for n in reversed(LAYERS)]):
        row: dict[str, Any] = {}
        for group, names in WHY_GROUPS.items():
            values = [relative_distance(r, layer) for r in runs if str(r["name"]) in names]
            row[group] = {"min": min(values), "mean": statistics.fmean(values), "max": max(values),
                          "n": len(values)} if values else None
        honest_max = row["honest"]["max"] if row["honest"] else None
        for group in OVER_GROUPS:
            values = [relative_distance(r, layer) for r in runs if str(r["name"]) == group]
            if row[group] is not None and honest_max is not None:
                row[group]["over_honest_max"] = [sum(v > honest_max for v in values), len(values)]
        table[layer] = row
    return table


def print_why(why: dict[str, Any]) -> None:
    """Print the unquantised relative-distance table (min–max per group; 0.1 / 0.3 % over the honest max)."""
    groups = list(WHY_GROUPS)
    print("| source | " + " | ".join(groups) + " | " + " | ".join(f"{g} > honest max" for g in OVER_GROUPS) + " |")
    print("|---|" + "---:|" * (len(groups) + len(OVER_GROUPS)))
    for layer, row in why.items():
        cells = [f"{row[g]['min']:.4f}–{row[g]['max']:.4f}" if row[g] else "–" for g in groups]
        over = [f"{row[g]['over_honest_max'][0]}/{row[g]['over_honest_max'][1]}" if row[g] else "–"
                for g in OVER_GROUPS]
        print(f"| {'layer ' + layer if layer != 'last' else 'last'} | " + " | ".join(cells + over) + " |")


def analyse(src: Path, out: Path, fresh_dir: Path | None = None) -> None:
    """Compute every config's distances, thresholds and rates; write JSON and print a markdown table. Honest
    runs under fresh_dir (recorded after the choice) are checked against each config's thresholds."""
    fresh = [r for r in (dict(np.load(p, allow_pickle=False)) for p in sorted(fresh_dir.glob("*.npz")))
             if str(r["name"]) in HONEST] if fresh_dir else []
    runs = load_runs(src)
    head = runs[0]
    result: dict[str, Any] = {"runs": len(runs), "validator": VALIDATOR[0], "configs": [], "layers": LAYERS,
                              "honest": list(HONEST),
                              "model": str(head.get("model", "smollm2-135m-instruct")),
                              "dtype": str(head.get("dtype", "bfloat16")), "why": why_table(runs)}
    print_why(result["why"])
    present = [name for name in REPORTED if name not in HONEST and any(str(r["name"]) == name for r in runs)]
    thresholds = toploc_thresholds()
    toploc: dict[str, dict[str, list[bool]]] = {str(n): {str(r["name"]): [] for r in runs} for n in LENGTHS}
    for r in runs:
        for n in LENGTHS:
            toploc[str(n)][str(r["name"])].append(toploc_caught(r, int(r["prompt_rows"]) + n - 1, thresholds))
    result["toploc"] = {n: {name: [sum(v), len(v)] for name, v in d.items()} for n, d in toploc.items()}
    for layers, k, bits in configs():
        if k % len(layers):
            continue
        entry: dict[str, Any] = {"layers": list(layers), "k": k, "bits": bits, "bytes_per_token": k * bits / 8,
                                 "by_length": {}}
        for n in LENGTHS:
            d = [(str(r["key"]), str(r["kind"]), str(r["name"]),
                  source_distances(r, layers, k, bits, n, keccak256(str(r["key"]).encode()))) for r in runs]
            thr = [pooled_threshold([v[j] for key, kind, _, v in d if kind == "honest" and is_calibration_split(key)])
                   for j in range(len(layers))]
            honest_max = [max(v[j] for _, kind, _, v in d if kind == "honest") for j in range(len(layers))]

            def over(v: list[float], bound: list[float]) -> bool:
                return any(x > b for x, b in zip(v, bound, strict=True))

            rates = {}
            for name in (*HONEST, *present):
                held = [v for key, _, nm, v in d if nm == name and not is_calibration_split(key)]
                every = [v for _, _, nm, v in d if nm == name]
                rates[name] = {"held_out_rejected": [sum(over(v, thr) for v in held), len(held)],
                               "all_over_honest_max": [sum(over(v, honest_max) for v in every), len(every)],
                               "mean": [statistics.fmean(v[j] for v in every) for j in range(len(layers))]
                               if every else None}
            fresh_over = sum(over(source_distances(r, layers, k, bits, n, keccak256(str(r["key"]).encode())), thr)
                             for r in fresh)
            entry["by_length"][str(n)] = {"thresholds": thr, "honest_max": honest_max, "rates": rates,
                                          "fresh_honest_rejected": [fresh_over, len(fresh)]}
        result["configs"].append(entry)
    out.write_text(json.dumps(result, separators=(",", ":")) + "\n")
    print_table(result)


def print_table(result: dict[str, Any]) -> None:
    """Print detection at 64 tokens per config: held-out (calibrated threshold) and all runs (over honest max)."""
    t = result["toploc"]["64"]
    names = [a for a in REPORTED if a in t and a not in HONEST]
    print("| fingerprint | B/token | honest FP (held-out) | " + " | ".join(names) + " |")
    print("|---|---:|---:|" + "---:|" * len(names))
    hon = [sum(t[h][0] for h in HONEST if h in t), sum(t[h][1] for h in HONEST if h in t)]
    print(f"| TOPLOC v1 ({REGISTERED[0]} profile) | 8.06 | {hon[0]}/{hon[1]} (all) | "
          + " | ".join(f"{t[a][0]}/{t[a][1]}" for a in names if a in t) + " |")
    for c in result["configs"]:
        b = c["by_length"]["64"]["rates"]
        fp = [sum(b[h]["held_out_rejected"][i] for h in HONEST) for i in (0, 1)]
        cells = [f"{b[a]['held_out_rejected'][0]}/{b[a]['held_out_rejected'][1]} "
                 f"({b[a]['all_over_honest_max'][0]}/{b[a]['all_over_honest_max'][1]})" for a in names]
        print(f"| {'+'.join(c['layers'])} k={c['k']} {c['bits']}-bit | {c['bytes_per_token']:g} | {fp[0]}/{fp[1]} | "
              + " | ".join(cells) + " |")


def choose_config(result: dict[str, Any], budget: float = 4.0) -> dict[str, Any] | None:
    """Return the config within `budget` bytes/token, with no held-out honest rejection at any length and no
    threshold of 0 (all honest calibration runs at 0: a spread the pooled rule cannot estimate, one bin crossing
    would reject), that catches the most held-out 0.1 % and 0.3 % noise runs at 64 tokens, then the most runs of
    every other attack (a fingerprint committed instead of TOPLOC must not open a blind spot; ties: fewer bytes,
    then sources)."""
    def fp(c: dict[str, Any]) -> int:
        return sum(c["by_length"][n]["rates"][h]["held_out_rejected"][0] for n in c["by_length"] for h in HONEST)

    def caught(c: dict[str, Any], names: tuple[str, ...]) -> int:
        rates = c["by_length"]["64"]["rates"]
        return sum(rates[a]["held_out_rejected"][0] for a in names if a in rates)

    def degenerate(c: dict[str, Any]) -> bool:  # every honest calibration run measured 0: no spread to estimate
        return any(t == 0 for n in c["by_length"] for t in c["by_length"][n]["thresholds"])

    noise = ("noise-0.1pct", "noise-0.3pct")
    others = tuple(a for a in (*ATTACKS, "int8-fitted") if a not in noise)  # attacks only, never honest runs
    ok = [c for c in result["configs"] if c["bytes_per_token"] <= budget and fp(c) == 0 and not degenerate(c)]
    return max(ok, key=lambda c: (caught(c, noise), caught(c, others), -c["bytes_per_token"], -len(c["layers"])),
               default=None)


REGISTERED = ["smollm2-135m-instruct-bf16"]  # the registry entry of the campaign's model and precision


def registered_config(result: dict[str, Any]) -> dict[str, Any] | None:
    """Return the analysed config that the registry's projection for REGISTERED names (k: dims per source)."""
    projection = get_model_spec(REGISTERED[0]).projection
    if projection is None:
        return None
    layers = [str(x) for x in projection.layers]
    k = projection.k * len(layers)
    return next((c for c in result["configs"] if c["layers"] == layers and c["k"] == k
                 and c["bits"] == projection.bits), None)


def write_profile_section(path: Path, config: dict[str, Any], source: str) -> None:
    """Replace (or append) the [projection] section of a profile with a config's calibrated thresholds (one
    table per source when there are several: each source is held to its own)."""
    layers = config["layers"]
    per_source = [{n: v["thresholds"][j] for n, v in config["by_length"].items()} for j in range(len(layers))]
    text = path.read_text()
    head_lines = text.split("\n[projection]")[0].rstrip("\n").split("\n")
    while head_lines and head_lines[-1].startswith("#"):  # the previous section's provenance comment
        head_lines.pop()
    head = "\n".join(head_lines).rstrip("\n")

    def table(name: str, by_length: dict[str, float]) -> list[str]:
        return [f"[{name}]", f"max_distance = {max(by_length.values())!r}", "", f"[{name}.by_length]",
                *[f'"{n}" = {t!r}' for n, t in sorted(by_length.items(), key=lambda x: int(x[0]))]]

    lines = [f"# {source}: sources {layers}, {config['k']} dims in all, {config['bits']} bits "
             f"({config['bytes_per_token']:g} B/token); thresholds: fit.py's pooled rule on the calibration half"]
    if len(layers) == 1:
        lines += table("projection", per_source[0])
    else:
        lines += ["# every source is held to its own thresholds; the flat bound is the largest of them",
                  "[projection]", f"max_distance = {max(max(t.values()) for t in per_source)!r}"]
        for layer, by_length in zip(layers, per_source, strict=True):
            lines += ["", *table(f'projection.by_source."{layer}"', by_length)]
    path.write_text(head + "\n\n" + "\n".join(lines) + "\n")


def plot_config(src: Path, layers: tuple[str, ...], k: int, bits: int, out: Path) -> None:
    """Write a strip plot per source of one config's 64-token distances per group (honest variants, attacks)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = load_runs(src)
    names = {str(r["name"]) for r in runs}
    others = ("vllm", "noise-0.1pct", "noise-0.1pct-f32", "noise-0.3pct", "noise-1pct", "bf16-as-fp32",
              "noise-0.1pct-deep", "noise-0.3pct-deep", "skip-layer", "fit-v1", "int8-fitted")
    groups = tuple(dict.fromkeys(g for g in (*HONEST, *others) if g in names))
    fig, axes = plt.subplots(1, len(layers), figsize=(8 * len(layers), 4), squeeze=False)
    d = {name: [(str(r["key"]), source_distances(r, layers, k, bits, 64, keccak256(str(r["key"]).encode())))
                for r in runs if str(r["name"]) == name] for name in groups}
    for j, (layer, ax) in enumerate(zip(layers, axes[0], strict=True)):
        cal = [v[j] for name in HONEST for key, v in d.get(name, []) if is_calibration_split(key)]
        for i, name in enumerate(groups):
            ax.scatter([i] * len(d[name]), [v[j] for _, v in d[name]], s=12,
                       color="tab:blue" if name in HONEST else "tab:orange" if name == "vllm" else "tab:red")
        ax.axhline(pooled_threshold(cal), color="grey", linestyle="--", linewidth=1,
                   label="threshold (calibration half)")
        ax.legend(loc="upper left", fontsize=8)
        ax.set_xticks(range(len(groups)), groups, rotation=30)
        ax.set_ylabel("projection distance (64 tokens)")
        ax.set_yscale("log")
        ax.set_title(f"source {layer} of {'+'.join(layers)}, k {k}, {bits} bits, validator {VALIDATOR[0]}")
    fig.tight_layout()
    fig.savefig(out, dpi=90)


def main() -> None:
    """Parse arguments and run a phase."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("phase", choices=("record", "analyse", "plot"))
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--first", type=int, default=0, help="record: the first prompt index (fresh runs: 12)")
    parser.add_argument("--honest-only", action="store_true", help="record: honest arms only (fresh honest runs)")
    parser.add_argument("--backends", default="transformers,vllm",
                        help="analyse: the backends whose honest runs calibrate the thresholds (others are reported)")
    parser.add_argument("--vllm", action="store_true",
                        help="record: the vLLM backend's honest arm only (run with .venv-vllm's python)")
    parser.add_argument("--fresh", type=Path, default=None,
                        help="analyse: a directory of honest runs recorded after the choice, never fitted: "
                             "reported against each config's thresholds")
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    parser.add_argument("--out", type=Path, default=Path("bench-results/projection.json"))
    parser.add_argument("--validator", choices=("fp32", "bf16"), default="fp32",
                        help="which prefill the projections are compared with")
    parser.add_argument("--profile", type=Path, default=None, help="write the chosen config's [projection] here")
    parser.add_argument("--layers", default="7", help="plot: the sources, '+'-joined ('last' or a layer number)")
    parser.add_argument("--k", type=int, default=4, help="plot: dimensions (split over the sources)")
    parser.add_argument("--bits", type=int, default=8, help="plot: bits per dimension")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="record: the registered model's weights")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16",
                        help="record: the claimed precision")
    parser.add_argument("--registered", default=None,
                        help="the registry entry of model and precision (its profile's TOPLOC thresholds are the "
                             "baseline; its projection's thresholds go to --profile); default: read from the runs")
    args = parser.parse_args()
    VALIDATOR[0] = "val" if args.validator == "fp32" else "bf16"
    HONEST[:] = [name for backend in args.backends.split(",") for name in HONEST_BY_BACKEND[backend]]
    if args.phase == "record":
        record(args.dir, range(args.first, args.first + args.prompts), args.model, args.dtype,
               not args.honest_only, args.vllm)
        return
    head = next(iter(sorted(args.dir.glob("*.npz"))), None)
    meta = dict(np.load(head, allow_pickle=False)) if head is not None else {}
    model, dtype = str(meta.get("model", "smollm2-135m-instruct")), str(meta.get("dtype", "bfloat16"))
    REGISTERED[0] = args.registered or (model if dtype == "float32" else f"{model}-bf16")
    if args.phase == "plot":
        plot_config(args.dir, tuple(args.layers.split("+")), args.k, args.bits, args.out)
    else:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        analyse(args.dir, args.out, args.fresh)
        result = json.loads(args.out.read_text())
        chosen = choose_config(result)
        shown = chosen and {k: chosen[k] for k in ("layers", "k", "bits")}
        print(f"chosen (≤ 4 B/token, 0 held-out honest rejections, most noise caught at 64): {shown}")
        if args.profile is not None:
            # the profile's thresholds belong to the registered projection, whatever this run would choose: a
            # new choice is a registry change (config/models.toml), made by hand once it meets the goal
            registered = registered_config(result)
            if registered != chosen:
                print(f"note: the registry's projection {registered and registered['layers']} differs from the "
                      "choice above; writing the registered one's thresholds")
            if registered is not None:
                write_profile_section(args.profile, registered, f"scripts/calibrate_projection.py over {args.dir} "
                                                                f"(honest backends: {args.backends})")


if __name__ == "__main__":
    main()

"""The dense stage-2 calibration of an MoE model: honest operators and the decode-only cheaters (issue 30).

An MoE operator's served tokens are checked like a dense model's (stage 1, then stage 2 on one prefill of the
claimed MoE model: node.moe.dense), so the model needs a dense profile. This lab is node.calibrate's, with the
attacks an MoE operator mounts where the per-expert duties cannot see them: the tokens and leaves from a cheaper
decode (node.moe.attacks.DECODE_ONLY), the fingerprint rows and the per-expert trace from the real model.
Honest operators vary as in the dense labs (threads, KV cache off, batches of four). The records, the fit and
the profile are the dense tooling's: `python -m node.calibrate.moe run …`, then `verinfer calibrate fit`.
"""

from __future__ import annotations

import argparse
import copy
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

from node.calibrate.models import load_engine
from node.calibrate.runs import Lab, RunSpec, load_prompts, plan_runs, run_calibration
from node.engines.models import get_model_spec, materialise_model
from node.engines.tokenizer import ModelTokenizer
from node.moe.attacks import DECODE_ONLY, make_decode_only_engine

log = logging.getLogger(__name__)
MOE_HONEST_VARIANTS = ("threads2", "threads1", "nocache", "batch4")


def build_moe_lab(model: str, tokens: int, attacks: tuple[str, ...] = DECODE_ONLY) -> Lab:
    """Return the lab of an MoE model claimed in float32: one loaded model, the cheaters patch it while decoding."""
    spec = get_model_spec(model)
    if not spec.is_moe:
        raise ValueError(f"{model} is not an MoE model")
    files = materialise_model(spec)
    validator = load_engine(files.path, model)
    nocache = copy.copy(validator)  # the same weights, decoding without a KV cache
    nocache.options = replace(validator.options, kv_cache=False)
    generators: dict[str, Any] = {"threads2": validator, "nocache": nocache}
    parent = None
    if "moe-dense-parent" in attacks:
        dense = get_model_spec(spec.tokenizer_from or "")
        parent = load_engine(materialise_model(dense).path, dense.name)
    for name in attacks:
        generators[name] = make_decode_only_engine(name, validator, parent)
    return Lab(files, ModelTokenizer(files.path, spec.chat), validator, generators, load_prompts(), tokens)


def main(argv: list[str] | None = None) -> int:
    """Record honest and decode-only attack runs of an MoE model (resumable, appends to OUT/RUNS_FILE)."""
    parser = argparse.ArgumentParser(prog="python -m node.calibrate.moe", description=main.__doc__)
    parser.add_argument("--model", default="smollm2-moe-4x135m")
    parser.add_argument("--out", type=Path, default=None, help="default docs/calibration/<model>.float32")
    parser.add_argument("--honest", type=int, default=16)
    parser.add_argument("--per-attack", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--runs-file", default="runs.jsonl")
    parser.add_argument("--variants", default=",".join(MOE_HONEST_VARIANTS))
    parser.add_argument("--attacks", default=",".join(DECODE_ONLY))
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.WARNING)
    attacks = tuple(a for a in args.attacks.split(",") if a)
    variants = tuple(v for v in args.variants.split(",") if v)
    if not set(attacks) <= set(DECODE_ONLY) or not set(variants) <= set(MOE_HONEST_VARIANTS):
        parser.error(f"attacks among {DECODE_ONLY}, variants among {MOE_HONEST_VARIANTS}")
    lab = build_moe_lab(args.model, args.tokens, attacks)
    out = args.out or Path("docs/calibration") / f"{args.model}.float32"
    specs: list[RunSpec] = list(plan_runs(args.honest, args.per_attack, variants, attacks, args.start))

    def progress(done: int, total: int) -> None:
        log.warning("%d / %d run specs", done, total)

    ran = run_calibration(lab, out / args.runs_file, specs, progress)
    log.warning("ran %d specs into %s", ran, out / args.runs_file)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

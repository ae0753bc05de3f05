"""`verinfer moe …`: build the MoE model, generate with per-expert commitments, check one expert, calibrate.

Exit codes: 0 accepted / done, 1 a duty rejected, 2 bad input (typed error).
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from node.errors import VerinferError

console = Console(soft_wrap=True)
moe_app = typer.Typer(help="Mixture-of-experts: per-expert commitments and expert-level checks.", no_args_is_help=True)
MODEL = typer.Option("smollm2-moe-4x135m", "--model", help="MoE model: smollm2-moe-4x135m or tiny-moe.")
REPORT_DIR = Path("docs/moe")


def _load(model: str) -> tuple[Path, Any, Any]:
    import torch

    from node.engines.tokenizer import ModelTokenizer
    from node.engines.transformers_engine import TransformersEngine
    from node.moe.model import materialise_moe

    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    folder = materialise_moe(model)
    return folder, TransformersEngine(folder, model), ModelTokenizer(folder, True)


@moe_app.command("build")
def build(model: str = MODEL) -> None:
    """Build (once) the MoE model folder and print where it is."""
    from node.moe.model import materialise_moe

    console.print(str(materialise_moe(model)))


@moe_app.command("generate")
def generate(prompt: str = typer.Argument(..., help="User message."), model: str = MODEL,
             max_tokens: int = typer.Option(24, min=1, max=512), seed: int = typer.Option(1),
             expert: str = typer.Option("layer3.e1", help="Expert to check after generating.")) -> None:
    """Generate, commit per expert, then check one expert, its layer's router and the link; print the numbers."""
    from node.moe.calibration import TokenSequence
    from node.moe.trace import build_commitment, record_trace
    from node.moe.validate import load_expert, load_router, load_shared, verify_expert, verify_link, verify_router
    from node.protocol.moe import ExpertKey
    from node.protocol.sampler import SamplingParams
    from node.protocol.seed import run_seed

    try:
        key = ExpertKey.parse(expert)
        folder, engine, tokenizer = _load(model)
        from node.engines.base import GenerationRequest

        ids = tuple(tokenizer.encode_chat([{"role": "user", "content": prompt}]))
        request = GenerationRequest(ids, SamplingParams(0.7, 0.95, 0, max_tokens), run_seed(seed, 1), 5,
                                    frozenset({2}))
        out = engine.generate([request])[0]
        seq = TokenSequence(ids, out.output_ids)
        trace = record_trace(engine.model, seq.fed)
        commitment = build_commitment(trace)
        leaves = commitment.leaves_of(key)
        check = verify_expert(load_expert(folder, key), leaves, trace.get_expert_inputs(key))
        rl = [r for r in commitment.router if r.layer == key.layer]
        router = verify_router(load_router(folder, key.layer), rl, trace.inputs[key.layer, [r.position for r in rl]])
        link = verify_link(load_shared(folder), seq.fed, commitment, trace)
    except VerinferError as e:
        console.print(f"[red]rejected input:[/red] {e}")
        raise typer.Exit(2) from None
    console.print(f"[bold]{tokenizer.decode(out.output_ids)}[/bold]")
    table = Table(show_header=False)
    table.add_row("moeRoot", commitment.root().hex())
    for name, value in (("expert", check), ("router", router), ("link", link)):
        table.add_row(name, json.dumps(dataclasses.asdict(value)))
    console.print(table)


@moe_app.command("calibrate")
def calibrate(model: str = MODEL, sequences: int = typer.Option(12, min=2), max_tokens: int = typer.Option(24),
              out: Path = typer.Option(REPORT_DIR, help="Folder for campaign.jsonl and limits.json.")) -> None:
    """Run the calibration campaign (honest + the four attacks), fit limits, report the held-out split."""
    from node.calibrate.runs import load_prompts
    from node.moe.attacks import ATTACKS
    from node.moe.calibration import (
        Duties,
        fit_limits,
        generate_sequences,
        result_to_json,
        run_campaign,
        summarise,
    )
    from node.moe.validate import load_shared

    folder, engine, tokenizer = _load(model)
    started = time.monotonic()
    seqs = generate_sequences(engine, tokenizer, load_prompts(), sequences, max_tokens, frozenset({2}))
    console.print(f"generated {len(seqs)} sequences in {time.monotonic() - started:.0f} s")
    duties = Duties(folder, load_shared(folder))
    out.mkdir(parents=True, exist_ok=True)
    results = []
    with (out / "campaign.jsonl").open("w") as f:
        for r in run_campaign(engine.model, duties, seqs, ATTACKS, progress=lambda m: console.print(m)):
            results.append(r)
            f.write(json.dumps(result_to_json(r)) + "\n")
    limits = fit_limits(results)
    report = {"model": model, "sequences": len(seqs), "max_tokens": max_tokens,
              "tokens": [len(s.prompt_ids) + len(s.output_ids) - 1 for s in seqs],
              "limits": dataclasses.asdict(limits), "held_out": summarise(results, limits),
              "calibration": summarise(results, limits, "calibration"),
              "seconds": round(time.monotonic() - started, 1)}
    (out / "limits.json").write_text(json.dumps(report, indent=1) + "\n")
    console.print_json(json.dumps(report))


@moe_app.command("attack")
def attack(attack_name: str = typer.Argument(..., help="int8-expert, swapped-expert, cheap-router, forged-inputs, "
                                             "forged-consistent, or honest."),
           model: str = MODEL, expert: str = typer.Option("layer3.e1", help="Attacked expert."),
           prompt: str = typer.Option("What is the capital of France? Tell me a little about it."),
           response: str = typer.Option("The capital of France is Paris. It lies on the Seine in the north of "
                                        "the country.", help="Teacher-forced answer."),
           as_json: bool = typer.Option(False, "--json")) -> None:
    """Trace one teacher-forced sequence under an attack and print every duty's measurements and decision."""
    from node.moe.attacks import is_attack
    from node.moe.calibration import CaseResult, Duties, TokenSequence, decide_case, measure_trace, trace_case
    from node.moe.validate import MoeLimits, load_shared
    from node.protocol.moe import ExpertKey

    try:
        if attack_name != "honest" and not is_attack(attack_name):
            raise typer.BadParameter(f"unknown attack {attack_name!r}")
        key = ExpertKey.parse(expert)
        folder, engine, tokenizer = _load(model)
        ids = tuple(tokenizer.encode_chat([{"role": "user", "content": prompt}]))
        seq = TokenSequence(ids, (*tokenizer.encode_response(response), 2))
        trace = trace_case(engine.model, seq, attack_name, key, (key.expert + 1) % trace_experts(engine.model))
        experts, routers, link = measure_trace(Duties(folder, load_shared(folder)), seq, trace, [key], row_block=1)
    except VerinferError as e:
        console.print(f"[red]rejected input:[/red] {e}")
        raise typer.Exit(2) from None
    limits = _limits()
    result = CaseResult(0, "-", attack_name, str(key), experts[0], max(r.choice_mismatches for r in routers),
                        max(r.max_weight_error for r in routers), sum(r.input_hash_mismatches for r in routers), link)
    decisions = {k: v.name for k, v in decide_case(result, MoeLimits(**limits)).items()}
    data = {"attack": attack_name, "expert": dataclasses.asdict(experts[0]),
            "router_layer": dataclasses.asdict(routers[key.layer]), "link": dataclasses.asdict(link),
            "limits": limits, "decisions": decisions}
    if as_json:
        console.print_json(json.dumps(data))
    else:
        table = Table(show_header=False)
        for name, value in data.items():
            table.add_row(name, json.dumps(value))
        console.print(table)
    raise typer.Exit(1 if any(v != "OK" for v in decisions.values()) else 0)


def trace_experts(model: Any) -> int:
    """Return the number of experts per layer of a loaded Mixtral."""
    return int(model.config.num_local_experts)


def _limits() -> dict[str, Any]:
    path = REPO_ROOT_LIMITS
    if path.exists():
        limits: dict[str, Any] = json.loads(path.read_text())["limits"]
        return limits
    return {"expert_rel_error": 1e-4, "expert_index_mismatches": 0, "router_weight_error": 1e-4,
            "link_rel_error": 1e-4}


REPO_ROOT_LIMITS = Path(__file__).resolve().parents[1] / "docs" / "moe" / "limits.json"

"""The devnet's live view (rich), its verdict on the run, the spoofer-probability plot and the JSON record."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from node.devnet.network import HONEST_KINDS, OPERATOR_STAKE, NetworkState
from node.protocol.reputation import PRIOR

SLASH_THRESHOLD = 0.99  # HubConfig's default slash_threshold


def _eth(wei: int) -> str:
    return f"{wei / 1e18:.3f}"


def render_state(state: NetworkState, events: bool = True) -> Group:
    """Return the live view: operators, validators and (optionally) the latest events."""
    elapsed = time.monotonic() - state.started
    head = Text.assemble(("verinfer devnet", "bold"), f"  {state.phase}  ·  block {state.block}  ·  "
                         f"{elapsed:5.0f} s  ·  contract {state.contract or '-'}")
    ops = Table(title="operators (stake and earnings in ETH)", title_justify="left", expand=False)
    for column in ("operator", "really does", "asked", "valid", "invalid", "open", "P(spoofer)", "stake",
                   "earned", "status"):
        text = column in ("operator", "really does", "status")
        ops.add_column(column, justify="left" if text else "right", no_wrap=True)
    for o in state.operators:
        requests = sum(1 for r in state.inferences if r.operator == o.kind)
        pending = sum(1 for r in state.inferences if r.operator == o.kind and r.pending)
        standing = "[red]jailed[/red]" if o.jailed else ("[yellow]suspect[/yellow]" if o.spoof_p >= 0.5
                                                         else "[green]good[/green]")
        ops.add_row(o.kind, state.kinds[o.kind], str(requests), str(state.count(o.kind, "VALID")),
                    str(state.count(o.kind, "INVALID") + state.count(o.kind, "FRAUD")), str(pending),
                    f"{o.spoof_p:.3g}", _eth(o.stake), _eth(o.credits), standing)
    vals = Table(title="validators", title_justify="left", expand=False)
    for column in ("validator", "address", "votes", "stake", "earned", "health"):  # amounts in ETH
        vals.add_column(column, justify="right" if column in ("votes", "stake", "earned") else "left", no_wrap=True)
    for v in state.validators:
        vals.add_row(f"validator-{v.index}", v.address, str(v.votes), _eth(v.stake), _eth(v.credits),
                     "[green]ok[/green]" if v.healthy else "[yellow]-[/yellow]")
    if not events:
        return Group(head, ops, vals)
    return Group(head, ops, vals, Text("\n".join(state.events[-8:]) or "(no events yet)", style="dim"))


def judge_outcome(state: NetworkState) -> list[str]:
    """Return what went wrong: the honest operator not in good standing or a cheater not slashed (empty: ok)."""
    problems = []
    for kind in (k for k in HONEST_KINDS if k in state.kinds):  # the honest one, and the one restarted mid-run
        honest = state.operator(kind)
        wrong = [r.inference_id for r in state.inferences if r.operator == kind and r.error is None
                 and r.status != "VALID"]
        if wrong:
            problems.append(f"{kind} inferences not judged valid: {wrong}")
        if not any(r.operator == kind and r.status == "VALID" for r in state.inferences):
            problems.append(f"no {kind} inference was judged")
        if honest.jailed or honest.spoof_p >= PRIOR or honest.stake != OPERATOR_STAKE:
            problems.append(f"{kind} operator not in good standing (P {honest.spoof_p:.3g}, jailed {honest.jailed})")
    for o in state.operators:
        if o.kind not in HONEST_KINDS and not (o.jailed and o.stake < OPERATOR_STAKE):
            problems.append(f"{o.kind} was not slashed and jailed (P {o.spoof_p:.3g}, stake {_eth(o.stake)})")
    return problems


def plot_spoofer_probability(state: NetworkState, path: Path) -> Path:
    """Write a PNG of each operator's spoofer probability over the run (log scale, slash threshold marked)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)
    times = [t for t, _ in state.timeline]
    for kind in state.kinds:
        line = ax.step(times, [max(p[kind], 1e-7) for _, p in state.timeline], where="post", label=kind,
                       linewidth=2)[0]
        jailed = next((t for t, p in state.timeline if p[kind] >= SLASH_THRESHOLD), None)
        if jailed is not None and state.operator(kind).jailed:
            ax.plot([jailed], [SLASH_THRESHOLD], marker="X", markersize=10, color=line.get_color())
    ax.axhline(SLASH_THRESHOLD, color="black", linestyle="--", linewidth=1, label="slash threshold (X: slashed)")
    ax.axhline(PRIOR, color="grey", linestyle=":", linewidth=1, label="prior")
    ax.set_yscale("log")
    ax.set_ylim(5e-7, 2)
    ax.set_xlabel("seconds since the first request")
    ax.set_ylabel("P(spoofer) on chain")
    ax.set_title("verinfer devnet: Bayesian spoofer probability per operator")
    ax.legend(loc="center right", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def summarise_run(state: NetworkState, problems: list[str]) -> dict[str, Any]:
    """Return the run's numbers as plain data for the JSON record."""
    answered = [r for r in state.inferences if r.answered_at is not None]
    latency = [r.settled_at - r.answered_at for r in answered if r.settled_at is not None and r.answered_at]
    answer = [r.answered_at - r.requested_at for r in answered if r.answered_at]
    return {
        "ok": not problems, "problems": problems,
        "options": json.loads(state.options.model_dump_json()),
        "chain": {"rpc_url": state.rpc_url, "contract": state.contract, "last_block": state.block},
        "durations_s": {k: round(v, 3) for k, v in state.durations.items()},
        "model_rates": state.model_rates,
        "latency_s": {
            "request_to_answer_mean": round(statistics.fmean(answer), 3) if answer else None,
            "answer_to_verdict_mean": round(statistics.fmean(latency), 3) if latency else None,
            "answer_to_verdict_max": round(max(latency), 3) if latency else None,
        },
        "operators": [{"kind": o.kind, "behaviour": state.kinds[o.kind], "address": o.address,
                       "requests": sum(1 for r in state.inferences if r.operator == o.kind),
                       "valid": state.count(o.kind, "VALID"), "invalid": state.count(o.kind, "INVALID"),
                       "fraud": state.count(o.kind, "FRAUD"),
                       "unanswered": sum(1 for r in state.inferences if r.operator == o.kind and r.error),
                       "spoof_p": o.spoof_p, "stake_wei": str(o.stake), "earned_wei": str(o.credits),
                       "jailed": o.jailed} for o in state.operators],
        "validators": [{"index": v.index, "address": v.address, "votes": v.votes, "stake_wei": str(v.stake),
                        "earned_wei": str(v.credits)} for v in state.validators],
        "inferences": [{"id": r.inference_id, "operator": r.operator, "round": r.round, "status": r.status,
                        "temperature": r.temperature, "top_p": r.top_p, "prompt": r.prompt, "text": r.text,
                        "error": r.error} for r in state.inferences],
        "timeline": [{"t": round(t, 2), **p} for t, p in state.timeline],
    }


def write_run_record(state: NetworkState, problems: list[str], path: Path) -> Path:
    """Write the run's numbers as JSON."""
    path.write_text(json.dumps(summarise_run(state, problems), indent=2) + "\n")
    return path

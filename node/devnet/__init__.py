"""`verinfer devnet`: the whole network on one machine, watched live, judged and recorded at the end."""

from __future__ import annotations

import asyncio
import signal

from rich.console import Console
from rich.live import Live

from node.devnet.network import Devnet, DevnetOptions, NetworkState, prepare_out_dir
from node.devnet.report import judge_outcome, plot_spoofer_probability, render_state, write_run_record
from node.logs import configure_logging

__all__ = ["DevnetOptions", "run_devnet"]


async def _echo_events(state: NetworkState, console: Console) -> None:
    """Print new events as lines (for logs and CI, where the live view shows only its last frame)."""
    shown = 0
    while True:
        for line in state.events[shown:]:
            console.print(line, highlight=False)
        shown = len(state.events)
        await asyncio.sleep(0.5)


async def _run(devnet: Devnet, console: Console) -> None:
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    assert main is not None
    for sig in (signal.SIGINT, signal.SIGTERM):  # also where SIGINT was inherited as ignored (a background job)
        loop.add_signal_handler(sig, main.cancel)
    echo = None if console.is_terminal else asyncio.create_task(_echo_events(devnet.state, console))
    try:
        await devnet.run()
    finally:
        if echo is not None:
            echo.cancel()


def run_devnet(options: DevnetOptions, console: Console) -> int:
    """Run the devnet; return the exit code (0: cheaters slashed and the honest operator in good standing)."""
    out = options.out
    prepare_out_dir(out)
    configure_logging(path=out / "devnet.log")
    state = NetworkState(options)
    devnet = Devnet(options, state)
    console.print(f"verinfer devnet: {options.model}, {len(state.kinds)} operators, {options.validators} "
                  f"validators, {options.rounds} rounds of {options.tokens} tokens; logs and results in {out}/")
    try:
        with Live(get_renderable=lambda: render_state(state, events=console.is_terminal), console=console,
                  refresh_per_second=2):
            asyncio.run(_run(devnet, console))
        console.print()
    except (KeyboardInterrupt, asyncio.CancelledError):
        console.print("[yellow]interrupted: every process the devnet started has been stopped[/yellow]")
        return 130
    except Exception as exc:  # a failed start or a dead validator: say what, after everything was stopped
        console.print(f"[red]devnet failed: {type(exc).__name__}: {exc}[/red]")
        write_run_record(state, [f"{type(exc).__name__}: {exc}"], out / "devnet.json")
        return 1
    problems = judge_outcome(state)
    plot = plot_spoofer_probability(state, out / "spoofer_probability.png")
    record = write_run_record(state, problems, out / "devnet.json")
    d = state.durations
    console.print(f"{len(state.inferences)} inferences; start-up {d.get('startup_s', 0):.0f} s, traffic "
                  f"{d.get('traffic_s', 0):.0f} s, total {d.get('total_s', 0):.0f} s")
    console.print(f"plot: {plot}\nnumbers: {record}")
    if problems:
        for p in problems:
            console.print(f"[red]✗ {p}[/red]")
        return 1
    console.print("[green]✓ every cheater was slashed and jailed; the honest operator is in good standing and paid"
                  "[/green]")
    return 0

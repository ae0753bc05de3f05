"""The `verinfer` command line."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.table import Table

from node.selfcheck import run_protocol_selfcheck

app = typer.Typer(help="verinfer: verify that an operator ran the model, precision and sampling it claims.",
                  no_args_is_help=True)
protocol_app = typer.Typer(help="Protocol v1 tools (no model, chain or network).", no_args_is_help=True)
app.add_typer(protocol_app, name="protocol")
console = Console()
if not console.is_terminal:  # logs and CI: do not wrap hashes and table rows at 80 columns
    console = Console(width=120)


@protocol_app.command("demo")
def protocol_demo(
    user_seed: int = typer.Option(42, help="The requester's seed (uint64)."),
    inference_id: int = typer.Option(7, help="The on-chain inference id (uint256)."),
    tokens: int = typer.Option(64, min=2, max=4096, help="Generated positions to sample."),
    vocab: int = typer.Option(49_152, min=8, max=2**20, help="Synthetic vocabulary size."),
) -> None:
    """Sample from synthetic logits, build the artifact, and run stage 1 on it and on forged copies."""
    report = run_protocol_selfcheck(user_seed, inference_id, tokens, vocab)
    console.print(f"run_seed       0x{report.run_seed.hex()}")
    console.print(f"artifact root  0x{report.artifact_root.hex()}")
    console.print(f"positions      {report.output_length}   wire size {report.wire_bytes} bytes (zstd)")
    table = Table(title="stage 1 (sequence check)")
    for column in ("artifact", "expected", "stage 1 says", "position", ""):
        table.add_column(column)
    for case in report.cases:
        position = "-" if case.result.position is None else str(case.result.position)
        mark = "[green]ok[/green]" if case.ok else "[red]WRONG[/red]"
        table.add_row(case.name, case.expected.name, case.result.reason.name, position, mark)
    console.print(table)
    if not report.ok:
        console.print("[red]self-check FAILED[/red]")
        raise typer.Exit(1)
    console.print("[green]self-check passed: the honest artifact verifies and every forgery is rejected[/green]")


if __name__ == "__main__":
    app()

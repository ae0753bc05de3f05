"""The `verinfer` command line."""

from __future__ import annotations

import logging
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from node.selfcheck import run_protocol_selfcheck

app = typer.Typer(help="verinfer: verify that an operator ran the model, precision and sampling it claims.",
                  no_args_is_help=True)
protocol_app = typer.Typer(help="Protocol v1 tools (no model, chain or network).", no_args_is_help=True)
app.add_typer(protocol_app, name="protocol")
executer_app = typer.Typer(help="Executer mode: serve a model with verifiable artifacts.", no_args_is_help=True)
app.add_typer(executer_app, name="executer")
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


@executer_app.command("serve")
def executer_serve(
    model: str = typer.Option("smollm2-135m-instruct", help="Registered model name (config/models.toml)."),
    host: str = typer.Option("127.0.0.1", help="Address to listen on."),
    port: int = typer.Option(8000, help="Port to listen on."),
    backend: str = typer.Option("transformers", help="Engine backend: transformers or vllm."),
    device: str = typer.Option("cpu", help="Torch device for the transformers backend (cpu, cuda)."),
    dtype: str = typer.Option("float32", help="Execution dtype: float32 or bfloat16."),
    threads: int = typer.Option(0, help="CPU threads for torch (0: torch's default)."),
    cache_dir: Path = typer.Option(None, help="Model cache folder (default $VERINFER_CACHE or ~/.cache/verinfer)."),
) -> None:
    """Serve the OpenAI-compatible API; every response carries fingerprints and the artifact root."""
    from aiohttp import web

    from node.executer.bootstrap import ExecuterSettings, load_executer
    from node.executer.server import create_app

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if backend not in ("transformers", "vllm"):
        raise typer.BadParameter("backend must be transformers or vllm")
    settings = ExecuterSettings(model, backend, device, dtype, threads or None, True, cache_dir)  # type: ignore[arg-type]
    service, profile_path, profile = load_executer(settings)
    console.print(f"serving {model} ({backend}, {dtype}, {device}) on http://{host}:{port}/v1 "
                  f"model id 0x{service.files.model_id.hex()}")
    web.run_app(create_app(service, str(profile_path), profile.meta.calibrated), host=host, port=port,
                print=None)


if __name__ == "__main__":
    app()

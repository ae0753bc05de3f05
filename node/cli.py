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
from node.cli_chain import chain_app, models_app, stake_app  # noqa: E402 - sub-apps after the root app
from node.cli_moe import moe_app  # noqa: E402
from node.cli_node import keys_app, validator_app  # noqa: E402
from node.cli_spotcheck import spotcheck_app  # noqa: E402
from node.cli_training import training_app  # noqa: E402
from node.cli_workload import workload_app  # noqa: E402

app.add_typer(validator_app, name="validator")
app.add_typer(keys_app, name="keys")
app.add_typer(chain_app, name="chain")
app.add_typer(stake_app, name="stake")
app.add_typer(models_app, name="models")
app.add_typer(workload_app, name="workload")
app.add_typer(training_app, name="training")
app.add_typer(spotcheck_app, name="spotcheck")
app.add_typer(moe_app, name="moe")
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


calibrate_app = typer.Typer(help="Calibration: measured honest and attack runs -> profile and report.",
                            no_args_is_help=True)
app.add_typer(calibrate_app, name="calibrate")


@calibrate_app.command("run")
def calibrate_run(
    model: str = typer.Option("smollm2-135m-instruct", help="The claimed model to calibrate."),
    dtype: str = typer.Option("float32", help="The claimed precision: float32 or bfloat16 (the validator: fp32)."),
    out: Path = typer.Option(None, help="Run folder, resumable (default docs/calibration/<model>.<dtype>)."),
    honest: int = typer.Option(300, help="Honest run specs (batch4 specs yield four runs each)."),
    per_attack: int = typer.Option(16, help="Runs per attack."),
    tokens: int = typer.Option(64, help="Generated tokens per run (prefixes 16/32/64/128 are measured)."),
    other_model: bool = typer.Option(True, "--other-model/--no-other-model", "--gemma/--no-gemma",
                                     help="Include the attacks with the registry's other real model "
                                     "(for SmolLM2: Gemma-3-270M, slow: 262k vocabulary)."),
    variants: str = typer.Option("", help="Comma-separated honest variants to run (default: all available)."),
    runs_file: str = typer.Option("runs.jsonl", help="Records file inside OUT (one per process)."),
    start: int = typer.Option(0, min=0, help="First run index (another campaign: other prompts, params, seeds)."),
    only: str = typer.Option("", "--attacks", help="Comma-separated attacks to run (default: all for the dtype)."),
) -> None:
    """Generate honest and attack runs and record every signal (appends to OUT/runs.jsonl; resumes)."""
    from rich.progress import Progress

    from node.calibrate.lab import build_lab
    from node.calibrate.runs import attacks_for, plan_runs, run_calibration

    if dtype not in ("float32", "bfloat16"):
        raise typer.BadParameter("dtype must be float32 or bfloat16")
    out = out or Path("docs/calibration") / f"{model}.{dtype}"
    logging.basicConfig(level=logging.WARNING)
    lab, available = build_lab(model, tokens, with_other=other_model and per_attack > 0, dtype=dtype)
    chosen = tuple(v for v in variants.split(",") if v) or available
    if not set(chosen) <= set(available):
        raise typer.BadParameter(f"variants {chosen} not all available here: {available}")
    attacks = attacks_for(dtype, lab.other, "other-model-tiny" in lab.generators)
    if only:
        wanted = tuple(a for a in only.split(",") if a)
        if not set(wanted) <= set(attacks):
            raise typer.BadParameter(f"unknown attacks for {dtype}: {sorted(set(wanted) - set(attacks))}")
        attacks = wanted
    specs = list(plan_runs(honest, per_attack, chosen, attacks, start))
    console.print(f"{len(specs)} run specs; claimed {dtype}; honest variants {chosen}; attacks {len(attacks)}")
    with Progress(console=console) as progress:
        task = progress.add_task("calibrating", total=None)
        ran = run_calibration(lab, out / runs_file, specs,
                              lambda n, total: progress.update(task, completed=n, total=total))
    console.print(f"ran {ran} specs into {out / runs_file}")


@calibrate_app.command("sweep")
def calibrate_sweep(
    model: str = typer.Option("smollm2-135m-instruct", help="The claimed model."),
    dtype: str = typer.Option("float32", help="The claimed precision: float32 or bfloat16."),
    out: Path = typer.Option(None, help="Run folder (default docs/calibration/<model>.<dtype>)."),
    runs: int = typer.Option(10, help="Runs per sweep variant."),
    tokens: int = typer.Option(64, help="Generated tokens per run."),
) -> None:
    """Run the sensitivity sweep (smaller lies) into OUT/runs-sweep.jsonl; `calibrate fit` reports it."""
    from rich.progress import Progress

    from node.calibrate.lab import build_lab
    from node.calibrate.sweep import run_sweep

    logging.basicConfig(level=logging.WARNING)
    out = out or Path("docs/calibration") / f"{model}.{dtype}"
    lab, _ = build_lab(model, tokens, with_other=False, dtype=dtype)
    with Progress(console=console) as progress:
        task = progress.add_task("sweep", total=None)
        ran = run_sweep(lab, out / "runs-sweep.jsonl", runs,
                        lambda done, total: progress.update(task, completed=done, total=total))
    console.print(f"ran {ran} sweep runs into {out / 'runs-sweep.jsonl'}")


@calibrate_app.command("fit")
def calibrate_fit(
    model: str = typer.Option("smollm2-135m-instruct", help="The calibrated model."),
    dtype: str = typer.Option("float32", help="The calibrated dtype."),
    runs: Path = typer.Option(None, help="Folder of runs*.jsonl (default docs/calibration/<model>.<dtype>)."),
    report: Path = typer.Option(None, help="Report folder (default: the runs folder)."),
    write_profile: bool = typer.Option(True, help="Write config/profiles/<model>.<dtype>.toml."),
) -> None:
    """Choose thresholds on the calibration half, report rates on the held-out half, write the profile.

    fresh*.jsonl (honest runs recorded after the thresholds were fixed) are reported, never fitted;
    notes.md beside the runs (how the campaign ran, what it left out) becomes the report's campaign section.
    """
    from node.calibrate.report import render_profile, write_report
    from node.calibrate.runs import read_records
    from node.engines.models import REPO_ROOT

    runs = runs or Path("docs/calibration") / f"{model}.{dtype}"
    records = [r for path in sorted(runs.glob("runs*.jsonl")) if path.name != "runs-sweep.jsonl"
               for r in read_records(path)]
    fresh = [r for path in sorted(runs.glob("fresh*.jsonl")) for r in read_records(path)]
    folder = report or runs
    sweep = read_records(runs / "runs-sweep.jsonl")
    notes = (runs / "notes.md").read_text() if (runs / "notes.md").exists() else ""  # the campaign, in words
    thresholds, rates = write_report(records, folder, model, dtype, sweep, fresh, notes)
    console.print(f"report: {folder / 'report.md'} ({len(records)} records); alpha {rates['alpha']:.4f} "
                  f"(95 % upper {rates['alpha_upper']:.4f}) over {rates['honest_runs']} held-out honest runs")
    if write_profile:
        path = REPO_ROOT / "config" / "profiles" / f"{model}.{dtype}.toml"
        path.write_text(render_profile(model, dtype, thresholds, rates, f"{len(records)} runs in {runs}"))
        console.print(f"profile: {path}")


@app.command("devnet")
def devnet(
    model: str = typer.Option("smollm2-135m-instruct", help="Registered model (config/models.toml) the network "
                              "serves and checks; its profile must be calibrated."),
    rounds: int = typer.Option(6, min=1, max=100, help="Requests per operator (none once it is jailed)."),
    validators: int = typer.Option(3, min=1, max=8, help="Validator processes."),
    committee: int = typer.Option(2, min=1, max=8, help="Validators drawn per inference."),
    tokens: int = typer.Option(32, min=4, max=512, help="Generated tokens per request."),
    threads: int = typer.Option(1, min=1, help="torch threads per process."),
    out: Path = typer.Option(Path("devnet-out"), help="Logs, node state, devnet.json and the plot."),
) -> None:
    """A local network: anvil + contract, an honest and three cheating operators, validators, a requester."""
    from node.devnet import DevnetOptions, run_devnet
    from node.engines.models import get_model_spec

    if get_model_spec(model).source == "upcycled-moe":  # the MoE devnet: validators hold experts
        from node.devnet.moe import run_devnet_for_model

        raise typer.Exit(run_devnet_for_model(model, rounds, validators, tokens, threads, out, console))
    options = DevnetOptions(model=model, rounds=rounds, validators=validators, committee=min(committee, validators),
                            tokens=tokens, threads=threads, out=out)
    raise typer.Exit(run_devnet(options, console))


@app.command("verify")
def verify(
    payload: Path = typer.Option(..., help="Payload JSON (as served at /v1/payloads/{inference_id})."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Run stage 1, one prefill and stage 2 on a payload, and print the report (exit 1 if invalid)."""
    import json

    from node.engines.models import get_model_spec, materialise_model
    from node.engines.tokenizer import ModelTokenizer
    from node.engines.transformers_engine import TransformersEngine, load_projection_engine
    from node.executer.api import InferencePayload
    from node.profiles import load_profile
    from node.validator.verify import verify_payload

    try:
        data = InferencePayload.model_validate_json(payload.read_bytes())
    except (OSError, ValueError) as exc:
        console.print(f"[red]cannot read payload {payload}: {exc}[/red]")
        raise typer.Exit(2) from exc
    spec = get_model_spec(data.model)
    files = materialise_model(spec)
    _, profile = load_profile(spec)
    engine = TransformersEngine(files.path, spec.name)
    # kind-1 fingerprints are recomputed at the registered dtype, recording the projection's layers (protocol.md §12)
    projection_engine = load_projection_engine(files.path, spec)
    report = verify_payload(data, files, ModelTokenizer(files.path, spec.chat), engine, profile.stage2_thresholds(),
                            projection=profile.projection_thresholds(), projection_engine=projection_engine)
    scores = report.measurements.as_dict() if report.measurements else {}
    if as_json:
        console.print_json(json.dumps({"valid": report.valid, "reason": report.reason.name,
                                       "stage1_position": report.stage1.position if report.stage1 else None,
                                       "scores": scores}))
    else:
        table = Table(title=f"verification of inference {data.inference_id} on {data.model}")
        table.add_column("signal")
        table.add_column("value", justify="right")
        table.add_row("stage 1", report.stage1.reason.name if report.stage1 else "-")
        for key, value in scores.items():
            table.add_row(key, f"{value:.6g}" if isinstance(value, float) else str(value))
        console.print(table)
        colour = "green" if report.valid else "red"
        console.print(f"[{colour}]{'VALID' if report.valid else 'INVALID'}: {report.reason.name}[/{colour}]")
    raise typer.Exit(0 if report.valid else 1)


@executer_app.command("serve")
def executer_serve(
    model: str = typer.Option("smollm2-135m-instruct", help="Registered model name (config/models.toml)."),
    host: str = typer.Option("127.0.0.1", help="Address to listen on."),
    port: int = typer.Option(8000, help="Port to listen on."),
    backend: str = typer.Option("transformers", help="Engine backend: transformers or vllm."),
    device: str = typer.Option("cpu", help="Torch device for the transformers backend (cpu, cuda)."),
    dtype: str = typer.Option("", help="Execution dtype (default: the model's registered one; another is refused)."),
    threads: int = typer.Option(0, help="CPU threads for torch (0: torch's default)."),
    cache_dir: Path = typer.Option(None, help="Model cache folder (default $VERINFER_CACHE or ~/.cache/verinfer)."),
    api_config: Path = typer.Option(None, help="API access TOML: keys, max_queue, max_concurrent_per_client, "
                                    "queue_timeout (see config/executer-api.example.toml; $VERINFER_API_* win)."),
    workload_record: Path = typer.Option(None, help="Record every served inference in this workload record "
                                         "(node/workload; off by default)."),
) -> None:
    """Serve the OpenAI-compatible API; every response carries fingerprints and the artifact root."""
    from aiohttp import web

    from node.executer.bootstrap import ExecuterSettings, load_executer
    from node.executer.server import create_app, load_api_settings

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if backend not in ("transformers", "vllm"):
        raise typer.BadParameter("backend must be transformers or vllm")
    settings = ExecuterSettings(model, backend, device, dtype or None, threads or None, True,  # type: ignore[arg-type]
                                cache_dir, workload_record)
    api_settings = load_api_settings(api_config)
    service, profile_path, profile = load_executer(settings)
    console.print(f"serving {model} ({backend}, {service.info.dtype}, {device}) on http://{host}:{port}/v1 "
                  f"model id 0x{service.files.model_id.hex()}")
    recorder = getattr(service.recorder, "record", None)  # serve the record read-only beside the API (keys needed)
    calibrated = profile is not None and profile.meta.calibrated
    web.run_app(create_app(service, str(profile_path), calibrated, api_settings, recorder), host=host, port=port,
                print=None)
    close = getattr(service.recorder, "close", None)  # write what is queued; an export in progress resumes next start
    if close is not None:
        close(finish_exports=False)


@executer_app.command("run")
def executer_run_command(
    model: str = typer.Option("smollm2-135m-instruct", help="Registered model name."),
    rpc: str = typer.Option("http://127.0.0.1:8545", envvar="VERINFER_RPC", help="JSON-RPC endpoint."),
    contract: str = typer.Option(..., envvar="VERINFER_CONTRACT", help="Verinfer contract address."),
    keystore: Path = typer.Option(..., help="The operator's keystore v3 file."),
    password_file: Path = typer.Option(None, help="Password file (default: $VERINFER_KEYSTORE_PASSWORD)."),
    host: str = typer.Option("127.0.0.1", help="Address to listen on."),
    port: int = typer.Option(8000, help="Port to listen on."),
    data_dir: Path = typer.Option(Path("data/executer"), help="LevelDB folder (transaction journal)."),
    p2p_listen: str = typer.Option("/ip4/0.0.0.0/tcp/4001", help="libp2p listen address for payloads ('' = off)."),
    api_config: Path = typer.Option(None, help="API access TOML: keys, max_queue, max_concurrent_per_client, "
                                    "queue_timeout (see config/executer-api.example.toml; $VERINFER_API_* win)."),
) -> None:
    """Serve on a chain: only inferences requested from this operator, each committed before answering."""
    from node.cli_node import executer_run

    executer_run(model, rpc, contract, keystore, password_file, host, port, data_dir, p2p_listen or None,
                 api_config)


if __name__ == "__main__":
    app()

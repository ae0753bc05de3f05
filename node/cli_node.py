"""`verinfer validator run`, `verinfer executer run` (on a chain) and `verinfer keys new|import`."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console

from node.errors import VerinferError
from node.logs import configure_logging

if TYPE_CHECKING:  # the CLI imports its heavy parts inside each command
    from eth_account.signers.local import LocalAccount

    from chain.contracts import Hub
    from node.store.leveldb import Store
    from node.validator.config import ValidatorConfig
    from node.validator.daemon import ValidatorNode
    from node.validator.moe import MoeDutyService

console = Console(soft_wrap=True)
validator_app = typer.Typer(help="Validator mode: watch the chain, verify, sign, submit.", no_args_is_help=True)
keys_app = typer.Typer(help="Encrypted keystores (Ethereum keystore v3).", no_args_is_help=True)


@keys_app.command("new")
def keys_new(out: Path = typer.Option(..., help="Keystore file to create."),
             password_file: Path = typer.Option(None, help="File whose first line is the password "
                                                "(default: $VERINFER_KEYSTORE_PASSWORD).")) -> None:
    """Create a new key in an encrypted keystore file and print its address."""
    from node.keys import create_keystore, read_password

    console.print(create_keystore(out, read_password(password_file)))


@keys_app.command("import")
def keys_import(out: Path = typer.Option(..., help="Keystore file to create."),
                key_env: str = typer.Option("VERINFER_PRIVATE_KEY", help="Environment variable with the hex key."),
                password_file: Path = typer.Option(None, help="Password file (default: $VERINFER_KEYSTORE_PASSWORD).")
                ) -> None:
    """Encrypt an existing private key (from an environment variable, never an argument) into a keystore."""
    import os

    from node.keys import read_password, write_keystore

    key = os.environ.get(key_env, "")
    if not key:
        raise typer.BadParameter(f"set {key_env}")
    console.print(write_keystore(out, bytes.fromhex(key.removeprefix("0x")), read_password(password_file)))


def _run_until_signal(main: object) -> None:
    async def runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await main(stop)  # type: ignore[operator]

    try:
        asyncio.run(runner())
    except VerinferError as exc:
        console.print(f"[red]{type(exc).__name__} ({exc.reason.name}): {exc}[/red]")
        raise typer.Exit(2) from exc


@validator_app.command("run")
def validator_run(config: Path = typer.Option(..., help="Validator TOML (see config/validator.example.toml).")) -> None:
    """Run the validator daemon until SIGINT/SIGTERM."""
    from web3 import Web3

    from chain.contracts import Hub
    from node.engines.models import get_model_spec, materialise_model
    from node.engines.tokenizer import ModelTokenizer
    from node.engines.transformers_engine import TransformersEngine, TransformersOptions, load_projection_engine
    from node.keys import read_password, unlock_keystore
    from node.profiles import load_profile
    from node.store.leveldb import Store
    from node.validator.config import load_config
    from node.validator.daemon import ModelSlot, ValidatorNode

    configure_logging()
    cfg = load_config(config)
    account = unlock_keystore(cfg.keystore, read_password(cfg.password_file))
    stack = contextlib.ExitStack()  # what the slots hold open (the IREE cache records) until the node stops
    slots = {}
    for name in cfg.models:
        spec = get_model_spec(name)
        files = materialise_model(spec)
        _, profile = load_profile(spec)
        if spec.sampler != "canonical":  # a stock-sampler model: no leaves, no fingerprint, Token-DiFR (§13)
            slots[files.model_id] = ModelSlot(files, ModelTokenizer(files.path, spec.chat),
                                              TransformersEngine(files.path, name, TransformersOptions()), None,
                                              stock=profile.stock_thresholds())
            continue
        # kind-1 fingerprints are recomputed at the registered dtype, recording the projection's layers (§12)
        projection_engine = load_projection_engine(files.path, spec)
        engine: Any = TransformersEngine(files.path, name, TransformersOptions())
        if cfg.stage2_backend == "iree":  # stage 2's prefill on the validator's own verification graph (IREE)
            engine = open_iree_engine(engine, name, files.model_id, cfg.data_dir / "iree-cache", stack)
        slots[files.model_id] = ModelSlot(files, ModelTokenizer(files.path, spec.chat), engine,
                                          profile.stage2_thresholds(), projection=profile.projection_thresholds(),
                                          projection_engine=projection_engine)
    hub = Hub(Web3(Web3.HTTPProvider(cfg.rpc_url)), cfg.contract)

    async def main(stop: asyncio.Event) -> None:
        with Store(cfg.data_dir, cfg.chain_id, cfg.contract) as store:
            node = ValidatorNode(cfg, account, hub, store, slots)
            if cfg.moe is not None:
                node.moe = build_moe_service(cfg, account, hub, store, node)
            console.print(f"validator {account.address} on chain {cfg.chain_id}, contract {cfg.contract}; "
                          f"metrics http://{cfg.metrics_host}:{cfg.metrics_port}/metrics")
            await node.run(stop)

    with stack:
        _run_until_signal(main)


def open_iree_engine(engine: Any, name: str, model_id: bytes, cache_dir: Path, stack: contextlib.ExitStack) -> Any:
    """Return the engine with stage 2's prefill replayed by IREE on the validator's own verification graph (its
    exports and compiled modules cached in a workload record under cache_dir, held open by stack)."""
    from node.workload.iree_prefill import IreePrefillEngine
    from node.workload.store import WorkloadRecord

    record = stack.enter_context(WorkloadRecord.open(cache_dir / name))
    return IreePrefillEngine(engine, engine.model, name, model_id.hex(), engine.options.dtype, record)


def build_moe_service(cfg: ValidatorConfig, account: LocalAccount, hub: Hub, store: Store,
                      node: ValidatorNode) -> MoeDutyService:
    """Return the MoE duty service of a validator config's [moe] section (loads only the held duties' tensors)."""
    import json

    from chain.moe import ExpertDutyClient
    from node.engines.models import get_model_spec, materialise_model
    from node.moe.config import DutyValidator, MoeDutiesConfig
    from node.moe.validate import load_limits
    from node.validator.moe import MoeDutyService, compute_shape

    assert cfg.moe is not None
    files = materialise_model(get_model_spec(cfg.moe.model))  # the registry's entry: its hub id too
    folder = files.path
    checker = DutyValidator(folder, MoeDutiesConfig(experts=cfg.moe.experts), load_limits())
    shape = compute_shape(json.loads((folder / "config.json").read_text()))
    return MoeDutyService(cfg.moe, account, hub, ExpertDutyClient(hub.w3, cfg.moe.module), store, checker, shape,
                          cfg.executers, node.txm, confirmations=cfg.confirmations, poll_interval=cfg.poll_interval,
                          fetch_timeout=cfg.fetch_timeout, registry=node.metrics.registry,
                          recent_blocks_guard=cfg.recent_blocks_guard, model_id=files.model_id,
                          verdict_ttl=cfg.verdict_ttl)


def executer_run(model: str, rpc: str, contract: str, keystore: Path, password_file: Path | None, host: str,
                 port: int, data_dir: Path, p2p_listen: str | None = None, api_config: Path | None = None) -> None:
    """Serve the API on a chain: requests are checked against it, results committed to it."""
    from aiohttp import web
    from web3 import Web3

    from chain.contracts import Hub
    from chain.txmanager import TxManager
    from node.executer.bootstrap import ExecuterSettings, load_executer
    from node.executer.chain_mode import ChainGate, resume_commits
    from node.executer.server import create_app, load_api_settings
    from node.keys import read_password, unlock_keystore
    from node.store.leveldb import Store

    configure_logging()
    api_settings = load_api_settings(api_config)  # before unlocking keys and loading the model: fail fast
    account = unlock_keystore(keystore, read_password(password_file))
    w3 = Web3(Web3.HTTPProvider(rpc))
    hub = Hub(w3, contract)
    service, profile_path, profile = load_executer(ExecuterSettings(model))
    store = Store(data_dir, int(w3.eth.chain_id), contract)
    txm = TxManager(w3, account, store)
    service.store = store  # every payload on disk (synced) before its commit is sent; served from there after a restart
    if getattr(service, "moe", None) is not None:
        service.moe.slices.durable = store  # type: ignore[union-attr]
    resume_commits(txm, store)  # commits journaled before a restart go out again, only with their payload on disk
    service.gate = ChainGate(hub, txm, service.files.model_id)
    console.print(f"executer {account.address} serving {model} on http://{host}:{port}/v1 for contract {contract}")
    p2p = None
    if p2p_listen:  # validators fetch payloads over libp2p first (HTTP stays as the fallback)
        from node.p2p.host import P2PHost

        p2p = P2PHost(data_dir / "peer.key", service.payload_json, p2p_listen).start()
        console.print(f"libp2p payloads at {', '.join(p2p.addrs)} (peer {p2p.peer_id})")
    try:
        calibrated = profile is not None and profile.meta.calibrated
        web.run_app(create_app(service, str(profile_path), calibrated, api_settings), host=host, port=port,
                    print=None)
    finally:
        if p2p is not None:
            p2p.stop()
        store.close()

"""`verinfer devnet`: a whole network on one machine — anvil, the contract, operators, validators, a requester.

One honest operator, one honest operator whose executer is restarted mid-run (right after a commit,
before the validators fetched it: its payloads come back from its LevelDB), and cheaters (int8
weights; the prefill attack; a temperature lie; a truncator) serve the real model's OpenAI-compatible
API from this process, each with its own account, LevelDB (tx journal and served payloads), HTTP
server and libp2p host. Validators are real ``verinfer validator run`` processes with
encrypted keystores and TOML config files. A requester pays for a stream of varied prompts through
the OpenAI client; an observer reads the chain for the live view and the report. Every process
started here is stopped on exit, on error and on SIGINT/SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import tomli_w
from aiohttp import web
from eth_account.signers.local import LocalAccount
from pydantic import BaseModel, ConfigDict, Field
from web3 import Web3

from chain.contracts import Hub, HubConfig, ModelState, Params, Role, Status
from chain.deploy import deploy
from chain.devnet import Anvil, dev_account, find_free_port, stop_process_group
from chain.errors import ChainError
from chain.txmanager import TxManager
from node.engines.base import EngineInfo, Generation, GenerationRequest, Prefill
from node.errors import FatalError, VerinferError
from node.executer.service import ExecuterService
from node.executer.stock import StockService
from node.protocol.errors import Reason
from node.protocol.prompt import compute_prompt_hash, normalise_messages
from node.protocol.reputation import WAD
from node.protocol.sampler import SamplingParams

log = logging.getLogger(__name__)

OPERATOR_KINDS: dict[str, str] = {  # kind -> what it really does (short: it is a column of the live table)
    "honest": "fp32, as declared",
    "restarted": "honest, restarted mid-run",
    "int8": "int8, claims fp32",
    "prefill": "int8 text, real leaves",
    "temperature-lie": "samples at T + 0.3",
    "truncator": "stops after 4 tokens",
}
STOCK_OPERATOR_KINDS: dict[str, str] = {  # a stock-sampler model (docs/protocol.md §13.1): vLLM's seeded rule
    "honest": "vLLM's seeded rule",
    "restarted": "honest, restarted mid-run",
    "int8": "int8, claims fp32",
    "unseeded": "ignores the seed",
    "temperature-lie": "samples at T + 0.3",
    "truncator": "stops after 4 tokens",
}
SAMPLING = ((0.7, 1.0), (1.0, 0.9), (1.0, 1.0), (0.7, 0.9))  # (temperature, top_p) per round, in turn
OPERATOR_STAKE = 10 * 10**18
VALIDATOR_STAKE = 5 * 10**18
MIN_FEE_WEI = 10**15  # the registered minimum fee per request (the devnet pays fee_wei, by default 10x that)
ADMIN, REQUESTER, FIRST_OPERATOR, FIRST_VALIDATOR, TREASURY = 0, 1, 2, 8, 19
HONEST_KINDS = ("honest", "restarted")  # operators that must end in good standing, every answer judged valid
RESTART_ROUND = 1  # the restarted operator's executer goes down right after its answer (its commit) in this round
RESTART_DOWN_S = 4.0  # ... for this long: the validators ask for the payload meanwhile and get nothing
RESTARTED_ROUNDS = 3  # it serves the rounds before, of and after the restart only (the devnet's time stays the same)


class DevnetOptions(BaseModel):
    """What `verinfer devnet` runs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = "smollm2-135m-instruct"
    validators: int = Field(default=3, ge=1, le=8)
    committee: int = Field(default=3, ge=1, le=8, description="validators drawn per inference (protocol minimum 3)")
    rounds: int = Field(default=6, ge=1, le=100, description="requests per operator (skipped once it is jailed)")
    tokens: int = Field(default=32, ge=4, le=512)
    check_rate: float = Field(default=1.0, gt=0, le=1, description="the model's minimum check rate")
    block_time: float = Field(default=1.0, gt=0)
    threads: int = Field(default=1, ge=1, description="torch threads per process")
    timeout: float = Field(default=900.0, gt=0, description="seconds for the whole run after start-up")
    fee_wei: int = Field(default=10**16, ge=0)
    out: Path = Path("devnet-out")


@dataclass
class InferenceRecord:
    """One request of the stream and what became of it."""

    inference_id: int
    operator: str
    round: int
    prompt: str
    temperature: float
    top_p: float
    requested_at: float
    answered_at: float | None = None
    settled_at: float | None = None
    status: str = Status.REQUESTED.name
    error: str | None = None
    text: str = ""

    @property
    def pending(self) -> bool:
        """Check whether a verdict is still to come (answered and committed, not settled)."""
        return self.error is None and self.status in (Status.REQUESTED.name, Status.COMMITTED.name)


@dataclass
class OperatorView:
    """An operator as the chain sees it now."""

    kind: str
    address: str
    stake: int = OPERATOR_STAKE
    spoof_p: float = 0.01
    jailed: bool = False
    credits: int = 0
    slashed: int = 0


@dataclass
class ValidatorView:
    """A validator as the chain and its /health endpoint see it now."""

    index: int
    address: str
    stake: int = VALIDATOR_STAKE
    credits: int = 0
    votes: int = 0
    healthy: bool = False


@dataclass
class NetworkState:
    """Everything the live view and the report show; written by the observer, read by the view."""

    options: DevnetOptions
    started: float = field(default_factory=time.monotonic)
    phase: str = "starting"
    block: int = 0
    contract: str = ""
    rpc_url: str = ""
    operators: list[OperatorView] = field(default_factory=list)
    validators: list[ValidatorView] = field(default_factory=list)
    inferences: list[InferenceRecord] = field(default_factory=list)
    timeline: list[tuple[float, dict[str, float]]] = field(default_factory=list)
    traffic_started: float | None = None
    durations: dict[str, float] = field(default_factory=dict)
    model_rates: dict[str, float] = field(default_factory=dict)  # α and β as registered on chain
    events: list[str] = field(default_factory=list)
    kinds: dict[str, str] = field(default_factory=dict)  # the operators: kind -> what it really does

    def __post_init__(self) -> None:
        if not self.kinds:
            self.kinds = get_operator_kinds(self.options.model)

    def count(self, kind: str, status: str) -> int:
        """Return how many of an operator's inferences are in a status."""
        return sum(1 for r in self.inferences if r.operator == kind and r.status == status and r.error is None)

    def operator(self, kind: str) -> OperatorView:
        """Return the operator of a kind."""
        return next(o for o in self.operators if o.kind == kind)


def get_operator_kinds(model: str) -> dict[str, str]:
    """Return the devnet's operators for a model: a stock-sampler model's cheat on vLLM's rule instead."""
    from node.engines.models import get_model_spec

    return dict(STOCK_OPERATOR_KINDS if get_model_spec(model).sampler != "canonical" else OPERATOR_KINDS)


class SerialEngine:
    """An engine whose calls hold one lock shared by every operator in this process (two cores, one model)."""

    def __init__(self, inner: Any, lock: threading.Lock) -> None:
        self.inner, self.lock = inner, lock
        self.info: EngineInfo = inner.info
        self.vocab_size: int = inner.vocab_size

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """Generate under the lock."""
        with self.lock:
            generations: list[Generation] = self.inner.generate(requests)
            return generations

    def prefill(self, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> Prefill:
        """Prefill under the lock."""
        with self.lock:
            prefill: Prefill = self.inner.prefill(prompt_ids, output_ids)
            return prefill


@dataclass
class ChildProcess:
    """A process started in its own session, stopped with its whole process group."""

    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str]
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start it with stdout and stderr to its log file."""
        with self.log_path.open("ab") as out:
            self.process = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            env=self.env, start_new_session=True)

    @property
    def alive(self) -> bool:
        """Check whether it is running."""
        return self.process is not None and self.process.poll() is None

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM the process group, SIGKILL it after the grace period."""
        p, self.process = self.process, None
        if p is not None:
            stop_process_group(p, grace)

    def tail(self, lines: int = 15) -> str:
        """Return the end of its log."""
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""


@dataclass
class Operator:
    """One in-process operator: account, service, HTTP and libp2p addresses."""

    kind: str
    account: LocalAccount
    http_port: int
    p2p_port: int
    key_path: Path
    peer_id: str
    service: ExecuterService | StockService | None = None
    build: Any = None  # (store) -> a fresh service for this operator: how the restarted one comes back

    def payload_json(self, inference_id: int) -> bytes | None:
        """Return a payload from the service the operator runs now (none while it restarts: nothing found)."""
        return None if self.service is None else self.service.payload_json(inference_id)

    @property
    def url(self) -> str:
        """Return the executer's HTTP base URL."""
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def multiaddr(self) -> str:
        """Return the libp2p address validators dial."""
        return f"/ip4/127.0.0.1/tcp/{self.p2p_port}/p2p/{self.peer_id}"


def write_validator_config(directory: Path, index: int, account: LocalAccount, rpc_url: str, contract: str,
                           start_block: int, model: str, executers: dict[str, str], peers: dict[str, str],
                           p2p_port: int, metrics_port: int) -> Path:
    """Write a validator's keystore, password file and TOML config; return the config path."""
    from node.keys import write_keystore

    directory.mkdir(parents=True, exist_ok=True)
    password = directory / "password"
    password.write_text(f"devnet-validator-{index}\n")
    password.chmod(0o600)
    keystore = directory / "keystore.json"
    write_keystore(keystore, bytes(account.key), password.read_text().strip())
    config = {
        "rpc_url": rpc_url, "chain_id": 31337, "contract": contract, "start_block": start_block,
        "data_dir": str(directory / "data"), "keystore": str(keystore), "password_file": str(password),
        "models": [model], "confirmations": 1, "poll_interval": 0.25, "submit_grace": 5.0,
        "metrics_host": "127.0.0.1", "metrics_port": metrics_port,
        "p2p_listen": f"/ip4/127.0.0.1/tcp/{p2p_port}", "p2p_key": str(directory / "peer.key"),
        "executers": executers, "peers": peers,
    }
    path = directory / "validator.toml"
    path.write_text(tomli_w.dumps(config))
    return path


class Devnet:
    """The network: started by run(), stopped by its finally block whatever happens."""

    def __init__(self, options: DevnetOptions, state: NetworkState) -> None:
        self.options = options
        self.state = state
        self.anvil: Anvil | None = None
        self.hub: Hub | None = None
        self.model_id = b""
        self.operators: list[Operator] = []
        self.validators: list[ChildProcess] = []
        self._hosts: list[Any] = []
        self._runners: list[web.AppRunner] = []
        self._stores: list[Any] = []
        self._http: dict[str, web.AppRunner] = {}
        self._stopping = False
        self.restarts = 0

    # -- start-up -------------------------------------------------------------------------------

    def start_chain(self) -> None:
        """Start anvil, deploy the contract, register the model (punitive) and bond every staker."""
        from node.profiles import model_registration

        opts, out = self.options, self.options.out
        self.anvil = Anvil(accounts=TREASURY + 1, block_time=opts.block_time, log_path=out / "anvil.log").start()
        w3 = self.anvil.web3()
        admin = dev_account(ADMIN)
        committee = min(opts.committee, opts.validators)
        hub, deployment = deploy(w3, admin, HubConfig(treasury=dev_account(TREASURY).address, commit_window=60,
                                                      committee_size=committee, min_committee=min(3, committee)))
        self.hub, self.start_block = hub, deployment.block
        registration = model_registration(opts.model)
        self.model_id = registration.model_id
        alpha, beta = registration.alpha, registration.beta
        registration.register(hub, admin, int(opts.check_rate * WAD), min(opts.fee_wei, MIN_FEE_WEI))
        hub.advance_model_to(admin, self.model_id, ModelState.PUNITIVE)
        self.state.contract, self.state.rpc_url = hub.address, self.anvil.url
        self.state.model_rates = {"alpha": alpha / WAD, "beta": beta / WAD}
        from node.p2p.host import compute_peer_id

        nodes = out / "nodes"
        for i, kind in enumerate(self.state.kinds):
            account = dev_account(FIRST_OPERATOR + i)
            hub.bond(account, Role.OPERATOR, OPERATOR_STAKE)
            key = nodes / f"operator-{kind}" / "peer.key"
            key.parent.mkdir(parents=True, exist_ok=True)
            self.operators.append(Operator(kind, account, find_free_port(), find_free_port(), key,
                                           compute_peer_id(key)))
            self.state.operators.append(OperatorView(kind, account.address))
        for i in range(opts.validators):
            account = dev_account(FIRST_VALIDATOR + i)
            hub.bond(account, Role.VALIDATOR, VALIDATOR_STAKE)
            self.state.validators.append(ValidatorView(i, account.address))
        self.state.block = int(w3.eth.block_number)
        log.info("devnet chain ready", extra={"rpc": self.anvil.url, "contract": hub.address})

    def start_validators(self) -> None:
        """Write each validator's keystore and config and start `verinfer validator run` for it."""
        assert self.anvil is not None and self.hub is not None
        from node.p2p.host import compute_peer_id

        opts, nodes = self.options, self.options.out / "nodes"
        ports = [(find_free_port(), find_free_port()) for _ in range(opts.validators)]
        peers: dict[str, str] = {o.account.address: o.multiaddr for o in self.operators}
        for i, (p2p_port, _) in enumerate(ports):
            key = nodes / f"validator-{i}" / "peer.key"
            key.parent.mkdir(parents=True, exist_ok=True)
            address = dev_account(FIRST_VALIDATOR + i).address
            peers[address] = f"/ip4/127.0.0.1/tcp/{p2p_port}/p2p/{compute_peer_id(key)}"
        executers: dict[str, str] = {o.account.address: o.url for o in self.operators}
        env = {**os.environ, "OMP_NUM_THREADS": str(opts.threads), "TOKENIZERS_PARALLELISM": "false"}
        env.pop("VERINFER_KEYSTORE_PASSWORD", None)
        for i, (p2p_port, metrics_port) in enumerate(ports):
            config = write_validator_config(nodes / f"validator-{i}", i, dev_account(FIRST_VALIDATOR + i),
                                            self.anvil.url, self.hub.address, self.start_block, opts.model,
                                            executers, peers, p2p_port, metrics_port)
            child = ChildProcess(f"validator-{i}", [sys.executable, "-m", "node.cli", "validator", "run", "--config",
                                                    str(config)], opts.out / f"validator-{i}.log", env)
            child.start()
            self.validators.append(child)
        self._metrics_ports = [m for _, m in ports]

    def load_operators(self) -> None:
        """Load the real model and build each operator's engine and service (slow: run in a thread)."""
        import warnings

        import torch
        from transformers.utils import logging as transformers_logging

        from node.calibrate.cheaters import PrefillAttackEngine, TemperatureLieEngine, TruncatingEngine
        from node.calibrate.models import make_int8_engine
        from node.engines.models import get_model_spec, materialise_model
        from node.engines.tokenizer import ModelTokenizer
        from node.engines.transformers_engine import TransformersEngine, TransformersOptions
        from node.executer.chain_mode import ChainGate
        from node.profiles import load_profile

        assert self.anvil is not None and self.hub is not None
        torch.set_num_threads(self.options.threads)
        transformers_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
        warnings.filterwarnings("ignore", message=".*quantize_per_tensor.*")  # torch's int8 deprecation notice
        spec = get_model_spec(self.options.model)
        files = materialise_model(spec)
        tokenizer = ModelTokenizer(files.path, spec.chat)
        _, profile = load_profile(spec)
        base = TransformersEngine(files.path, spec.name, TransformersOptions(threads=self.options.threads))
        int8 = make_int8_engine(base)
        lock = threading.Lock()
        if spec.sampler != "canonical":
            self._load_stock_operators(files, tokenizer, base, int8, lock)
            return
        engines: dict[str, Any] = {"honest": base, "int8": int8,
                                      "prefill": PrefillAttackEngine(cheap=int8, real=base),
                                      "temperature-lie": TemperatureLieEngine(base, delta=0.3),
                                      "truncator": TruncatingEngine(base, keep=4)}
        engines["restarted"] = base
        for op in self.operators:
            def build(store: Any, op: Operator = op) -> ExecuterService:
                w3 = Web3(Web3.HTTPProvider(self.anvil.url))  # type: ignore[union-attr]
                gate = ChainGate(Hub(w3, self.hub.address), TxManager(w3, op.account, store),  # type: ignore[union-attr]
                                 self.model_id)
                return ExecuterService(files, tokenizer, SerialEngine(engines[op.kind], lock),
                                       profile.fingerprint_thresholds(), gate=gate, store=store)
            op.build = build
            op.service = build(self.open_store(op))

    def _load_stock_operators(self, files: Any, tokenizer: Any, base: Any, int8: Any, lock: threading.Lock) -> None:
        """Build each operator of a stock-sampler model: a StockService whose tokens follow vLLM's seeded rule over
        an engine's logits, honestly or not (the cheats are in the generate functions, not in node.executer)."""
        from node.executer.chain_mode import ChainGate

        assert self.anvil is not None and self.hub is not None

        def rule(engine: Any, delta: float = 0.0, seed_xor: int = 0, keep: int | None = None) -> Any:
            def generate(ids: Any, params: SamplingParams, seed: int, stops: frozenset[int]) -> tuple[int, ...]:
                if delta:
                    params = SamplingParams(params.temperature + delta, params.top_p, params.top_k, params.max_tokens)
                with lock:
                    tokens: tuple[int, ...] = engine.generate_with_vllm_rule(ids, params, seed ^ seed_xor, stops)
                return tokens[:keep]
            return generate

        generators = {"honest": rule(base), "restarted": rule(base), "int8": rule(int8),
                      "unseeded": rule(base, seed_xor=0x5A5A5A), "temperature-lie": rule(base, delta=0.3),
                      "truncator": rule(base, keep=4)}
        for op in self.operators:
            def build(store: Any, op: Operator = op) -> StockService:
                w3 = Web3(Web3.HTTPProvider(self.anvil.url))  # type: ignore[union-attr]
                gate = ChainGate(Hub(w3, self.hub.address), TxManager(w3, op.account, store),  # type: ignore[union-attr]
                                 self.model_id)
                return StockService(files, tokenizer, generators[op.kind], base.info, gate=gate, store=store)
            op.build = build
            op.service = build(self.open_store(op))

    def open_store(self, op: Operator) -> Any:
        """Open an operator's LevelDB (its tx journal and served payloads)."""
        from node.store.leveldb import Store

        assert self.hub is not None
        store = Store(self.options.out / "nodes" / f"operator-{op.kind}" / "data", 31337, self.hub.address)
        self._stores.append(store)
        return store

    async def serve_operators(self) -> None:
        """Start each operator's HTTP API and libp2p host."""
        from node.p2p.host import P2PHost

        for op in self.operators:
            assert op.service is not None
            host = P2PHost(op.key_path, op.payload_json, f"/ip4/127.0.0.1/tcp/{op.p2p_port}")
            await asyncio.to_thread(host.start)
            self._hosts.append(host)
            await self.serve_http(op)

    async def serve_http(self, op: Operator) -> None:
        """Start an operator's HTTP API on its port."""
        from node.executer.server import create_app

        assert op.service is not None
        runner = web.AppRunner(create_app(op.service, "devnet", True), access_log=None)
        await runner.setup()
        self._runners.append(runner)
        self._http[op.kind] = runner
        await web.TCPSite(runner, "127.0.0.1", op.http_port).start()

    async def restart_operator(self, op: Operator) -> None:
        """Restart an operator's executer as a process restart would: its HTTP API down, its memory gone, its
        LevelDB closed; back after RESTART_DOWN_S on the same store, serving the payloads from disk."""
        runner, service = self._http.pop(op.kind), op.service
        op.service = None
        await runner.cleanup()
        self._runners.remove(runner)
        store: Any = service.store if service is not None else None
        if store is not None:
            store.close()
            self._stores.remove(store)
        self.note(f"{op.kind}: executer stopped (memory gone), back in {RESTART_DOWN_S:g} s")
        await asyncio.sleep(RESTART_DOWN_S)
        op.service = await asyncio.to_thread(op.build, self.open_store(op))
        await self.serve_http(op)
        self.restarts += 1
        self.note(f"{op.kind}: executer back, serving its payloads from its store")

    async def wait_validators_ready(self, timeout: float = 300.0) -> None:
        """Wait until every validator answers /health with 200; fail with its log if one exits."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
            while True:
                ready = 0
                for child, port, view in zip(self.validators, self._metrics_ports, self.state.validators, strict=True):
                    if not child.alive:
                        raise FatalError(f"{child.name} exited during start-up:\n{child.tail()}", Reason.OUT_OF_RANGE)
                    with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
                        async with session.get(f"http://127.0.0.1:{port}/health") as response:
                            view.healthy = response.status == 200
                    ready += view.healthy
                if ready == len(self.validators):
                    return
                if loop.time() > deadline:
                    raise FatalError(f"validators not ready after {timeout:.0f} s", Reason.OUT_OF_RANGE)
                await asyncio.sleep(0.5)

    # -- traffic ---------------------------------------------------------------------------------

    async def request_stream(self, prompts: list[str]) -> None:
        """Send `rounds` requests to every operator that is not jailed: pay on chain, then call its API."""
        from openai import AsyncOpenAI

        from node.engines.models import get_model_spec

        assert self.hub is not None
        chat = get_model_spec(self.options.model).chat
        hub, opts, requester = self.hub, self.options, dev_account(REQUESTER)
        clients = {op.kind: AsyncOpenAI(base_url=f"{op.url}/v1", api_key="devnet", max_retries=0, timeout=300)
                   for op in self.operators}
        n = 0
        for round_ in range(opts.rounds):
            chats: list[asyncio.Task[None]] = []
            temperature, top_p = SAMPLING[round_ % len(SAMPLING)]
            params = SamplingParams(temperature, top_p, 0, opts.tokens)
            for op in self.operators:
                if self.state.operator(op.kind).jailed or (op.kind == "restarted" and round_ >= RESTARTED_ROUNDS):
                    continue
                prompt = prompts[(7 * n + 3) % len(prompts)]
                n += 1
                # a chat model gets the prompt as a user message, a base model as completion text
                messages = normalise_messages([{"role": "user", "content": prompt}]) if chat else None
                seed = 1_000 * round_ + FIRST_OPERATOR + self.operators.index(op)
                try:
                    iid = await asyncio.to_thread(
                        hub.request_inference, requester, op.account.address, self.model_id,
                        compute_prompt_hash(self.model_id, messages=messages, prompt=None if chat else prompt), seed,
                        Params(params.temperature_bits, params.top_p_bits, 0, opts.tokens), opts.fee_wei)
                except ChainError as exc:  # e.g. jailed between the check and the request
                    self.note(f"request to {op.kind} refused by the contract: {exc}")
                    continue
                record = InferenceRecord(iid, op.kind, round_, prompt, temperature, top_p, time.monotonic())
                self.state.inferences.append(record)
                chats.append(asyncio.create_task(self._ask(clients[op.kind], record, messages, seed, op)))
            await asyncio.gather(*chats)  # a stream at the operators' pace: answers before the next round
        for client in clients.values():
            await client.close()

    async def _ask(self, client: Any, record: InferenceRecord, messages: list[dict[str, str]] | None,
                   seed: int, op: Operator) -> None:
        """Call the operator's chat API with the messages, or its completions API with the prompt if none."""
        common = {"model": self.options.model, "temperature": record.temperature, "top_p": record.top_p,
                  "max_tokens": self.options.tokens, "seed": seed, "extra_body": {"inference_id": record.inference_id}}
        try:
            if messages is not None:
                response = await client.chat.completions.create(messages=messages, **common)
                record.text = response.choices[0].message.content or ""
            else:
                completion = await client.completions.create(prompt=record.prompt, **common)
                record.text = completion.choices[0].text or ""
            record.answered_at = time.monotonic()
        except Exception as exc:  # the API answered with an error (e.g. the commit was refused): record it
            record.error = f"{type(exc).__name__}: {exc}"[:300]
            self.note(f"#{record.inference_id} {record.operator}: no answer ({record.error[:80]})")
            return
        if op.kind == "restarted" and record.round == RESTART_ROUND:  # committed, not fetched yet: down it goes
            await self.restart_operator(op)

    def note(self, line: str) -> None:
        """Add a line to the event feed."""
        stamp = time.monotonic() - (self.state.traffic_started or self.state.started)
        self.state.events.append(f"{stamp:6.1f}s  {line}")
        log.info(line)

    # -- observation -----------------------------------------------------------------------------

    def observe(self) -> None:
        """Read statuses, stakers, credits and new votes from the chain into the state (blocking)."""
        assert self.hub is not None
        hub, state = self.hub, self.state
        state.block = int(hub.w3.eth.block_number)
        now = time.monotonic()
        for r in state.inferences:
            if not r.pending:
                continue
            status = hub.get_inference(r.inference_id).status
            if status.name != r.status:
                r.status = status.name
                if status not in (Status.REQUESTED, Status.COMMITTED):
                    r.settled_at = now
                    p = hub.staker(state.operator(r.operator).address).spoof_p / WAD
                    self.note(f"#{r.inference_id} {r.operator}: {status.name.lower()} (P(spoofer) now {p:.3g})")
        for view in state.operators:
            s = hub.staker(view.address)
            if s.jailed and not view.jailed:
                self.note(f"{view.kind} slashed to {s.stake / 1e18:g} ETH and jailed")
            view.stake, view.spoof_p, view.jailed = s.stake, s.spoof_p / WAD, s.jailed
            view.credits = hub.credits(view.address)
        votes = hub.contract.events.VerdictRecorded().get_logs(from_block=self.start_block)
        for v in state.validators:
            v.stake = hub.staker(v.address).stake
            v.credits = hub.credits(v.address)
            v.votes = sum(1 for e in votes if e["args"]["validator"] == v.address)
        for v, child in zip(state.validators, self.validators, strict=False):
            v.healthy = v.healthy and child.alive
        if state.traffic_started is not None:
            state.timeline.append((now - state.traffic_started, {o.kind: o.spoof_p for o in state.operators}))

    async def watch(self, until: asyncio.Event) -> None:
        """Observe every half second until told to stop; a dead validator is fatal."""
        while not until.is_set():
            try:
                await asyncio.to_thread(self.observe)
            except (ChainError, VerinferError, OSError) as exc:
                log.warning("observer: %s", exc)
            for child in self.validators:
                if not child.alive and not self._stopping:
                    raise FatalError(f"{child.name} stopped:\n{child.tail()}", Reason.OUT_OF_RANGE)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(until.wait(), 0.5)

    async def settle(self, timeout: float) -> None:
        """Wait until no answered inference is waiting for a verdict."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while any(r.pending for r in self.state.inferences):
            if loop.time() > deadline:
                raise FatalError("inferences never settled: "
                                 f"{[r.inference_id for r in self.state.inferences if r.pending]}", Reason.OUT_OF_RANGE)
            await asyncio.sleep(0.5)

    # -- the whole run ---------------------------------------------------------------------------

    async def run(self) -> None:
        """Start everything, run the traffic, wait for the verdicts; always stop everything."""
        from node.calibrate.runs import load_prompts

        state, t0 = self.state, time.monotonic()
        stop_watch = asyncio.Event()
        watcher: asyncio.Task[None] | None = None
        try:
            state.phase = "deploying"
            await asyncio.to_thread(self.start_chain)
            state.phase = "starting validators, loading the model"
            self.start_validators()
            await asyncio.to_thread(self.load_operators)
            await self.serve_operators()
            await self.wait_validators_ready()
            state.durations["startup_s"] = time.monotonic() - t0
            state.phase = "requests streaming"
            state.traffic_started = time.monotonic()
            watcher = asyncio.create_task(self.watch(stop_watch))
            traffic = asyncio.create_task(self.request_stream(load_prompts()))
            await asyncio.wait_for(_first_failure(traffic, watcher), self.options.timeout)
            state.phase = "waiting for the last verdicts"
            await asyncio.wait_for(_first_failure(asyncio.create_task(self.settle(self.options.timeout)), watcher),
                                   self.options.timeout)
            await asyncio.to_thread(self.observe)
            state.durations["traffic_s"] = time.monotonic() - state.traffic_started
            state.phase = "done"
        finally:
            self._stopping = True
            stop_watch.set()
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(BaseException):
                    await watcher
            await self.stop()
            state.durations["total_s"] = time.monotonic() - t0

    async def stop(self) -> None:
        """Stop validators, servers, hosts, stores and anvil (idempotent, never raises)."""
        for child in self.validators:
            await asyncio.to_thread(child.stop)
        for runner in self._runners:
            with contextlib.suppress(Exception):
                await runner.cleanup()
        for host in self._hosts:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(host.stop)
        for store in self._stores:
            with contextlib.suppress(Exception):
                store.close()
        if self.anvil is not None:
            self.anvil.stop()
        self._runners, self._hosts, self._stores = [], [], []


async def _first_failure(main: asyncio.Task[None], watcher: asyncio.Task[None]) -> None:
    """Wait for main; if the watcher fails first, cancel main and raise the watcher's error."""
    done, _ = await asyncio.wait({main, watcher}, return_when=asyncio.FIRST_COMPLETED)
    if watcher in done and main not in done:
        main.cancel()
        watcher.result()
    await main


def prepare_out_dir(out: Path) -> None:
    """Empty the nodes' state of a previous run (a fresh chain refuses old LevelDB stores) and the logs."""
    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out / "nodes", ignore_errors=True)
    for stale in out.glob("*.log"):
        stale.unlink()

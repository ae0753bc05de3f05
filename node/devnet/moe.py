"""`verinfer devnet --model <moe>`: an MoE network on one machine, judged expert by expert on chain.

anvil, the hub and the ExpertDuty module (contracts/src/ExpertDuty.sol); validators that each preload expert
columns (expert e of every layer: with 4 experts and V validators, validator i holds columns i and i + 1 mod 4),
every router, and — every other validator — the shared layers for the link duty (an operational choice only: the
draw takes every validator, and a validator drawn for a duty it did not preload loads it); two operators running
the real executer (node.executer with its MoE recorder), one honest and one that runs one expert quantised to
int8, and — for a model with a dense stage-2 profile — a decode-only cheater (issue 30: its tokens and leaves come
from a cheaper decode, by default the dense parent model, and its executer traces the real MoE model afterwards,
so every duty passes). Per request the operator generates, records its MoE trace, binds moeRoot into the hub's
fingerprint hash and commits; the hub committee's validators open the commitment on the module from the
operator's opening, which fixes the lazy draws of three judges per duty from all validators, weighted by stake
settled before the commit; each drawn validator checks its duties (node.moe.config.DutyValidator) and signs an
expert verdict; a majority settles a duty. The module slashes no one: the hub committee's members re-judge a
failed duty themselves, and also check the served tokens as a dense model's (node.moe.dense: stage 1 and stage 2
on one prefill of the MoE model, the model's dense profile); they vote the inference invalid on a confirmed
failure or a failed dense check (the hub's quorum then refunds the requester and, by the model's Bayes rule,
slashes and jails the operator), or valid if the dense check and every duty passed, which pays the honest operator.

Each validator runs the daemon's MoE duty service (node.validator.moe.MoeDutyService: its own LevelDB store,
slashing protection and journaled transactions: it opens, judges and votes) and fetches each duty's slice from
its operator's executer API over HTTP on loopback. Simplifications, said so in docs/moe.md: one process (the
services share one asyncio loop in a thread, validators holding the same tensor share one read-only copy, and the
hub committee's dense checks share the operators' loaded model under one lock with the operators' serving).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Coroutine
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field
from rich.console import Console

from chain.contracts import Commitment, Hub, HubConfig, ModelState, Params, Role
from chain.deploy import deploy
from chain.devnet import Anvil, dev_account
from chain.moe import PER_DUTY, WEIGHT_DELAY, DutyResult, ExpertDutyClient, deploy_expert_duty
from chain.txmanager import TxManager
from node.protocol.hashing import keccak256
from node.protocol.moe import (
    ROUTER,
    SHARED,
    ExpertKey,
    MoeReason,
    compute_duty_key,
    parse_duty_key,
)
from node.protocol.sampler import SamplingParams
from node.store.leveldb import Store
from node.validator.config import MoeServiceConfig
from node.validator.moe import MoeDutyService, compute_shape

log = logging.getLogger(__name__)

K = 5
FEE = 10**16
MIN_FEE = 10**15
ALPHA = 10**12  # the model's false-positive rate: one invalid hub verdict moves P from 1 % past the 99 % threshold
BETA = 10**16
PROMPTS = ("What is the capital of France?", "Name three colours of the rainbow.",
           "Why is the sky blue? Answer in one sentence.", "Write a haiku about the sea.")


class MoeDevnetOptions(BaseModel):
    """What the MoE devnet runs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = "smollm2-moe-4x135m"
    validators: int = Field(5, ge=4, le=8)
    rounds: int = Field(2, ge=1, le=20)
    tokens: int = Field(16, ge=2, le=256)
    cheat_expert: str = "layer3.e1"
    decode_cheat: str = Field("moe-dense-parent", description="the decode-only cheater's decode (node.moe.attacks)")
    operators: tuple[str, ...] = ("honest", "int8-expert", "decode-only")
    per_duty: int = Field(PER_DUTY, ge=2, le=4)
    threads: int = Field(1, ge=1)
    judge_timeout: float = Field(600.0, gt=0, description="seconds the validators' services get per inference")
    out: Path = Path("devnet-out")


@dataclass
class MoeInferenceRecord:
    """One inference as the devnet saw it."""

    inference_id: int
    operator: str
    tokens: int
    duties: int = 0
    checks: int = 0
    undecided: int = 0  # drawn duties whose assigned holders split
    failed: dict[str, int] = field(default_factory=dict)  # duty → reason of a duty the chain settled failed
    slashed_wei: int = 0
    hub_status: str = ""
    assign_gas: int = 0
    verdict_gas: int = 0  # every submitExpertVerdicts transaction that counted a vote (the lazy draws are paid here)
    hub_votes: list[int] = field(default_factory=list)  # the distinct reasons of the committee's hub votes (0: valid)
    seconds: float = 0.0


@dataclass(frozen=True)
class Served:
    """What an operator's executer produced and committed for one request."""

    output_ids: tuple[int, ...]
    commitment: Commitment


def compute_holdings(index: int, layers: int, experts: int) -> tuple[ExpertKey, ...]:
    """Return validator `index`'s duties: experts index and index + 1 (mod E) of each layer, routers, link if even."""
    columns = {index % experts, (index + 1) % experts}
    keys = [ExpertKey(L, e) for L in range(layers) for e in sorted(columns)]
    keys += [ExpertKey(L, ROUTER) for L in range(layers)]
    if index % 2 == 0:
        keys.append(ExpertKey(0, SHARED))
    return tuple(keys)


class MoeOperator:
    """An operator running the real executer on the MoE model: honestly, with one expert quantised to int8, or
    (decode_only) with an executer whose engine decodes cheaply (node.moe.attacks.DecodeOnlyEngine)."""

    def __init__(self, name: str, account: Any, cheat: ExpertKey | None, lock: threading.Lock | None = None,
                 decode_only: bool = False) -> None:
        self.name = name
        self.account = account
        self.cheat = cheat
        self.decode_only = decode_only
        self.lock = lock or threading.Lock()  # the shared model: no dense check runs while an operator patches it
        self.service: Any = None  # its ExecuterService (node.executer): generation, artifact, per-expert commitment
        self.url = ""

    @property
    def cheating(self) -> bool:
        """Check whether this operator cheats (it must end slashed and jailed)."""
        return self.cheat is not None or self.decode_only

    def serve(self, inference_id: int, messages: list[dict[str, str]], prompt_ids: tuple[int, ...],
              prompt_hash: bytes, params: SamplingParams, user_seed: int) -> Served:
        """Generate and record through the executer (under the int8 expert if it cheats); return what it commits."""
        from contextlib import nullcontext

        from node.moe.attacks import int8_expert

        attack = nullcontext() if self.cheat is None else int8_expert(self.service.moe.model, self.cheat)
        with self.lock, attack:
            s = self.service.infer(prompt_ids, prompt_hash, params, user_seed, inference_id, {"messages": messages})
        return Served(tuple(s.generation.output_ids), Commitment(s.output_hash, s.artifact.root, s.fingerprint_hash))


class ServiceLoop:
    """One asyncio loop in a thread: the validators' duty services and the operators' HTTP servers."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.stop = asyncio.Event()
        self.thread = threading.Thread(target=self.loop.run_forever, name="moe-services", daemon=True)
        self.thread.start()
        self.tasks: list[Any] = []

    def call(self, coro: Coroutine[Any, Any, Any], timeout: float = 60.0) -> Any:
        """Run a coroutine on the loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Start a long-running coroutine on the loop (its exception surfaces in `failures`)."""
        self.tasks.append(asyncio.run_coroutine_threadsafe(coro, self.loop))

    def failures(self) -> list[str]:
        """Return the services that stopped with an error."""
        return [f"{type(e).__name__}: {e}" for t in self.tasks if t.done() and (e := t.exception()) is not None]

    def close(self) -> None:
        """Stop every service and the loop."""
        self.loop.call_soon_threadsafe(self.stop.set)
        for t in self.tasks:
            try:
                t.result(10)
            except Exception:  # reported by failures() before closing
                pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


async def serve_operator(op: MoeOperator) -> web.AppRunner:
    """Serve an operator's executer API (its MoE slices and openings among it) on a free loopback port; set its URL."""
    from node.executer.server import create_app

    runner = web.AppRunner(create_app(op.service, "none (no dense stage-2 profile)", False))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    op.url = f"http://127.0.0.1:{port}"
    return runner


class MoeDevnet:
    """The chain, the module, the operators and the validators of one MoE devnet run."""

    def __init__(self, options: MoeDevnetOptions, console: Console) -> None:
        self.options = options
        self.console = console
        self.records: list[MoeInferenceRecord] = []
        self.events: list[str] = []
        self.started = time.monotonic()
        self.engine: Any = None  # the operators' engine (both run the same weights; the cheater patches one expert)
        self.validator_keys: list[Any] = []
        self.services: list[MoeDutyService] = []  # one per validator
        self.stores: list[Store] = []
        self.lock = threading.Lock()  # the loaded model: an operator serving (maybe patching it) or a dense check
        self._parent: Any = None

    def dense_parent(self, files: Any) -> Any:
        """Return the engine of the MoE model's dense parent (loaded once), the decode-only cheater's cheap model."""
        from node.engines.models import get_model_spec, materialise_model
        from node.engines.transformers_engine import TransformersEngine

        if self._parent is None and self.options.decode_cheat == "moe-dense-parent":
            parent = get_model_spec(files.spec.tokenizer_from or "")
            self._parent = TransformersEngine(materialise_model(parent).path, parent.name)
        return self._parent

    def note(self, line: str) -> None:
        """Print and keep one event line."""
        text = f"{time.monotonic() - self.started:6.1f}s  {line}"
        self.events.append(text)
        self.console.print(text, highlight=False)

    def run(self) -> list[str]:
        """Run the network; return the problems found (none: the cheater slashed, the honest operator paid)."""
        import torch

        from node.engines.models import get_model_spec, materialise_model
        from node.engines.tokenizer import ModelTokenizer
        from node.engines.transformers_engine import TransformersEngine
        from node.executer.moe import MoeRecorder
        from node.executer.service import ExecuterService
        from node.moe.attacks import make_decode_only_engine
        from node.moe.config import DutyValidator, MoeDutiesConfig
        from node.moe.dense import MoeDenseCheck, has_dense_profile
        from node.moe.validate import load_limits
        from node.profiles import load_profile

        torch.set_num_threads(self.options.threads)
        files = materialise_model(get_model_spec(self.options.model))
        folder, model_id = files.path, files.model_id
        config = json.loads((folder / "config.json").read_text())
        layers, experts, vocab = config["num_hidden_layers"], config["num_local_experts"], config["vocab_size"]
        self.engine = TransformersEngine(folder, self.options.model)
        tokenizer = ModelTokenizer(folder, True)
        limits = load_limits()
        cheat = ExpertKey.parse(self.options.cheat_expert)
        dense = has_dense_profile(self.options.model)  # the hub committee's dense check of the served tokens
        thresholds = load_profile(files.spec)[1].stage2_thresholds() if dense else None
        self.note(f"{self.options.model}: {layers} layers x {experts} experts; cheater quantises {cheat} to int8"
                  + (f"; decode-only cheater decodes with {self.options.decode_cheat}" if dense else
                     "; no dense stage-2 profile: no dense check, no decode-only cheater"))
        n = self.options.validators
        with Anvil(accounts=6 + n) as anvil:
            w3 = anvil.web3()
            admin, treasury, requester, honest_key, cheat_key = (dev_account(i) for i in range(5))
            val_keys = [dev_account(5 + i) for i in range(n)]
            self.validator_keys = val_keys
            hub, _ = deploy(w3, admin, HubConfig(treasury=treasury.address, committee_size=3, min_committee=3))
            hub.register_model(admin, model_id, K, vocab, ALPHA, BETA, 10**18, keccak256(b"moe-devnet"), (2,), MIN_FEE)
            hub.advance_model_to(admin, model_id, ModelState.PUNITIVE)
            ed = deploy_expert_duty(w3, admin, hub, self.options.per_duty)
            ed.set_shape(admin, model_id, layers, experts)
            decode_key = dev_account(5 + n)
            candidates = [MoeOperator("honest", honest_key, None, self.lock),
                          MoeOperator("int8-expert", cheat_key, cheat, self.lock),
                          MoeOperator("decode-only", decode_key, None, self.lock, decode_only=True)]
            operators = [op for op in candidates if op.name in self.options.operators and (dense or not op.decode_only)]
            for op in operators:  # one engine in this process: the cheaters patch it only while they serve
                engine = self.engine
                if op.decode_only:  # tokens from a cheaper decode; the recorder traces the real model afterwards
                    engine = make_decode_only_engine(self.options.decode_cheat, self.engine, self.dense_parent(files))
                op.service = ExecuterService(files, tokenizer, engine, None, moe=MoeRecorder(self.engine.model))
            for op in operators:
                hub.bond(op.account, Role.OPERATOR, 10 * 10**18)
            cache: dict[ExpertKey, Any] = {}
            services = ServiceLoop()
            shape = compute_shape(config)
            try:
                for op in operators:
                    services.call(serve_operator(op))
                executers = {op.account.address: op.url for op in operators}
                for i, account in enumerate(val_keys):
                    hub.bond(account, Role.VALIDATOR, (3 + i) * 10**18)  # unequal stakes: the draw is weighted
                    holds = compute_holdings(i, layers, experts)  # what it preloads; its draws may ask for more
                    duties = MoeDutiesConfig(experts=tuple(str(k) for k in holds))
                    checker = DutyValidator(folder, duties, limits, cache)
                    own_w3 = anvil.web3()  # each validator its own RPC client, as separate daemons would have
                    store = Store(self.options.out / "validators" / f"v{i}", int(own_w3.eth.chain_id), hub.address)
                    self.stores.append(store)
                    svc = MoeDutyService(MoeServiceConfig(module=ed.address, model=self.options.model,
                                                          experts=duties.experts),
                                         account, Hub(own_w3, hub.address), ExpertDutyClient(own_w3, ed.address),
                                         store, checker, shape, executers, TxManager(own_w3, account, store),
                                         confirmations=0, poll_interval=0.1, model_id=model_id)
                    if thresholds is not None:  # every validator loads the whole model here (shared, one lock)
                        svc.dense = MoeDenseCheck(Hub(own_w3, hub.address), files, tokenizer, self.engine, thresholds,
                                                  executers, self.lock)
                    self.services.append(svc)
                    services.spawn(svc.run(services.stop))
                anvil_mine(w3, WEIGHT_DELAY + 1)  # every validator's stake settled before the first commit
                self.note(f"chain up: hub {hub.address}, ExpertDuty {ed.address}; {n} validators running the MoE "
                          f"duty service (the hub committee's members open each commitment), {self.options.per_duty} "
                          "drawn per duty from all of them; operators run the executer API")
                for r in range(self.options.rounds):
                    for op in operators:
                        if hub.staker(op.account.address).jailed:
                            continue
                        prompt = PROMPTS[(2 * r + len(self.records)) % len(PROMPTS)]
                        messages = [{"role": "user", "content": prompt}]
                        self.records.append(self.one_inference(w3, hub, ed, op, services, requester, model_id,
                                                               messages, tuple(tokenizer.encode_chat(messages))))
                problems = [f"a duty service stopped: {f}" for f in services.failures()]
            finally:
                services.close()
                for store in self.stores:
                    store.close()
            return problems + self.judge(hub, operators)

    def one_inference(self, w3: Any, hub: Hub, ed: ExpertDutyClient, op: MoeOperator, services: ServiceLoop,
                      requester: Any, model_id: bytes, messages: list[dict[str, str]],
                      prompt_ids: tuple[int, ...]) -> MoeInferenceRecord:
        """Request, serve, commit, draw the duties, let the validators' services judge them, settle on the hub."""
        from node.protocol.prompt import compute_prompt_hash

        started = time.monotonic()
        params = SamplingParams(0.7, 0.95, 0, self.options.tokens)
        user_seed = 1000 + len(self.records)
        prompt_hash = compute_prompt_hash(model_id, messages=messages)  # the dense check recomputes it from the request
        iid = hub.request_inference(requester, op.account.address, model_id, prompt_hash, user_seed,
                                    Params(params.temperature_bits, params.top_p_bits, params.top_k,
                                           params.max_tokens), FEE)
        served = op.serve(iid, messages, prompt_ids, prompt_hash, params, user_seed)
        commit_block = int(hub.commit_inference(op.account, iid, served.commitment)["blockNumber"])
        before = hub.staker(op.account.address).stake
        anvil_mine(w3, 2)  # the selection seed: the hub committee's validators open the commitment on the module
        deadline = time.monotonic() + self.options.judge_timeout
        opened_at = self.wait_opened(w3, ed, iid, commit_block, deadline)
        opened = ed.opened(iid)
        record = MoeInferenceRecord(iid, op.name, len(served.output_ids), opened.duties)
        if opened_at is not None:
            record.assign_gas = opened_at[0]
            drawn = {parse_duty_key(d): addresses for d, addresses in ed.assignments(iid).items()}
        else:
            drawn = {}
            self.note(f"#{iid}: no validator opened the commitment in time")
        while opened_at is not None and time.monotonic() < deadline and not services.failures():
            # a majority of a duty's judges settles it; a late third judge finds it settled and signs nothing
            if len(ed.get_events("DutySettled", opened_at[1], argument_filters={"inferenceId": iid})) >= len(drawn):
                break
            time.sleep(0.5)  # each vote mines its own block on anvil; mining more would only run the window out
        signed = [d for svc in self.services for d in svc.done if d[0] == iid]
        record.checks = len(signed)
        if opened_at is not None:
            counted = ed.get_events("ExpertVerdictRecorded", opened_at[1], argument_filters={"inferenceId": iid})
            record.verdict_gas = sum(int(w3.eth.get_transaction_receipt(h)["gasUsed"])
                                     for h in {e["transactionHash"] for e in counted})
        reasons = {duty: reason for _, duty, reason in signed if reason}  # the reason an invalid vote gave
        for key in drawn:
            result = ed.duty_result(iid, compute_duty_key(key))
            if result is DutyResult.FAILED:
                record.failed[str(key)] = reasons.get(str(key), int(MoeReason.MOE_MALFORMED))
            record.undecided += result is DutyResult.OPEN
        self.wait_hub_settled(hub, iid, record, time.monotonic() + self.options.judge_timeout)
        record.slashed_wei = before - hub.staker(op.account.address).stake  # by the hub committee's verdict
        record.hub_votes = sorted({reason for svc in self.services for i, valid, reason in svc.hub_votes if i == iid})
        record.seconds = round(time.monotonic() - started, 2)
        verdict = "all duties passed" if not record.failed else f"failed {', '.join(sorted(record.failed))}"
        if any(record.hub_votes):
            verdict += f"; hub votes invalid, reasons {[r for r in record.hub_votes if r]}"
        slash = f"; slashed {record.slashed_wei / 1e18:g} ETH and jailed" if record.slashed_wei else ""
        self.note(f"#{iid} {op.name}: {record.tokens} tokens, {record.duties} duties drawn "
                  f"(open {record.assign_gas:,} gas), {record.checks} checks ({record.verdict_gas:,} gas): {verdict}"
                  f"{slash}; hub {record.hub_status}")
        return record

    def wait_opened(self, w3: Any, ed: ExpertDutyClient, iid: int, from_block: int,
                    deadline: float) -> tuple[int, int] | None:
        """Wait for a validator's service to open the inference; return (gas, block) of its assignDuties."""
        while time.monotonic() < deadline:
            logs = ed.get_events("DutiesAssigned", from_block, argument_filters={"inferenceId": iid})
            if logs:
                receipt = w3.eth.get_transaction_receipt(logs[0]["transactionHash"])
                return int(receipt["gasUsed"]), int(receipt["blockNumber"])
            time.sleep(0.2)
        return None

    def wait_hub_settled(self, hub: Hub, iid: int, record: MoeInferenceRecord, deadline: float) -> None:
        """Wait for the hub committee's duty services to vote the inference (none votes while a duty is undecided:
        it then settles unchecked when the window ends); record the hub status."""
        from chain.contracts import Status

        voting = record.duties > 0 and (record.failed or record.undecided == 0)
        while voting and time.monotonic() < deadline and hub.get_inference(iid).status is Status.COMMITTED:
            time.sleep(0.2)
        record.hub_status = hub.get_inference(iid).status.name.lower()

    def judge(self, hub: Hub, operators: list[MoeOperator]) -> list[str]:
        """Return what went wrong: the cheater not slashed and jailed, the honest operator jailed or unpaid."""
        problems = []
        for op in operators:
            s = hub.staker(op.account.address)
            if op.cheating and not (s.jailed and s.stake < 10 * 10**18):
                problems.append(f"{op.name} was not slashed and jailed")
            if not op.cheating and (s.jailed or s.stake != 10 * 10**18 or hub.credits(op.account.address) == 0):
                problems.append(f"{op.name} is not in good standing and paid")
        return problems


def anvil_mine(w3: Any, blocks: int) -> None:
    """Mine `blocks` empty blocks on anvil."""
    for _ in range(blocks):
        w3.provider.make_request("evm_mine", [])


def run_moe_devnet(options: MoeDevnetOptions, console: Console) -> int:
    """Run the MoE devnet; return 0 if the cheater was slashed and jailed and the honest operator paid."""
    import torch

    threads = torch.get_num_threads()  # the devnet runs in this process: leave its thread count as it was
    devnet = MoeDevnet(options, console)
    try:
        problems = devnet.run()
    finally:
        torch.set_num_threads(threads)
    options.out.mkdir(parents=True, exist_ok=True)
    record = {"options": json.loads(options.model_dump_json()), "inferences": [asdict(r) for r in devnet.records],
              "events": devnet.events, "problems": problems}
    (options.out / "devnet-moe.json").write_text(json.dumps(record, indent=1) + "\n")
    for p in problems:
        console.print(f"[red]✗ {p}[/red]")
    if not problems:
        console.print("[green]✓ every cheating operator was slashed and jailed by the hub committee's verdict "
                      "(int8 expert: its failed expert, re-judged; decode-only: the dense check); the honest operator "
                      "is in good standing and paid[/green]")
    return 1 if problems else 0


def run_devnet_for_model(model: str, rounds: int, validators: int, tokens: int, threads: int, out: Path,
                         console: Console) -> int:
    """Run `verinfer devnet --model NAME` for a registered MoE model (the dense devnet's options, mapped)."""
    from node.engines.models import get_model_spec

    spec = get_model_spec(model)
    if spec.source != "upcycled-moe":
        console.print(f"[red]--model {model}: only MoE models (source upcycled-moe) have a devnet mode here[/red]")
        return 2
    defaults = MoeDevnetOptions()
    options = MoeDevnetOptions(model=model, rounds=min(rounds, 3), tokens=min(tokens, defaults.tokens),
                               validators=max(validators, defaults.validators), threads=threads, out=out)
    return run_moe_devnet(options, console)

"""A small real network for daemon tests: anvil, the contract, the tiny model, one executer, one validator."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from chain.contracts import Hub, HubConfig, ModelState, Params, Role, Status
from chain.deploy import deploy
from chain.devnet import Anvil, dev_account
from chain.devnet import find_free_port as free_port
from chain.txmanager import MemoryJournal, TxManager
from node.checks.decision import Stage2Thresholds
from node.checks.projection import ProjectionThresholds
from node.executer.chain_mode import ChainGate
from node.executer.server import create_app
from node.executer.service import ExecuterService
from node.profiles import load_profile
from node.protocol.prompt import compute_prompt_hash, normalise_messages
from node.protocol.sampler import SamplingParams
from node.store.leveldb import Store
from node.validator.config import ValidatorConfig
from node.validator.daemon import ModelSlot, ValidatorNode

TOKENS = 8
PARAMS = SamplingParams(0.8, 1.0, 0, TOKENS)


@dataclass
class Harness:
    anvil: Anvil
    hub: Hub
    model_id: bytes
    operator: Any
    executer_url: str
    node: ValidatorNode
    store: Store
    tamper: dict[str, Callable[[dict[str, Any]], dict[str, Any]] | None]
    session: aiohttp.ClientSession
    requester: Any
    config: ValidatorConfig | None = None
    slot: ModelSlot | None = None
    others: tuple[Any, ...] = ()  # further bonded validators (committee members the test signs for)
    seed: int = 0
    task: asyncio.Task | None = None

    def restart(self) -> ValidatorNode:
        """Reopen the store and build a fresh node on it, as after a crash (the old node must have stopped)."""
        path = Path(self.store._db.name)
        self.store.close()
        self.store = Store(path, 31337, self.hub.address)
        assert self.config is not None and self.slot is not None
        self.node = ValidatorNode(self.config.model_copy(update={"metrics_port": free_port()}), self.node.account,
                                  Hub(self.anvil.web3(), self.hub.address), self.store, {self.model_id: self.slot})
        self.task = None
        return self.node

    def artifact_root(self, iid: int) -> bytes:
        """Return the committed artifact root of an inference."""
        logs = self.hub.contract.events.InferenceCommitted().get_logs(from_block=0,
                                                                       argument_filters={"inferenceId": iid})
        return bytes(logs[0]["args"]["artifactRoot"])

    async def infer(self, prompt: str = "Say hello.") -> int:
        """Request on chain, have the executer generate and commit; return the inference id."""
        messages = normalise_messages([{"role": "user", "content": prompt}])
        self.seed += 1
        iid = await asyncio.to_thread(self.hub.request_inference, self.requester, self.operator.address,
                                      self.model_id, compute_prompt_hash(self.model_id, messages=messages), self.seed,
                                      Params(PARAMS.temperature_bits, PARAMS.top_p_bits, 0, TOKENS), 10**15)
        body = {"model": "tiny-llama", "messages": messages, "temperature": 0.8, "max_tokens": TOKENS,
                "seed": self.seed, "inference_id": iid}
        async with self.session.post(f"{self.executer_url}/v1/chat/completions", json=body) as response:
            assert response.status == 200, await response.text()
        return iid

    async def settled(self, iid: int, timeout: float = 60.0) -> Status:
        """Wait until the inference leaves Committed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            if self.task is not None and self.task.done():
                raise AssertionError(f"the validator stopped: {self.task.exception()!r}")
            status = (await asyncio.to_thread(self.hub.get_inference, iid)).status
            if status is not Status.COMMITTED:
                return status
            await asyncio.sleep(0.2)
        raise AssertionError(f"inference {iid} not settled")


def tiny_thresholds(tiny) -> Stage2Thresholds:
    """Stage-2 thresholds for the tiny model (uncalibrated: honest runs of one engine measure ~0)."""
    _, profile = load_profile(tiny.files.spec)
    return Stage2Thresholds(max_weight_error=1e-4, max_sampler_margin=1e-4, max_logprob_distance=1e-3,
                            max_candidate_mismatch_rate=0.0, max_surprisal_z=10.0, max_distance2=1e-3,
                            fingerprint=profile.fingerprint_thresholds())


def run(coro) -> None:
    """Run a test scenario to completion."""
    asyncio.run(coro)


async def start(h) -> tuple[asyncio.Event, asyncio.Task]:
    """Start the harness's validator node; return its stop event and task."""
    stop = asyncio.Event()
    h.task = asyncio.create_task(h.node.run(stop))
    return stop, h.task


async def finish(stop: asyncio.Event, task: asyncio.Task, timeout_s: float = 20.0) -> None:
    """Stop the node and wait for its task (failures included) within timeout_s."""
    stop.set()
    await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), timeout_s)


@asynccontextmanager
async def harness(tiny, tmp_path: Path, committee: int = 1, projection: Any = None,
                  **config: Any) -> AsyncIterator[Harness]:
    """Start everything; yield; stop everything. With `committee` > 1, the node's fellow members are
    dev accounts 5, 6, … (bonded, no daemon: the test signs and gossips for them). With `projection`
    (a ProjectionConfig), the model is registered for kind-1 fingerprints first: the executer commits them
    and the validator checks them (plumbing threshold)."""
    files = tiny.files
    if projection is not None:
        files = replace(tiny.files, spec=tiny.files.spec.model_copy(update={"fingerprint_kinds": (1, 0),
                                                                            "projection": projection}))
    with Anvil(block_time=0.5) as anvil:
        w3 = anvil.web3()
        admin, requester, operator, validator = (dev_account(i) for i in (0, 1, 2, 3))
        others = tuple(dev_account(5 + i) for i in range(committee - 1))
        hub, deployment = deploy(w3, admin, HubConfig(treasury=dev_account(9).address, committee_size=committee,
                                                      min_committee=committee))
        model_id = tiny.files.model_id
        hub.register_model(admin, model_id, tiny.files.spec.k, tiny.files.spec.vocab_size, 10**16, 0, 10**18,
                           b"\x00" * 32, sorted(tiny.files.spec.stop_token_ids))
        hub.advance_model_to(admin, model_id, ModelState.VERIFYING)
        hub.bond(operator, Role.OPERATOR, 10 * 10**18)
        for v in (validator, *others):
            hub.bond(v, Role.VALIDATOR, 5 * 10**18)
        _, profile = load_profile(tiny.files.spec)
        gate = ChainGate(Hub(w3, hub.address), TxManager(w3, operator, MemoryJournal()), model_id)
        service = ExecuterService(files, tiny.tokenizer, tiny.engine, profile.fingerprint_thresholds(), gate=gate)
        tamper: dict[str, Callable[[dict[str, Any]], dict[str, Any]] | None] = {"payload": None}

        @web.middleware
        async def tampering(request: web.Request, handler: Any) -> web.StreamResponse:
            response = await handler(request)
            change = tamper["payload"]
            if change is not None and request.path.startswith("/v1/payloads/"):
                body = change(__import__("json").loads(response.body))
                return web.json_response(body)
            return response

        app = create_app(service, "profile", False)
        app.middlewares.append(tampering)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        url = f"http://127.0.0.1:{port}"
        values = dict(chain_id=31337, contract=hub.address, keystore=Path("unused"), start_block=deployment.block,
                      executers={operator.address: url}, confirmations=1, poll_interval=0.2,
                      metrics_port=free_port(), fetch_retries=2, fetch_timeout=5.0,
                      p2p_key=tmp_path / "validator.key")
        values.update(config)
        store = Store(tmp_path / "validator", 31337, hub.address)
        slot = ModelSlot(files, tiny.tokenizer, tiny.engine, tiny_thresholds(tiny),
                         projection=ProjectionThresholds(1e-3) if projection is not None else None)
        validator_config = ValidatorConfig(**values)
        node = ValidatorNode(validator_config, validator, Hub(anvil.web3(), hub.address), store, {model_id: slot})
        async with aiohttp.ClientSession() as session:
            h = Harness(anvil, hub, model_id, operator, url, node, store, tamper, session, requester,
                        validator_config, slot, others)
            try:
                yield h
            finally:
                await runner.cleanup()
                h.store.close()


def corrupt_artifact(payload: dict[str, Any]) -> dict[str, Any]:
    """Flip one byte of the artifact's wire bytes (a malformed or different artifact)."""
    wire = bytearray(base64.b64decode(payload["artifact"]))
    wire[len(wire) // 2] ^= 0xFF
    return {**payload, "artifact": base64.b64encode(bytes(wire)).decode()}

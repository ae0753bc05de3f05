"""The validator daemon judges stock-sampler inferences on anvil (docs/protocol.md §13.1): a stock operator
(vLLM's seeded rule over the tiny model) commits outputHash with the stock artifact root and serves a
StockPayload; the daemon checks it against the commitment, runs Token-DiFR and votes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from chain.contracts import Hub, HubConfig, ModelState, Params, Role, Status
from chain.deploy import deploy
from chain.devnet import Anvil, dev_account
from chain.txmanager import MemoryJournal, TxManager
from node.calibrate.stock import generate_with_vllm_rule
from node.checks.stock_decision import StockThresholds
from node.engines.models import ModelFiles
from node.executer.chain_mode import ChainGate
from node.executer.stock import StockService
from node.protocol.errors import Reason
from node.protocol.hashing import keccak256
from node.protocol.prompt import compute_prompt_hash, normalise_messages
from node.protocol.sampler import SamplingParams
from node.protocol.stock import STOCK_ARTIFACT_ROOT
from node.store.leveldb import Store
from node.validator.config import ValidatorConfig
from node.validator.daemon import ModelSlot, ValidatorNode
from tests.node.validator.harness import free_port

TOKENS = 12
PARAMS = SamplingParams(0.8, 0.95, 0, TOKENS)
# plumbing thresholds: the operator and the validator run one engine, so an honest margin is ~0
THRESHOLDS = StockThresholds(max_difr_mean=0.01, max_difr_max=0.01, max_surprisal_z_abs=8.0)


@dataclass
class StockHarness:
    hub: Hub
    files: ModelFiles
    service: StockService
    node: ValidatorNode
    store: Store
    requester: Any
    tamper: dict[str, Callable[[dict[str, Any]], dict[str, Any]] | None]
    seed: int = 0

    async def infer(self, prompt: str = "Say hello.") -> int:
        """Request on chain; the stock operator generates, commits and keeps the payload."""
        messages = normalise_messages([{"role": "user", "content": prompt}])
        prompt_hash = compute_prompt_hash(self.files.model_id, messages=messages)
        self.seed += 1
        iid = await asyncio.to_thread(self.hub.request_inference, self.requester, self.service.gate.txm.account.address,
                                      self.files.model_id, prompt_hash, self.seed,
                                      Params(PARAMS.temperature_bits, PARAMS.top_p_bits, 0, TOKENS), 10**15)
        prompt_ids = self.node.models[self.files.model_id].tokenizer.encode_chat(messages)
        await asyncio.to_thread(self.service.infer, prompt_ids, prompt_hash, PARAMS, self.seed, iid,
                                {"messages": messages})
        return iid

    async def settled(self, iid: int, task: asyncio.Task, timeout: float = 60.0) -> Status:
        """Wait until the inference leaves Committed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            if task.done():
                raise AssertionError(f"the validator stopped: {task.exception()!r}")
            status = (await asyncio.to_thread(self.hub.get_inference, iid)).status
            if status is not Status.COMMITTED:
                return status
            await asyncio.sleep(0.2)
        raise AssertionError(f"inference {iid} not settled")


@asynccontextmanager
async def stock_network(tiny, tmp_path: Path, generate: Callable[..., Sequence[int]] | None = None
                        ) -> AsyncIterator[StockHarness]:
    """anvil, the hub with the tiny model registered as a stock-sampler model, one stock operator, one validator."""
    files = ModelFiles(tiny.files.spec.model_copy(update={"sampler": "vllm-seeded", "name": "tiny-llama-stock"}),
                       tiny.files.path, tiny.files.weights_sha256)

    def honest(prompt_ids: Sequence[int], params: SamplingParams, request_seed: int,
               stops: frozenset[int]) -> Sequence[int]:
        return tiny.engine.generate_with_vllm_rule(prompt_ids, params, request_seed, stops)

    with Anvil(block_time=0.5) as anvil:
        w3 = anvil.web3()
        admin, requester, operator, validator = (dev_account(i) for i in (0, 1, 2, 3))
        hub, deployment = deploy(w3, admin, HubConfig(treasury=dev_account(9).address, committee_size=1,
                                                      min_committee=1))
        hub.register_model(admin, files.model_id, files.spec.k, files.spec.vocab_size, 10**16, 0, 10**18,
                           b"\x00" * 32, sorted(files.spec.stop_token_ids))
        hub.advance_model_to(admin, files.model_id, ModelState.VERIFYING)
        hub.bond(operator, Role.OPERATOR, 10 * 10**18)
        hub.bond(validator, Role.VALIDATOR, 5 * 10**18)
        gate = ChainGate(Hub(w3, hub.address), TxManager(w3, operator, MemoryJournal()), files.model_id)
        service = StockService(files, tiny.tokenizer, generate or honest, tiny.engine.info, gate)
        tamper: dict[str, Callable[[dict[str, Any]], dict[str, Any]] | None] = {"payload": None}

        async def payload(request: web.Request) -> web.Response:
            raw = service.payload_json(int(request.match_info["iid"]))
            if raw is None:
                return web.json_response({"error": "not found"}, status=404)
            change = tamper["payload"]
            return web.json_response(change(json.loads(raw))) if change else web.Response(body=raw)

        app = web.Application()
        app.router.add_get("/v1/payloads/{iid}", payload)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        config = ValidatorConfig(chain_id=31337, contract=hub.address, keystore=Path("unused"),
                                 start_block=deployment.block, executers={operator.address: f"http://127.0.0.1:{port}"},
                                 confirmations=1, poll_interval=0.2, metrics_port=free_port(), fetch_retries=2,
                                 fetch_timeout=5.0, p2p_key=tmp_path / "validator.key")
        store = Store(tmp_path / "validator", 31337, hub.address)
        slot = ModelSlot(files, tiny.tokenizer, tiny.engine, None, stock=THRESHOLDS)
        node = ValidatorNode(config, validator, Hub(anvil.web3(), hub.address), store, {files.model_id: slot})
        try:
            yield StockHarness(hub, files, service, node, store, requester, tamper)
        finally:
            await runner.cleanup()
            store.close()


async def _run(h: StockHarness, scenario: Callable[[asyncio.Task], Any]) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(h.node.run(stop))
    try:
        await scenario(task)
        assert not task.done()
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 10)


def test_an_honest_stock_inference_is_valid_and_tampered_tokens_are_refused(tiny, tmp_path: Path) -> None:
    async def scenario() -> None:
        async with stock_network(tiny, tmp_path) as h:
            async def steps(task: asyncio.Task) -> None:
                good = await h.infer()
                assert await h.settled(good, task) is Status.VALID
                record = h.store.get_verdict(good)
                assert record is not None and record.valid
                # a payload whose tokens are not the committed ones: not cached, the vote is invalid
                h.tamper["payload"] = lambda p: {**p, "output_ids": [*p["output_ids"][:-1], 7]}
                bad = await h.infer("Count to three.")
                assert await h.settled(bad, task) is Status.INVALID
                assert h.store.get_verdict(bad).reason == int(Reason.OUTPUT_HASH_MISMATCH)
                assert h.store.get_record("payload", bad) is None
            await _run(h, steps)

    asyncio.run(scenario())


def test_a_stock_operator_that_ignores_the_seed_is_voted_invalid(tiny, tmp_path: Path) -> None:
    def unseeded(prompt_ids: Sequence[int], params: SamplingParams, request_seed: int,
                 stops: frozenset[int]) -> Sequence[int]:
        return generate_with_vllm_rule(tiny.engine, tuple(prompt_ids), params, request_seed ^ 0x5A5A)

    async def scenario() -> None:
        async with stock_network(tiny, tmp_path, unseeded) as h:
            async def steps(task: asyncio.Task) -> None:
                iid = await h.infer()
                assert await h.settled(iid, task) is Status.INVALID
                assert h.store.get_verdict(iid).reason in (int(Reason.TOKEN_DIFR), int(Reason.TOKEN_DIFR_MAX))
            await _run(h, steps)

    asyncio.run(scenario())


def test_a_commitment_with_an_artifact_root_is_refused_for_a_stock_model(tiny, tmp_path: Path) -> None:
    # the operator commits its honest tokens but names an artifact root (as for a canonical model): the
    # stock commitment is fixed, so the payload is not the committed one
    async def scenario() -> None:
        async with stock_network(tiny, tmp_path) as h:
            gate = h.service.gate
            real_commit = gate.commit
            gate.commit = lambda served, root: real_commit(served, keccak256(b"an artifact root"))  # type: ignore
            assert STOCK_ARTIFACT_ROOT != keccak256(b"an artifact root")

            async def steps(task: asyncio.Task) -> None:
                iid = await h.infer()
                assert await h.settled(iid, task) is Status.INVALID
                assert h.store.get_verdict(iid).reason == int(Reason.ARTIFACT_ROOT_MISMATCH)
            await _run(h, steps)

    asyncio.run(scenario())

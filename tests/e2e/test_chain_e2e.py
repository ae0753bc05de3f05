"""End to end on anvil with the real SmolLM2: operators serve and commit, validators check, the contract judges.

One honest operator, two cheaters (int8 weights; the prefill attack with forged leaves) and one
stage-1 forger; two validator daemons with their own LevelDB stores and their own engine. Every
inference is checked (min check rate 1), committees of up to two.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from chain.contracts import Hub, HubConfig, ModelState, Params, Role, Status
from chain.deploy import deploy
from chain.devnet import Anvil, dev_account
from chain.devnet import find_free_port as free_port
from chain.txmanager import MemoryJournal, TxManager
from node.calibrate.cheaters import ForgedChoiceEngine, PrefillAttackEngine
from node.calibrate.models import make_int8_engine
from node.engines.transformers_engine import TransformersEngine, TransformersOptions
from node.executer.chain_mode import ChainGate
from node.executer.server import create_app
from node.executer.service import ExecuterService
from node.p2p.host import P2PHost, compute_peer_id
from node.profiles import load_profile, model_registration
from node.protocol.prompt import compute_prompt_hash, normalise_messages
from node.protocol.reputation import PRIOR_WAD
from node.protocol.sampler import SamplingParams
from node.store.leveldb import Store
from node.validator.config import ValidatorConfig
from node.validator.daemon import ModelSlot, ValidatorNode

MODEL = "smollm2-135m-instruct"
PROMPTS = ["Name three primary colours.", "What is 12 times 7?", "Write a haiku about rain.",
           "Give one tip for learning Python.", "What is the capital of France?"]
TOKENS = 24


@dataclass
class Operator:
    name: str
    account: object
    service: ExecuterService
    url: str = ""


@pytest.mark.e2e
def test_honest_paid_cheaters_slashed_and_a_forgery_proven(smol, tmp_path: Path) -> None:
    with Anvil(block_time=1) as anvil:
        asyncio.run(scenario(anvil, smol, tmp_path))


async def scenario(anvil: Anvil, smol, tmp_path: Path) -> None:  # one story, told in order
    w3 = anvil.web3()
    admin, requester = dev_account(0), dev_account(1)
    # two validators, both in every committee (a test network: the protocol default minimum is 3)
    hub, deployment = deploy(w3, admin, HubConfig(treasury=dev_account(9).address, committee_size=2, min_committee=2))
    registration = model_registration(MODEL)
    model_id = registration.model_id
    registration.register(hub, admin, 10**18, 0)
    hub.advance_model_to(admin, model_id, ModelState.PUNITIVE)
    _, profile = load_profile(smol.files.spec)
    base = smol.engine
    int8 = make_int8_engine(base)
    engines = {"honest": base, "int8": int8, "prefill": PrefillAttackEngine(cheap=int8, real=base),
               "forger": ForgedChoiceEngine(base)}
    operators = []
    for i, (name, engine) in enumerate(engines.items()):
        account = dev_account(2 + i)
        hub.bond(account, Role.OPERATOR, 10 * 10**18)
        gate = ChainGate(Hub(w3, hub.address), TxManager(w3, account, MemoryJournal()), model_id)
        service = ExecuterService(smol.files, smol.tokenizer, engine, profile.fingerprint_thresholds(), gate=gate)
        operators.append(Operator(name, account, service))
    validators = [dev_account(6), dev_account(7)]
    for v in validators:
        hub.bond(v, Role.VALIDATOR, 5 * 10**18)

    runners, hosts = [], []
    peers = {}
    for op in operators:  # each executer serves payloads over libp2p (validators ask there first) and HTTP
        host = P2PHost(tmp_path / f"{op.name}.key", op.service.payload_json).start()
        hosts.append(host)
        peers[op.account.address] = f"{host.addrs[0]}/p2p/{host.peer_id}" if "/p2p/" not in host.addrs[0] \
            else host.addrs[0]
    for op in operators:  # each executer serves its OpenAI-compatible API
        runner = web.AppRunner(create_app(op.service, "profile", True))
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        op.url = f"http://127.0.0.1:{port}"
        runners.append(runner)

    own_engine = TransformersEngine(smol.files.path, MODEL, TransformersOptions())  # validators' own engine
    slot = ModelSlot(smol.files, smol.tokenizer, own_engine, profile.stage2_thresholds())
    stop = asyncio.Event()
    nodes = []
    listen = {}
    for i, account in enumerate(validators):  # validators gossip votes: they know each other's libp2p address
        port = free_port()
        listen[account.address] = f"/ip4/127.0.0.1/tcp/{port}"
        peers[account.address] = f"{listen[account.address]}/p2p/{compute_peer_id(tmp_path / f'validator{i}.key')}"
    for i, account in enumerate(validators):
        config = ValidatorConfig(p2p_listen=listen[account.address], chain_id=31337, contract=hub.address,
                                 keystore=Path("unused"),
                                 start_block=deployment.block, executers={o.account.address: o.url for o in operators},
                                 peers=peers, p2p_key=tmp_path / f"validator{i}.key",
                                 confirmations=1, poll_interval=0.2, metrics_port=free_port())
        store = Store(tmp_path / f"validator{i}", 31337, hub.address)
        nodes.append((ValidatorNode(config, account, Hub(anvil.web3(), hub.address), store, {model_id: slot}), store))
    tasks = [asyncio.create_task(node.run(stop)) for node, _ in nodes]

    requested: dict[str, list[int]] = {op.name: [] for op in operators}
    params = SamplingParams(0.7, 1.0, 0, TOKENS)
    async with aiohttp.ClientSession() as session:
        for round_ in range(4):
            for op in operators:
                if hub.staker(op.account.address).jailed or (op.name == "forger" and round_ > 0):
                    continue
                messages = normalise_messages([{"role": "user", "content": PROMPTS[(round_ + len(op.name)) % 5]}])
                seed = 1000 * round_ + len(requested[op.name])
                inference_id = await asyncio.to_thread(
                    hub.request_inference, requester, op.account.address, model_id,
                    compute_prompt_hash(model_id, messages=messages), seed,
                    Params(params.temperature_bits, params.top_p_bits, 0, TOKENS), 10**16)
                body = {"model": MODEL, "messages": messages, "temperature": 0.7, "max_tokens": TOKENS,
                        "seed": seed, "inference_id": inference_id}
                async with session.post(f"{op.url}/v1/chat/completions", json=body) as response:
                    assert response.status == 200, await response.text()
                requested[op.name].append(inference_id)
            await settle(hub, [i for ids in requested.values() for i in ids], tasks)

    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    for runner in runners:
        await runner.cleanup()
    for host in hosts:
        host.stop()
    fetched = [node.metrics.fetched.labels(src)._value.get() for node, _ in nodes for src in ("libp2p", "http")]
    for _, store in nodes:
        store.close()

    status = {name: [hub.get_inference(i).status for i in ids] for name, ids in requested.items()}
    honest = hub.staker(operators[0].account.address)
    assert status["honest"] and all(s is Status.VALID for s in status["honest"]), status
    assert honest.spoof_p < PRIOR_WAD and not honest.jailed and hub.credits(operators[0].account.address) > 0
    for name in ("int8", "prefill"):
        s = hub.staker(next(o for o in operators if o.name == name).account.address)
        assert status[name] and all(x is Status.INVALID for x in status[name]), (name, status)
        assert s.jailed and s.stake == 5 * 10**18, (name, s)  # slashBps = 50 % once, at the threshold
    forger = hub.staker(operators[3].account.address)
    assert status["forger"] == [Status.FRAUD] and forger.stake == 0 and forger.jailed
    assert all(hub.credits(v.address) > 0 for v in validators)
    assert all(node.healthy for node, _ in nodes)
    libp2p, http = sum(fetched[0::2]), sum(fetched[1::2])
    assert libp2p > 0 and http == 0, (libp2p, http)  # libp2p by default, HTTP only as the fallback
    # votes travel by gossip and a quorum lands in one transaction: never two verdict txs per inference
    recorded = hub.contract.events.VerdictRecorded().get_logs(from_block=deployment.block)
    txs: dict[int, set[str]] = {}
    for e in recorded:
        txs.setdefault(int(e["args"]["inferenceId"]), set()).add(e["transactionHash"].to_0x_hex())
    assert txs and all(len(t) == 1 for t in txs.values()), txs
    assert any(len([e for e in recorded if int(e["args"]["inferenceId"]) == i]) == 2 for i in txs)  # a 2-vote quorum


async def settle(hub: Hub, ids: list[int], tasks: list[asyncio.Task], timeout: float = 240.0) -> None:
    """Wait until no inference is still waiting for verdicts (or a daemon died)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        for task in tasks:
            if task.done():
                raise AssertionError(f"a validator stopped: {task.exception()!r}")
        pending = [i for i in ids if (await asyncio.to_thread(hub.get_inference, i)).status is Status.COMMITTED]
        if not pending:
            return
        await asyncio.sleep(0.5)
    raise AssertionError(f"inferences never settled: {pending}")

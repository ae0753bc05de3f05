"""Issue 31, finding 1, with real processes: an honest executer restarted between commit and fetch is never punished.

anvil, the deployed contract, `verinfer executer run` (its own LevelDB) and two `verinfer validator run`
daemons, all separate processes. The executer answers (its commits are mined), is killed (kill -9, then
SIGTERM) before any validator fetched the payloads, and comes back on the same data folder: the validators
keep asking within the check window, fetch the payloads from the restarted process's disk and the
inferences settle valid; the operator keeps its stake and is not jailed. On 404c0a8 the payloads lived
only in memory: the validators voted invalid (ARTIFACT_ROOT_MISMATCH) and the operator was slashed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from chain.contracts import HubConfig, ModelState, Params, Role, Status
from chain.deploy import deploy
from chain.devnet import Anvil, dev_account, find_free_port, stop_process_group
from node.devnet.network import write_validator_config
from node.keys import write_keystore
from node.p2p.host import compute_peer_id
from node.profiles import model_registration
from node.protocol.prompt import compute_prompt_hash, normalise_messages
from node.protocol.reputation import PRIOR_WAD
from node.protocol.sampler import SamplingParams

MODEL = "smollm2-135m-instruct"
TOKENS = 12
REPO = Path(__file__).resolve().parents[2]
STAKE = 10 * 10**18


def env() -> dict[str, str]:
    e = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    e.pop("VERINFER_KEYSTORE_PASSWORD", None)
    return e


def wait_http(url: str, process: subprocess.Popen, log: Path, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, log.read_text()[-4000:]
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except (OSError, urllib.error.HTTPError):
            time.sleep(0.5)
    raise AssertionError(f"{url} not ready:\n{log.read_text()[-4000:]}")


class Executer:
    """`verinfer executer run` for one operator; restartable on the same data folder and port."""

    def __init__(self, tmp: Path, rpc: str, contract: str, operator) -> None:
        self.port = find_free_port()
        self.keystore, self.password = tmp / "operator.json", tmp / "operator.password"
        self.password.write_text("operator-password\n")
        write_keystore(self.keystore, bytes(operator.key), "operator-password")
        self.data, self.log = tmp / "executer-data", tmp / "executer.log"
        self.argv = [sys.executable, "-m", "node.cli", "executer", "run", "--model", MODEL, "--rpc", rpc,
                     "--contract", contract, "--keystore", str(self.keystore), "--password-file", str(self.password),
                     "--port", str(self.port), "--data-dir", str(self.data), "--p2p-listen", ""]
        self.process: subprocess.Popen | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            env=env(), cwd=REPO, start_new_session=True)
        self.starts += 1
        wait_http(f"{self.url}/health", self.process, self.log)

    def kill(self, sig: signal.Signals) -> None:
        assert self.process is not None
        os.killpg(self.process.pid, sig)
        self.process.wait(30)
        self.process = None

    def chat(self, body: dict) -> dict:
        request = urllib.request.Request(f"{self.url}/v1/chat/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=300) as response:
            return json.loads(response.read())


@pytest.mark.e2e
def test_an_executer_restarted_between_commit_and_fetch_gets_its_inferences_settled_valid(tmp_path: Path) -> None:
    with Anvil(block_time=1, log_path=tmp_path / "anvil.log") as anvil:
        w3 = anvil.web3()
        admin, requester, operator = dev_account(0), dev_account(1), dev_account(2)
        validators = [dev_account(7), dev_account(8)]
        # commit and check windows of 120 and 200 one-second blocks: room for model loads on a busy machine
        hub, deployment = deploy(w3, admin, HubConfig(treasury=dev_account(9).address, committee_size=2,
                                                      min_committee=2, commit_window=120, check_window=200))
        registration = model_registration(MODEL)
        model_id = registration.model_id
        registration.register(hub, admin, 10**18, 0)
        hub.advance_model_to(admin, model_id, ModelState.PUNITIVE)  # invalid verdicts slash here
        hub.bond(operator, Role.OPERATOR, STAKE)
        for v in validators:
            hub.bond(v, Role.VALIDATOR, 5 * 10**18)

        executer = Executer(tmp_path, anvil.url, hub.address, operator)
        children: list[subprocess.Popen] = []
        try:
            executer.start()
            params = SamplingParams(0.7, 1.0, 0, TOKENS)

            def infer(prompt: str, seed: int) -> int:
                messages = normalise_messages([{"role": "user", "content": prompt}])
                iid = hub.request_inference(requester, operator.address, model_id,
                                            compute_prompt_hash(model_id, messages=messages), seed,
                                            Params(params.temperature_bits, params.top_p_bits, 0, TOKENS), 10**16)
                answer = executer.chat({"model": MODEL, "messages": messages, "temperature": 0.7,
                                        "max_tokens": TOKENS, "seed": seed, "inference_id": iid})
                assert answer["verinfer"]["inference_id"] == str(iid)
                assert hub.get_inference(iid).status is Status.COMMITTED  # committed before the answer left
                return iid

            # 1. kill -9 after two commits, before any validator runs: nothing has fetched them yet
            killed = [infer("Name three primary colours.", 11), infer("What is 12 times 7?", 12)]
            executer.kill(signal.SIGKILL)

            # 2. the validators start while the executer is down: they find the commits and cannot fetch
            peers, ports = {}, []
            for i, account in enumerate(validators):
                p2p_port, metrics_port = find_free_port(), find_free_port()
                key = tmp_path / f"validator-{i}" / "peer.key"
                key.parent.mkdir(parents=True, exist_ok=True)
                peers[account.address] = f"/ip4/127.0.0.1/tcp/{p2p_port}/p2p/{compute_peer_id(key)}"
                ports.append((p2p_port, metrics_port))
            for i, (account, (p2p_port, metrics_port)) in enumerate(zip(validators, ports, strict=True)):
                config = write_validator_config(tmp_path / f"validator-{i}", i, account, anvil.url, hub.address,
                                                deployment.block, MODEL, {operator.address: executer.url}, peers,
                                                p2p_port, metrics_port)
                log = tmp_path / f"validator-{i}.log"
                with log.open("ab") as out:
                    children.append(subprocess.Popen(
                        [sys.executable, "-m", "node.cli", "validator", "run", "--config", str(config)], stdout=out,
                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env(), cwd=REPO,
                        start_new_session=True))
            for child, (_, metrics_port), i in zip(children, ports, range(2), strict=True):
                wait_http(f"http://127.0.0.1:{metrics_port}/health", child, tmp_path / f"validator-{i}.log")
            time.sleep(5)  # they have found the commits and asked for the payloads: nobody answered
            assert all(hub.get_inference(i).status is Status.COMMITTED for i in killed)

            # 3. the executer comes back on its data folder; then one more inference and a clean SIGTERM
            executer.start()
            terminated = infer("Write a haiku about rain.", 13)
            executer.kill(signal.SIGTERM)
            time.sleep(3)
            executer.start()

            ids = [*killed, terminated]
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline and any(hub.get_inference(i).status is Status.COMMITTED for i in ids):
                for i, child in enumerate(children):
                    assert child.poll() is None, (tmp_path / f"validator-{i}.log").read_text()[-4000:]
                time.sleep(1)
            status = {i: hub.get_inference(i).status for i in ids}
            logs = "\n".join((tmp_path / f"validator-{i}.log").read_text()[-3000:] for i in range(2))
            assert all(s is Status.VALID for s in status.values()), (status, logs)
            staker = hub.staker(operator.address)
            assert staker.stake == STAKE and not staker.jailed and staker.spoof_p < PRIOR_WAD, staker
            assert executer.starts == 3
        finally:
            for child in children:
                stop_process_group(child, 10.0)
            if executer.process is not None:
                stop_process_group(executer.process, 10.0)

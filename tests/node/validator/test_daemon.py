"""The validator daemon on anvil with the tiny model: the happy path and the faults it must survive."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from chain.contracts import Status
from chain.devnet import Anvil, dev_account
from node.errors import FatalError
from node.keys import create_keystore, unlock_keystore, write_keystore
from node.protocol.hashing import keccak256
from node.store.leveldb import ConflictingVerdict, VerdictRecord
from tests.node.validator.harness import corrupt_artifact, finish, free_port, harness, run, start


def test_an_honest_inference_gets_a_valid_verdict_and_metrics_and_health_answer(tiny, tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tiny, tmp_path) as h:
            stop, task = await start(h)
            iid = await h.infer()
            assert await h.settled(iid) is Status.VALID
            port = h.node.config.metrics_port
            async with h.session.get(f"http://127.0.0.1:{port}/health") as r:
                assert r.status == 200 and (await r.json())["healthy"]
            for _ in range(50):  # the counter moves once the submission is confirmed
                if 'verinfer_verdicts_total{valid="true"} 1.0' in await _metrics(h):
                    break
                await asyncio.sleep(0.1)
            assert 'verinfer_verdicts_total{valid="true"} 1.0' in await _metrics(h)
            record = h.store.get_verdict(iid)
            assert record is not None and record.valid
            await finish(stop, task)

    run(scenario())


def test_queued_inferences_are_validated_in_batched_prefills(tiny, tmp_path: Path) -> None:
    async def scenario() -> None:
        async with harness(tiny, tmp_path, verify_batch=4, batch_wait=0.3) as h:
            ids = [await h.infer(f"Count to {n}.") for n in range(4)]  # committed before the validator starts
            stop, task = await start(h)
            assert [await h.settled(iid) for iid in ids] == [Status.VALID] * 4
            sizes = h.slot.batcher.batch_sizes if h.slot.batcher else []
            assert sum(sizes) == 4 and max(sizes) >= 2, f"the queued checks shared passes: {sizes}"
            assert f"verinfer_prefill_batch_size_count {float(len(sizes))}" in await _metrics(h)
            assert f"verinfer_prefill_batch_size_sum {float(sum(sizes))}" in await _metrics(h)
            await finish(stop, task)

    run(scenario())


def test_a_payload_that_is_not_the_committed_one_is_rejected_not_cached_and_voted_invalid(tiny, tmp_path) -> None:
    async def scenario() -> None:
        async with harness(tiny, tmp_path) as h:
            stop, task = await start(h)
            h.tamper["payload"] = corrupt_artifact
            bad = await h.infer()
            assert await h.settled(bad) is Status.INVALID
            record = h.store.get_verdict(bad)
            assert record is not None and not record.valid
            assert 'verinfer_payload_rejected_total' in (await _metrics(h))
            h.tamper["payload"] = None  # the daemon kept running: the next inference is judged normally
            good = await h.infer("Count to three.")
            assert await h.settled(good) is Status.VALID
            assert not task.done()
            await finish(stop, task)

    run(scenario())


def test_a_corrupted_cache_entry_is_detected_and_refetched(tiny, tmp_path) -> None:
    async def scenario() -> None:
        async with harness(tiny, tmp_path) as h:
            iid = await h.infer()
            inf = h.hub.get_inference(iid)
            # what the daemon would have cached for this commitment, corrupted on disk
            committed = h.hub.contract.events.InferenceCommitted().get_logs(from_block=0)[-1]["args"]
            key = keccak256(bytes(committed["artifactRoot"]) + bytes(committed["outputHash"])
                            + bytes(committed["fingerprintHash"]))
            h.store.put_payload(key, b'{"garbage": true}')
            stop, task = await start(h)
            assert await h.settled(iid) is Status.VALID  # refetched from the executer, judged honest
            assert inf.status is Status.COMMITTED
            await finish(stop, task)

    run(scenario())


def test_a_stored_conflicting_record_stops_the_node_instead_of_signing(tiny, tmp_path) -> None:
    async def scenario() -> None:
        async with harness(tiny, tmp_path) as h:
            iid = await h.infer()
            root = "0x" + bytes(h.hub.contract.events.InferenceCommitted().get_logs(from_block=0)[-1]["args"][
                "artifactRoot"]).hex()
            # as if an earlier run had recorded (and maybe signed) the opposite verdict, then crashed
            h.store.record_verdict(VerdictRecord(iid, root, False, 504, "0x" + "00" * 32, 2**40))
            stop, task = await start(h)
            done, _ = await asyncio.wait([task], timeout=60)
            assert done and isinstance(task.exception(), ConflictingVerdict)
            assert h.hub.get_inference(iid).status is Status.COMMITTED  # nothing conflicting was sent
            assert not h.node.healthy
            await finish(stop, task)

    run(scenario())


def test_a_crash_after_recording_resigns_the_same_verdict(tiny, tmp_path) -> None:
    async def scenario() -> None:
        async with harness(tiny, tmp_path) as h:
            iid = await h.infer()
            root = "0x" + bytes(h.hub.contract.events.InferenceCommitted().get_logs(from_block=0)[-1]["args"][
                "artifactRoot"]).hex()
            # recorded before a crash that came before the signature: the restarted node signs that record
            before = VerdictRecord(iid, root, True, 0, "0x" + "11" * 32, 2**40)
            h.store.record_verdict(before)
            stop, task = await start(h)
            assert await h.settled(iid) is Status.VALID
            logs = h.hub.contract.events.VerdictRecorded().get_logs(from_block=0)
            assert [bytes(e["args"]["scoresDigest"]) for e in logs] == [b"\x11" * 32]  # the stored record's
            await finish(stop, task)

    run(scenario())


def test_start_is_refused_on_the_wrong_chain(tiny, tmp_path) -> None:
    async def scenario() -> None:
        async with harness(tiny, tmp_path, chain_id=1) as h:
            with pytest.raises(FatalError, match="chain"):
                h.node.preflight()

    run(scenario())


def test_start_is_refused_while_another_instance_signs_with_the_same_key(tiny, tmp_path) -> None:
    async def scenario() -> None:
        async with harness(tiny, tmp_path) as h:
            stop, task = await start(h)
            iid = await h.infer()
            assert await h.settled(iid) is Status.VALID
            await finish(stop, task)
            other_store_node = h.node
            other_store_node.store.close()
            from node.store.leveldb import Store

            fresh = Store(tmp_path / "other", 31337, h.hub.address)  # a second instance with an empty store
            other_store_node.store = fresh
            with pytest.raises(FatalError, match="another instance"):
                other_store_node.preflight()
            fresh.close()

    run(scenario())


async def _metrics(h) -> str:
    async with h.session.get(f"http://127.0.0.1:{h.node.config.metrics_port}/metrics") as r:
        return await r.text()


def test_keystore_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "k.json"
    address = create_keystore(path, "pw")
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    account = unlock_keystore(path, "pw")
    assert account.address == address
    assert account.key.hex().removeprefix("0x") not in path.read_text()
    with pytest.raises(FatalError):
        unlock_keystore(path, "wrong")
    with pytest.raises(FileExistsError):  # never overwritten
        create_keystore(path, "pw")


def test_the_validator_command_runs_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    from chain.contracts import HubConfig
    from chain.deploy import deploy

    with Anvil() as anvil:
        _, d = deploy(anvil.web3(), dev_account(0), HubConfig(treasury=dev_account(9).address))
        keystore = tmp_path / "v.json"
        write_keystore(keystore, bytes(dev_account(3).key), "pw")
        port = free_port()
        config = tmp_path / "validator.toml"
        config.write_text(f'rpc_url = "{anvil.url}"\nchain_id = 31337\ncontract = "{d.address}"\n'
                          f'data_dir = "{tmp_path / "data"}"\nkeystore = "{keystore}"\nmetrics_port = {port}\n'
                          f'models = ["smollm2-135m-instruct"]\n')
        env = {**os.environ, "VERINFER_KEYSTORE_PASSWORD": "pw"}
        process = subprocess.Popen([sys.executable, "-m", "node.cli", "validator", "run", "--config", str(config)],
                                   env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            health = _wait_health(port, process)
            assert health["healthy"] and health["address"] == dev_account(3).address
        finally:
            process.send_signal(signal.SIGTERM)
            out = process.communicate(timeout=30)[0].decode()
        assert process.returncode == 0, out
        assert dev_account(3).key.hex().removeprefix("0x") not in out  # the key never reaches the logs


def _wait_health(port: int, process: subprocess.Popen) -> dict:
    async def probe() -> dict | None:
        try:
            async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/health") as r:
                return json.loads(await r.text())
        except aiohttp.ClientError:
            return None

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert process.poll() is None, process.stdout.read().decode() if process.stdout else ""
        result = asyncio.run(probe())
        if result is not None:
            return result
        time.sleep(0.5)
    raise AssertionError("validator never answered /health")


def test_an_unhealthy_stream_refuses_to_sign_and_a_missing_contract_refuses_to_start(tiny, tmp_path) -> None:
    async def scenario() -> None:
        async with harness(tiny, tmp_path) as h:
            iid = await h.infer()
            h.node.stream.healthy = False  # as after a deep reorg
            from node.validator.daemon import Job
            from node.validator.verify import ChainFacts

            facts = ChainFacts(iid, 1, h.model_id, 0, 0, 0, 8, b"\x00" * 32, b"\x00" * 32, b"\x00" * 32, b"\x00" * 32)
            record = VerdictRecord(iid, "0x" + "00" * 32, True, 0, "0x" + "00" * 32, 2**40)
            with pytest.raises(FatalError, match="refusing to sign"):
                h.node._sign_verdict(Job(facts, h.operator.address), record)
            assert h.store.get_verdict(iid) is None  # refused before anything was recorded or signed
            h.node.hub = type(h.node.hub)(h.node.hub.w3, "0x" + "42" * 20)  # no code there
            with pytest.raises(FatalError, match="no contract"):
                h.node.preflight()

    run(scenario())


def test_gossip_vote_messages_round_trip_and_malformed_ones_are_rejected() -> None:
    from chain.contracts import Commitment, Vote
    from node.validator.daemon import decode_vote_message, encode_vote_message

    c = Commitment(b"\x01" * 32, b"\x02" * 32, b"\x03" * 32)
    v = Vote(False, 504, b"\x04" * 32, 2**40, b"\x05" * 65)
    assert decode_vote_message(encode_vote_message(9, c, v)) == (9, c, v)
    good = json.loads(encode_vote_message(9, c, v))
    for broken in ({**good, "signature": "0x00"}, {**good, "artifact_root": "0x1234"}, {**good, "valid": "yes"},
                   {k: x for k, x in good.items() if k != "deadline"}):
        with pytest.raises((ValueError, KeyError)):
            decode_vote_message(json.dumps(broken).encode())


def test_a_validator_serves_cached_payloads_to_peers_when_the_executer_is_gone(tiny, tmp_path) -> None:
    from node.p2p.host import P2PHost
    from node.validator.verify import find_payload_mismatch

    async def scenario() -> None:
        async with harness(tiny, tmp_path) as h:
            stop, task = await start(h)
            iid = await h.infer()
            assert await h.settled(iid) is Status.VALID
            async with h.session.get(f"{h.executer_url}/v1/payloads/{iid}") as r:
                original = await r.read()
            h.tamper["payload"] = lambda _: (_ for _ in ()).throw(RuntimeError("executer gone"))  # HTTP now fails
            node = h.node.p2p
            assert node is not None
            addr = node.addrs[0] if "/p2p/" in node.addrs[0] else f"{node.addrs[0]}/p2p/{node.peer_id}"
            with P2PHost(tmp_path / "peer.key") as peer:
                served = await peer.fetch_payload(addr, iid)
            from node.executer.api import InferencePayload

            assert InferencePayload.model_validate_json(served) == InferencePayload.model_validate_json(original)
            committed = dict(h.hub.contract.events.InferenceCommitted().get_logs(from_block=0)[-1]["args"])
            job = h.node._job(iid, committed)
            assert job is not None  # what a peer serves is the committed payload
            assert find_payload_mismatch(InferencePayload.model_validate_json(served), job.facts).name == "OK"
            await finish(stop, task)

    run(scenario())

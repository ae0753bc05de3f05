"""Issue 31, finding 1 in the executer: every payload is on disk (synced) before its commit is sent, and is
served from there after a restart (dense, stock and MoE); a journaled commit whose payload is not on disk is
never re-sent. (The whole story with real processes: tests/e2e/test_executer_restart.py.)"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from chain.contracts import Params
from chain.devnet import Anvil, dev_account
from chain.txmanager import TxFailed, TxManager
from node.executer.bootstrap import ExecuterSettings, load_executer
from node.executer.chain_mode import resume_commits
from node.executer.server import create_app
from node.executer.service import ExecuterService
from node.executer.stock import StockService
from node.moe.serve import MoeOpeningWire, MoeSliceStore, compute_opening
from node.profiles import load_profile
from node.protocol.hashing import keccak256
from node.protocol.moe import ExpertKey
from node.protocol.sampler import SamplingParams
from node.store.leveldb import Store
from tests.chain.conftest import MODEL_ID, Net, build_net
from tests.chain.flows import FEE, USER_SEED
from tests.node.executer.conftest import RunningServer

PARAMS = SamplingParams(0.8, 1.0, 0, 6)
CONTRACT = "0x" + "ab" * 20


class CommitChecks:
    """Stands where the chain gate commits: records whether the payload was on disk at that moment."""

    def __init__(self, store: Store) -> None:
        self.store, self.on_disk = store, []

    def authorize(self, *_: Any) -> bytes:
        return bytes(32)

    def commit(self, served: Any, artifact_root: bytes) -> None:
        self.on_disk.append(self.store.get_served(served.inference_id) is not None)


def test_a_dense_payload_is_on_disk_before_its_commit_and_served_after_a_restart(tiny, tmp_path: Path) -> None:
    _, profile = load_profile(tiny.files.spec)
    store = Store(tmp_path / "executer", 31337, CONTRACT)
    gate = CommitChecks(store)
    service = ExecuterService(tiny.files, tiny.tokenizer, tiny.engine, profile.fingerprint_thresholds(),
                              gate=gate, store=store)  # type: ignore[arg-type]
    served = service.infer(tiny.tokenizer.encode_text("Hello there"), b"\x01" * 32, PARAMS, 5, 77,
                           {"prompt": "Hello there"})
    assert gate.on_disk == [True]
    payload, wire = service.payload_json(77), served.wire
    store.close()

    store = Store(tmp_path / "executer", 31337, CONTRACT)  # the restarted process: nothing in memory
    restarted = ExecuterService(tiny.files, tiny.tokenizer, tiny.engine, profile.fingerprint_thresholds(), store=store)
    with RunningServer(restarted, create_app(restarted, "profile", False)) as server:
        r = httpx.get(f"{server.url}/v1/payloads/77", timeout=30)
        assert r.status_code == 200 and r.content == payload
        r = httpx.get(f"{server.url}/v1/artifacts/0x{served.artifact.root.hex()}", timeout=30)
        assert r.status_code == 200 and r.content == wire
        assert httpx.get(f"{server.url}/v1/payloads/78", timeout=30).status_code == 404
    store.close()


def test_a_stock_payload_is_on_disk_before_its_commit_and_served_after_a_restart(tiny, tmp_path: Path) -> None:
    files = dataclasses.replace(tiny.files, spec=tiny.files.spec.model_copy(update={"sampler": "vllm-seeded"}))
    store = Store(tmp_path / "executer", 31337, CONTRACT)
    gate = CommitChecks(store)

    def generate(*_: Any) -> tuple[int, ...]:
        return (5, 6, 7)

    service = StockService(files, tiny.tokenizer, generate, tiny.engine.info, gate=gate, store=store)  # type: ignore[arg-type]
    service.infer((1, 2, 3), b"\x01" * 32, PARAMS, 5, 78, {"prompt": "Hi"})
    assert gate.on_disk == [True]
    payload = service.payload_json(78)
    store.close()
    store = Store(tmp_path / "executer", 31337, CONTRACT)
    restarted = StockService(files, tiny.tokenizer, generate, tiny.engine.info, store=store)
    assert restarted.payload_json(78) == payload and payload is not None
    store.close()


def test_moe_slices_and_openings_survive_a_restart(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    service, _, _ = load_executer(ExecuterSettings("tiny-moe"))
    assert service.moe is not None
    store = Store(tmp_path / "executer", 31337, CONTRACT)
    service.moe.slices.durable = store
    service.store = store
    prompt = service.tokenizer.encode_chat([{"role": "user", "content": "Name three rivers."}])
    messages = [{"role": "user", "content": "Name three rivers."}]
    service.infer(prompt, b"\x02" * 32, PARAMS, 7, 41, {"messages": messages})
    before = service.moe.slices.get(41)
    assert before is not None
    keys = [ExpertKey(layer, expert) for layer, expert in ((0, 0), (0, 1), (1, 0))]
    slices = [service.moe.slices.encode(41, k) for k in keys]
    store.close()

    store = Store(tmp_path / "executer", 31337, CONTRACT)
    restarted = MoeSliceStore(durable=store)  # a fresh process: memory empty
    after = restarted.get(41)
    assert after is not None and after.commitment.root() == before.commitment.root()
    assert MoeOpeningWire.of(compute_opening(after)) == MoeOpeningWire.of(compute_opening(before))
    assert [restarted.encode(41, k) for k in keys] == slices and all(slices)
    assert restarted.get(42) is None
    store.close()


@pytest.fixture
def chain_net() -> Iterator[Net]:
    with Anvil() as node:
        yield build_net(node.web3(), [dev_account(i) for i in range(7)])


def test_a_journaled_commit_without_its_payload_is_never_re_sent(chain_net: Net, tmp_path: Path) -> None:
    """Two commits journaled, not sent, then a restart: the one whose payload is on disk goes out; the other's
    nonce is filled with a no-op (sending it would only have it judged unavailable)."""
    net = chain_net
    store = Store(tmp_path / "executer", 31337, net.hub.address)
    txm = TxManager(net.w3, net.operator, store)
    ids = []
    for _ in range(2):
        ids.append(net.hub.request_inference(net.requester, net.operator.address, MODEL_ID, keccak256(b"prompt"),
                                             USER_SEED, Params(PARAMS.temperature_bits, PARAMS.top_p_bits, 0, 6),
                                             FEE))
    kept, lost = ids
    store.put_served(kept, b'{"payload": "on disk"}')
    for iid in ids:  # journaled, then the process died before sending
        fn = net.hub.contract.functions.commitInference(iid, b"\x01" * 32, b"\x02" * 32, b"\x03" * 32)
        txm.prepare(fn, purpose=f"commit {iid}")
    restarted = TxManager(net.w3, net.operator, store)
    assert resume_commits(restarted, store) == [lost]
    entries = {e["purpose"]: e for e in store.journal_entries()}
    restarted.confirm(int(entries[f"commit {kept}"]["nonce"]))
    with pytest.raises(TxFailed, match="no-op"):  # its nonce was mined as a no-op, the commit never executed
        restarted.confirm(int(entries[f"commit {lost}"]["nonce"]))
    net.mine(1)
    statuses = {iid: net.hub.get_inference(iid).status.name for iid in ids}
    assert statuses == {kept: "COMMITTED", lost: "REQUESTED"}, statuses
    entries = {e["purpose"]: e for e in store.journal_entries()}
    assert entries[f"commit {lost}"].get("filled") and not entries[f"commit {kept}"].get("filled")
    store.close()

"""The auditor service on a real anvil: a raised rate becomes an on-chain requested audit whose verdict is
submitted, other validators learn it from the events, an unserved requested step is voted LATE and slashed, and a
request the chain refuses stays off-chain."""

import json
import secrets
import threading
import time
from dataclasses import dataclass

from chain.devnet import find_free_port
from chain.txmanager import MemoryJournal, TxManager
from node.protocol.hashing import keccak256
from node.protocol.ledger import TrainingReason
from node.training.auditor import load_tolerance
from node.training.corpus import load_corpus
from node.training.job import JobPlan, get_request_dir, get_response_dir, run_job
from node.training.onchain import ChainAudits, get_training_contract
from node.training.scheduler import CancellableWorker
from node.training.service import REQUEST_GUARD_BLOCKS, AuditorService, WatchedRun
from node.training.spec import RunSpec
from node.training.trajectory import TrajectoryPolicy
from tests.node.training.test_onchain import QUIET, mine

# multiplier 1: the flagged step alone is requested (a higher one adds random extra steps at the lowest rate p = 0.1)
POLICY = TrajectoryPolicy(loss_jump_z=10.0, grad_norm_z=10.0, multiplier=1.0)


def register_unpublished_run(w3, training, prover, tmp_path):
    """Register and anchor window 0 of a run whose prover publishes no ledger (an empty ledger.jsonl): the
    trajectory check cannot reach the anchored head, so it raises the rate and flags the window's last step."""
    out = tmp_path / "prover"
    out.mkdir()
    (out / "ledger.jsonl").write_bytes(b"")
    for _ in range(30):  # a fresh run until window 0's draw picks none of its steps (P = 0.9⁶ = 0.53 each)
        spec = RunSpec(prover=prover.address, audit_rate=QUIET / 10**18, response_deadline_s=0.3, steps=10,
                       anchor_every=5,
                       lsh_nonce=secrets.token_hex(32))
        corpus = load_corpus(spec.corpus_files, spec.seq_len)
        run_id = spec.run_id()
        training.register_run(prover, spec.spec_hash(), bytes.fromhex(spec.lsh_nonce), corpus.data_root,
                              spec.procedure_hash(), 0, spec.audit_rate_wad, spec.anchor_every, 10**18)
        mine(w3, 2)
        training.anchor(prover, run_id, 5, keccak256(b"head-" + run_id))
        mine(w3, 2)
        if not any(training.is_audited(run_id, 0, t) for t in range(6)):
            return spec, out, run_id
    raise AssertionError("no draw-free window in 30 runs")


def make_service(training, validator, tmp_path, name, trajectory, records=None):
    """Return an auditor service whose verdict records (with their submission outcome) go to `records`."""
    return AuditorService(contract=training, validator=validator, tolerance=load_tolerance(), trajectory=trajectory,
                          journal=tmp_path / f"{name}.jsonl", worker=CancellableWorker(1),
                          on_record=None if records is None else records.append,
                          txm=TxManager(training.w3, validator, MemoryJournal()))


def read_journal(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_raised_rate_requests_on_chain_and_an_unserved_step_is_voted_late_and_slashed(net, tmp_path):
    _, w3, training, validators, prover, treasury = net
    spec, out, run_id = register_unpublished_run(w3, training, prover, tmp_path)
    credits = training.credits(treasury.address)
    verdicts = []
    requester = make_service(training, validators[0], tmp_path, "a", POLICY, verdicts)
    other = make_service(training, validators[1], tmp_path, "b", None, verdicts)  # no trajectory: learns the events
    runs = [WatchedRun(out_dir=out, prover=prover.address, spec=spec) for _ in range(2)]
    requester.process_run(runs[0])
    assert runs[0].requested == {5} and runs[0].index_of[5] == 0 and not runs[0].offchain
    sent = [r for r in read_journal(tmp_path / "a.jsonl") if r.get("request") == "onchain"]
    assert [r.get("outcome") for r in sent] == [None, "requested"], "journaled before it was sent"
    assert training.is_audit_due(run_id, 0, 5) and not training.is_audited(run_id, 0, 5)
    assert not get_request_dir(out).exists(), "nothing off-chain"
    other.process_run(runs[1])
    assert runs[1].requested == {5} and runs[1].index_of[5] == 0
    time.sleep(spec.response_deadline_s + 0.1)
    other.process_run(runs[1])
    assert not runs[1].obliged and 5 in runs[1].requested, "not late before the prover's next anchor"
    training.anchor(prover, run_id, 10, keccak256(b"head-10-" + run_id))  # it trains on, and serves nothing
    mine(w3, 2)
    for service, run in zip((requester, other), runs, strict=True):
        service.process_run(run)
        assert run.obliged == {5}
    time.sleep(spec.response_deadline_s + 0.1)
    for service, run in zip((requester, other), runs, strict=True):
        service.collect_responses(run)
    # the run is registered at the protocol's minimum rate (0.1): later windows may hold drawn steps too (the prover
    # serves none of them either); the requested step 5 is the one under test
    assert [r["step"] for path in ("a", "b") for r in read_journal(tmp_path / f"{path}.jsonl")
            if "valid" in r and r["step"] == 5] == [5, 5], "journaled before the vote was signed"
    requested = [v for v in verdicts if v["step"] == 5]
    assert [(v["step"], v["valid"], v["reason"], v["offchain"], v["requested"]) for v in requested] == [
        (5, False, int(TrainingReason.LATE_RESPONSE), False, True)] * 2
    assert [v["submitted"] for v in requested] == ["counted", "settled"]
    record = training.get_run(run_id)
    assert record.slashed and record.bond == 0 and training.audit_result(run_id, 5) == 2
    assert training.credits(treasury.address) == credits + 10**18
    assert all(training.has_voted(run_id, 5, v.address) for v in validators[:2])


def test_a_request_the_chain_refuses_is_logged_and_stays_off_chain(net, tmp_path):
    _, w3, training, validators, prover, _ = net
    spec, out, run_id = register_unpublished_run(w3, training, prover, tmp_path)
    for step in range(training.max_requests()):  # this validator used its own quota of the anchor's requests up
        training.request_audit(validators[0], run_id, 0, step)
    records = []
    service = make_service(training, validators[0], tmp_path, "a", POLICY, records)
    run = WatchedRun(out_dir=out, prover=prover.address, spec=spec)
    service.process_run(run)
    refused = [r for r in read_journal(tmp_path / "a.jsonl") if r.get("request") == "onchain" and "outcome" in r]
    assert [r["outcome"] for r in refused] == ["reverted: RequestsExhausted"]
    assert run.offchain == {5} and (get_request_dir(out) / "00000005.json").exists()
    assert run.requested == set(range(training.max_requests())), "its earlier requests are audited too"
    training.anchor(prover, run_id, 10, keccak256(b"head-10-" + run_id))
    mine(w3, 2)
    service.process_run(run)
    time.sleep(2 * spec.response_deadline_s + 0.1)
    service.collect_responses(run)
    late = {r["step"]: r for r in records}
    assert "submitted" not in late[5] and late[5]["offchain"], "an off-chain verdict is journaled only"
    assert late[0]["submitted"] == "counted" and late[0]["requested"]
    assert not training.get_run(run_id).slashed, "one validator's LATE votes settle nothing"


def test_a_prover_that_never_anchors_again_is_voted_late_before_the_request_window_closes(net, tmp_path):
    _, w3, training, validators, prover, _ = net
    spec, out, run_id = register_unpublished_run(w3, training, prover, tmp_path)
    training.request_audit(validators[2], run_id, 0, 1)
    vote_by = training.verdict_deadline(run_id, 0, 1)
    records = []
    services = [make_service(training, v, tmp_path, str(i), None, records) for i, v in enumerate(validators[:2])]
    runs = [WatchedRun(out_dir=out, prover=prover.address, spec=spec) for _ in services]
    for service, run in zip(services, runs, strict=True):
        service.process_run(run)
    time.sleep(spec.response_deadline_s + 0.1)
    mine(w3, vote_by - REQUEST_GUARD_BLOCKS - 1 - w3.eth.block_number)
    for service, run in zip(services, runs, strict=True):
        service.process_run(run)
    assert records == [], "the stalled prover still has time"
    mine(w3, 1)
    for service, run in zip(services, runs, strict=True):
        service.process_run(run)
    assert [(r["step"], r["reason"], r["submitted"]) for r in records] == [
        (1, int(TrainingReason.LATE_RESPONSE), "counted"), (1, int(TrainingReason.LATE_RESPONSE), "settled")]
    assert w3.eth.block_number <= vote_by and training.get_run(run_id).slashed


@dataclass(frozen=True)
class RequestingAudits:
    """The prover's ChainAudits, with a validator requesting the audit of `step` as soon as window 0's draw is
    ready (what an auditor whose trajectory check raised the rate does; here without the race against the job)."""

    inner: ChainAudits
    validator_key: bytes
    step: int

    def get_beacon(self, index: int) -> bytes:
        """Return the chain's beacon of a window."""
        return self.inner.get_beacon(index)

    def on_anchor(self, first_step: int, last_step: int, head: bytes) -> list[int]:
        """Anchor on chain; after window 0, request the step's audit."""
        from eth_account import Account

        steps = self.inner.on_anchor(first_step, last_step, head)
        if first_step == 0:  # `step`, or the first undrawn step after it (the lowest rate may draw a few)
            contract = get_training_contract(self.inner.rpc_url, self.inner.contract)
            step = next(t for t in range(self.step, last_step + 1) if t not in steps)
            contract.request_audit(Account.from_key(self.validator_key), self.inner.run_id, 0, step)
        return steps


def test_the_prover_serves_a_requested_step_and_its_valid_verdict_settles_on_chain(net, tmp_path):
    node, w3, training, validators, prover, _ = net
    spec = RunSpec(prover=prover.address, steps=10, anchor_every=5, keep_checkpoints=10,
                   lsh_nonce=secrets.token_hex(32), audit_rate=QUIET / 10**18)
    corpus = load_corpus(spec.corpus_files, spec.seq_len)
    run_id, out = spec.run_id(), tmp_path / "prover"
    training.register_run(prover, spec.spec_hash(), bytes.fromhex(spec.lsh_nonce), corpus.data_root,
                          spec.procedure_hash(), 0, spec.audit_rate_wad, spec.anchor_every, 10**18)
    audits = RequestingAudits(ChainAudits(rpc_url=node.url, contract=training.address, prover_key=bytes(prover.key),
                                          run_id=run_id, final_step=spec.steps, anchor_every=spec.anchor_every,
                                          draw_timeout_s=30.0), bytes(validators[0].key), 2)
    stop = threading.Event()
    miner = threading.Thread(target=lambda: [mine(w3, 1) for _ in iter(lambda: stop.wait(0.5), True)])
    miner.start()  # the prover waits for blocks (beacons, draws): a block every 0.5 s
    try:
        run_job(JobPlan(spec=spec, out_dir=out, prover_key=bytes(prover.key), audits=audits, port=find_free_port()))
    finally:
        stop.set()
        miner.join()
    [request] = training.get_audit_requests(run_id, 0)
    asked = request.step
    drawn = [t for i, window in ((0, range(0, 6)), (1, range(6, 11))) for t in window
             if training.is_audited(run_id, i, t)]
    assert (get_response_dir(out, asked) / "state_prev.npy").exists(), "served at the next anchor"
    announced = [json.loads(line)["step"] for line in (out / "announced.jsonl").read_text().splitlines()]
    assert sorted(announced) == sorted([*drawn, asked]) and announced.index(asked) >= len(
        [t for t in drawn if t <= 5]), "the requested step is served with window 1's draw"
    records = []
    for validator in validators[1:]:  # neither requested it: both learn it from the events
        service = make_service(training, validator, tmp_path, validator.address[:8], None, records)
        run = WatchedRun(out_dir=out, prover=prover.address, spec=spec)
        deadline = time.monotonic() + 120
        try:
            while not run.closed and time.monotonic() < deadline:
                service.process_run(run)
                service.dispatch([run])
                service.collect_result([run], timeout_s=0.3)
        finally:
            service.worker.close()
        assert run.closed
    assert [(r["step"], r["valid"], r["requested"], r["submitted"]) for r in records if r["step"] == asked] == [
        (asked, True, True, "counted"), (asked, True, True, "settled")], records
    assert all(r["valid"] for r in records) and {r["step"] for r in records} == {*drawn, asked}, records
    assert training.audit_result(run_id, asked) == 1 and not training.get_run(run_id).slashed

"""The auditor as a node role (`verinfer training audit`): watch anchors on chain, audit drawn steps, vote.

For each run it audits, the auditor knows the declaration (spec.json) and where the prover publishes
its ledger and serves responses. It checks the run's on-chain record against the declaration (data
root, procedure hash, prover), then per anchor whose draw is ready: the window's beacon (stored on
chain with the anchor: the named positions I(t) derive from it), the published ledger against the
anchored head, the trajectory of the ledger's optional values, and the drawn steps.

Scheduling never abandons a drawn audit (issue 30): the earlier policy — a newer drawn audit within k steps
interrupts an older one — was public, so after each draw the prover knew which drawn steps every auditor would
drop and could cheat exactly there. Every drawn or requested step is now audited to its verdict, oldest first;
the cost is the auditor's throughput (≥ p × recompute ÷ step of the prover's pace, else it falls behind the
verdict window), where the interrupting policy bounded its work. Responses
are stamped with the auditor's clock when first seen complete; a drawn step without a response by the
deadline is voted LATE_RESPONSE. Every verdict is journaled before it is signed and submitted, as this
validator's own vote (`submitVotes`); the contract settles on a supermajority of validators.

Trajectory checks (node.training.trajectory) never vote: when they raise the run's audit rate, the
auditor picks extra steps of the window with its own randomness and requests them on chain
(`requestAudit`, journaled before it is sent, through the TxManager): a requested step is then due like a
drawn one, the prover reads it from the chain's AuditRequested events and serves it at its next anchor, and
every validator — the requester and the others, who learn it from the same events — audits it and submits
its vote (LATE_RESPONSE when nothing is served). A request the chain refuses (the per-anchor cap reached, the
next window already anchored, the run finished) stays off-chain as before (`requests/<step>.json` beside the
responses): its verdict is journaled (`offchain: true`), not submitted.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import secrets
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from eth_account import Account
from eth_account.signers.local import LocalAccount

from chain.errors import ChainError, ContractReverted
from chain.training import TrainingContract, translate_training_error
from chain.txmanager import TxManager
from node.errors import RecoverableError
from node.protocol.ledger import InvalidTraining, LedgerEntry, TrainingReason
from node.store.leveldb import ConflictingVerdict, Store
from node.training.auditor import (
    AuditContext,
    AuditResponse,
    AuditTolerance,
    AuditVerdict,
    get_response_files,
    is_response_complete,
    load_response,
    process_served_audit,
    read_published_ledger,
)
from node.training.corpus import load_corpus
from node.training.job import get_request_dir, get_response_dir
from node.training.model import get_declared_schedule
from node.training.onchain import get_audited_steps, get_training_contract, submit_audit_vote
from node.training.scheduler import AuditSchedule, CancellableWorker
from node.training.spec import RunSpec, get_shape_name
from node.training.trajectory import (
    TrajectoryDecision,
    TrajectoryPolicy,
    compute_extra_audit_probability,
    compute_raised_rate,
    compute_trajectory_measurement,
    decide_trajectory,
    verify_declared_schedule,
)

log = logging.getLogger(__name__)
ZERO_ADDRESS = "0x0000000000000000000000000000000000000000"
# a requested step not served when its verdict window has this many blocks left is voted LATE (its prover never
# anchored the next window): later, the votes might not be mined inside the window and the prover would escape
REQUEST_GUARD_BLOCKS = 5


@dataclass(frozen=True)
class SeenResponse:
    """A served response as the auditor first saw it complete: where its files are kept, and when."""

    folder: Path
    arrived_at: float


def keep_response(served: Path, spool: Path | None, step: int) -> Path:
    """Return the folder the auditor audits a response from: with a spool, its own copy of the files taken on
    first sight (a hard link where the filesystem allows — the prover replaces files atomically, so a link keeps
    the bytes first seen — else a copy); without one, the prover's folder itself. In a real deployment this is
    the auditor's download of the response."""
    if spool is None:
        return served
    shutil.rmtree(spool, ignore_errors=True)
    spool.mkdir(parents=True)
    for path in get_response_files(served, step):
        try:
            os.link(path, spool / path.name)
        except OSError:
            shutil.copyfile(path, spool / path.name)
    return spool


@dataclass
class WatchedRun:
    """One run the auditor follows: anchors read, beacons, the schedule of its audits, responses seen."""

    out_dir: Path
    prover: str
    spec: RunSpec
    k: int = 1
    anchors_read: int = 0
    beacons: list[bytes] = field(default_factory=list)
    schedule: AuditSchedule = field(default_factory=lambda: AuditSchedule(k=1))
    index_of: dict[int, int] = field(default_factory=dict)  # drawn step → anchor index
    drawn_at: dict[int, float] = field(default_factory=dict)  # step → when this auditor saw it drawn/requested
    responses: dict[int, SeenResponse] = field(default_factory=dict)  # stamped on first sight
    offchain: set[int] = field(default_factory=set)
    requested: set[int] = field(default_factory=set)  # requested on chain (by any validator), not yet voted on
    requests_known: set[int] = field(default_factory=set)  # every step ever learnt as requested on chain
    requests_from: int = 0  # the block this auditor reads AuditRequested events from
    obliged: set[int] = field(default_factory=set)  # requested steps the prover must have served (next anchor read)
    vote_by: dict[int, int] = field(default_factory=dict)  # requested step → the last block its votes settle in
    multiplier: float = 1.0
    closed: bool = False

    def __post_init__(self) -> None:
        # k (the measured recompute ÷ step) no longer abandons anything: an interruption rule every auditor follows
        # on public draws tells the prover which drawn audits nobody completes (issue 30, finding 8)
        self.schedule = AuditSchedule(k=0)

    @property
    def run_id(self) -> bytes:
        """Return the run id (prover and spec hash)."""
        return self.spec.run_id()


def verify_anchor_head(entries: list[LedgerEntry], last_step: int, head: bytes) -> None:
    """Raise unless the published ledger's head at last_step is the anchored one."""
    if last_step >= len(entries) or entries[last_step].head != head:
        raise InvalidTraining("published ledger does not reach the anchored head", TrainingReason.LEDGER_NOT_CHAINED,
                              last_step)


def wait_for_response(folder: Path, step: int, deadline: float, poll_s: float = 0.2) -> AuditResponse | None:
    """Return the served response once complete, stamped with our clock (never the prover's file times), or None
    at the deadline."""
    while True:
        response = load_response(folder, step)
        if response is not None:
            return dataclasses.replace(response, arrived_at=time.time())
        if time.time() > deadline:
            return None
        time.sleep(poll_s)


def is_declared_on_chain(run: WatchedRun, data_root: bytes, procedure_hash: bytes, prover: str,
                         audit_rate_wad: int, anchor_every: int) -> bool:
    """Check whether the on-chain run has the declaration's data root, procedure hash, prover, audit rate and m (a
    prover registering its own run at a rate below its spec's would be drawn less: issue 30, finding 3)."""
    corpus = load_corpus(run.spec.corpus_files, run.spec.seq_len)
    return (data_root == corpus.data_root and procedure_hash == run.spec.procedure_hash()
            and prover.lower() == run.prover.lower() == run.spec.prover and audit_rate_wad == run.spec.audit_rate_wad
            and anchor_every == run.spec.anchor_every)


@dataclass
class AuditorService:
    """The auditor's loop over its runs: one recomputation at a time in a killable child process."""

    contract: TrainingContract
    validator: LocalAccount
    tolerance: AuditTolerance
    trajectory: TrajectoryPolicy | None
    journal: Path
    worker: CancellableWorker
    on_record: Callable[[dict[str, Any]], None] | None = None
    running: tuple[WatchedRun, int] | None = None
    store: Store | None = None  # slashing protection: a decision is recorded (synced) before its vote is signed
    spool: Path | None = None  # where this auditor keeps the responses it saw (None: read the prover's folder)
    recompute_lock: Path | None = None  # a lock file shared by auditors on one machine (devnet): one recompute
    shape_tolerances: dict[str, AuditTolerance] = field(default_factory=dict)  # a shape's own calibration
    txm: TxManager | None = None  # sends requestAudit journaled; None: extra audits are requested off-chain only

    def get_tolerance(self, spec: RunSpec) -> AuditTolerance:
        """Return the tolerance for a run: its shape's own calibration if there is one, else the default."""
        return self.shape_tolerances.get(get_shape_name(spec.shape), self.tolerance)

    def get_spool(self, run: WatchedRun, step: int) -> Path | None:
        """Return this auditor's folder for a step's kept response (None without a spool)."""
        return None if self.spool is None else self.spool / run.run_id.hex()[:16] / f"{step:08d}"

    def process_run(self, run: WatchedRun) -> None:
        """Read new anchors of a run whose draw is ready, schedule their audits, stamp responses, vote late ones."""
        record = self.contract.get_run(run.run_id)
        if record.prover == ZERO_ADDRESS:
            return
        if not is_declared_on_chain(run, record.data_root, record.procedure_hash, record.prover, record.audit_rate_wad,
                                    record.anchor_every):
            log.error("run %s on chain does not match its declaration: not audited", run.run_id.hex()[:10])
            run.closed = True
            return
        if record.slashed:  # its bond is gone: nothing left to settle
            if self.is_running(run):
                self.worker.cancel()
                self.running = None
            run.closed = True
            return
        if run.requests_from == 0:  # no request predates the run's registration
            run.requests_from = record.registered_block
        while run.anchors_read < record.anchors:
            anchor = self.contract.get_anchor(run.run_id, run.anchors_read)
            if self.contract.w3.eth.block_number < anchor.block_number + 2:
                break
            self.on_anchor(run, run.anchors_read, anchor.first_step, anchor.last_step, anchor.head, anchor.beacon,
                           newest=run.anchors_read + 1 == record.anchors)
            run.anchors_read += 1
        self.process_audit_requests(run)
        self.collect_responses(run)
        ended = record.finished_block or record.slashed
        if ended and run.anchors_read == record.anchors and not self.get_waiting(run) and not self.is_running(run):
            run.closed = True

    def on_anchor(self, run: WatchedRun, index: int, first_step: int, last_step: int, head: bytes,
                  beacon: bytes, newest: bool = False) -> None:
        """Take one anchored window: its beacon, its draws (interrupting older audits), trajectory, extra audits."""
        run.beacons.append(beacon)
        steps = get_audited_steps(self.contract, run.run_id, index)
        now = time.time()
        for t in run.requested:  # the previous window's requests: the prover serves them now, as this draw's
            if run.index_of[t] == index - 1:
                self.on_obliged(run, t, now)
        for t in steps:
            run.index_of[t], run.drawn_at[t] = index, now
        for t in run.schedule.on_draw(last_step, steps):
            self.on_interrupted(run, t)
        self.process_trajectory(run, index, range(first_step, last_step + 1), head, steps, newest)

    def process_trajectory(self, run: WatchedRun, index: int, window: range, head: bytes, drawn: list[int],
                           newest: bool = False) -> None:
        """Score the published ledger up to the anchor; when the rate is raised, request extra steps — on chain
        while this is the run's newest anchor, else (or when the chain refuses) off-chain."""
        if self.trajectory is None:
            return
        try:
            entries = read_published_ledger(run.out_dir / "ledger.jsonl", run.run_id, run.prover)
            verify_anchor_head(entries, window[-1], head)
            entries = entries[:window[-1] + 1]
            verify_declared_schedule(entries, get_declared_schedule(run.spec))
            decision = decide_trajectory(compute_trajectory_measurement(entries), self.trajectory)
        except InvalidTraining as e:  # the lr is declared: a mismatch raises the rate (and names its step)
            log.warning("run %s trajectory: %s", run.run_id.hex()[:10], e)
            decision = TrajectoryDecision(multiplier=self.trajectory.multiplier,
                                          flagged_steps=(e.step,) if e.step is not None else ())
        run.multiplier = max(run.multiplier, decision.multiplier)
        p = run.spec.audit_rate
        extra_p = compute_extra_audit_probability(p, compute_raised_rate(p, dataclasses.replace(
            decision, multiplier=run.multiplier)))
        chosen = [t for t in window if t not in drawn
                  and (t in decision.flagged_steps or secrets.randbelow(10**6) < extra_p * 10**6)]
        chosen.sort(key=lambda t: (t not in decision.flagged_steps, t))  # flagged first: the chain caps requests
        onchain = [t for t in chosen if newest and self.request_onchain(run, index, t)]
        offchain = [t for t in chosen if t not in onchain]
        for t in offchain:
            self.request_offchain(run, t)
        if decision.multiplier > 1.0:
            self.write_journal({"run": run.run_id.hex(), "trajectory": True, "anchor": index,
                                "multiplier": run.multiplier, "flagged": list(decision.flagged_steps),
                                "onchain_requested": onchain, "offchain_requested": offchain, "at": time.time()})

    def request_onchain(self, run: WatchedRun, index: int, step: int) -> bool:
        """Request the audit of an undrawn step on chain (journaled, then sent and confirmed through the TxManager);
        return whether the chain took it. A refusal (cap reached, past the horizon, already due) or a failed
        transaction is journaled and logged: the caller requests the step off-chain instead."""
        if self.txm is None:
            return False
        record: dict[str, Any] = {"run": run.run_id.hex(), "anchor": index, "step": step, "request": "onchain",
                                  "validator": self.validator.address, "at": time.time()}
        self.write_journal(record)  # journaled before it is signed and sent
        try:
            fn = self.contract.request_audit_call(run.run_id, index, step)
            entry = self.txm.send(fn, purpose=f"requestAudit {run.run_id.hex()[:10]} step {step}")
            receipt = self.txm.confirm(int(entry["nonce"]))
        except (ChainError, RecoverableError) as e:
            error = translate_training_error(e)
            outcome = f"reverted: {error.error}" if isinstance(error, ContractReverted) else f"failed: {error}"
            self.write_journal({**record, "outcome": outcome, "at": time.time()})
            log.warning("run %s step %d: on-chain audit request not taken (%s); requested off-chain",
                        run.run_id.hex()[:10], step, outcome)
            return False
        self.write_journal({**record, "outcome": "requested", "gas": int(receipt["gasUsed"]),
                            "block": int(receipt["blockNumber"]), "at": time.time()})
        self.on_requested(run, index, step)
        return True

    def process_audit_requests(self, run: WatchedRun) -> None:
        """Learn the audits any validator requested on chain (AuditRequested events) of anchors read already."""
        latest = int(self.contract.w3.eth.block_number)
        if latest < run.requests_from:
            return
        held: list[int] = []
        for request in self.contract.get_audit_requests(run.run_id, run.requests_from, latest):
            if request.index >= run.anchors_read:  # its anchor is not read yet: read the event again later
                held.append(request.block_number)
            else:
                self.on_requested(run, request.index, request.step)
        run.requests_from = min(held) if held else latest + 1

    def on_requested(self, run: WatchedRun, index: int, step: int) -> None:
        """Take a step requested on chain: it is due like a drawn one, and this validator votes on it."""
        if step in run.requests_known:
            return
        run.requests_known.add(step)
        run.requested.add(step)
        run.offchain.discard(step)  # another validator's request made it an on-chain audit
        run.index_of[step] = index
        run.drawn_at[step] = time.time()
        run.vote_by[step] = self.contract.verdict_deadline(run.run_id, index, step)
        if run.anchors_read > index + 1:  # the next window is anchored already: the prover serves it now
            self.on_obliged(run, step, time.time())

    @staticmethod
    def on_obliged(run: WatchedRun, step: int, now: float) -> None:
        """Start a requested step's response deadline: the prover serves a window's requests once it anchored the
        next window and its draw is ready (ChainAudits.on_anchor) — when this auditor reads that anchor."""
        run.obliged.add(step)
        run.drawn_at[step] = max(run.drawn_at[step], now)

    def request_offchain(self, run: WatchedRun, step: int) -> None:
        """Ask the prover for an extra audit response of a step the chain did not draw."""
        folder = get_request_dir(run.out_dir)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{step:08d}.json").write_text(json.dumps({"step": step, "at": time.time()}))
        run.offchain.add(step)
        run.drawn_at[step] = time.time()

    def on_interrupted(self, run: WatchedRun, step: int) -> None:
        """Abandon an audit the schedule interrupted (kill it if it is running): no vote."""
        if self.running is not None and self.running[0] is run and self.running[1] == step:
            self.worker.cancel()
            self.running = None
        self.write_journal({"run": run.run_id.hex(), "step": step, "interrupted": True, "at": time.time()})

    def get_waiting(self, run: WatchedRun) -> list[int]:
        """Return the steps still to audit: live drawn ones, then requested and off-chain extras, oldest first."""
        live = [t for t in run.schedule.get_pending() if not self.is_running(run, t)]
        extra = [t for t in sorted(run.requested | run.offchain) if not self.is_running(run, t) and t not in live]
        return live + extra

    def is_running(self, run: WatchedRun, step: int | None = None) -> bool:
        """Check whether the worker runs an audit of this run (of this step)."""
        return self.running is not None and self.running[0] is run and (step is None or self.running[1] == step)

    def collect_responses(self, run: WatchedRun) -> None:
        """Stamp responses that became complete; vote LATE on drawn steps past their deadline."""
        for t in self.get_waiting(run):
            if t in run.responses:
                continue
            served = get_response_dir(run.out_dir, t)
            if is_response_complete(served, t):  # the files are read (and checked) by the audit's child process
                arrived = time.time()
                try:
                    folder = keep_response(served, self.get_spool(run, t), t)
                except OSError as e:  # vanished between the check and the link: seen again next round
                    log.warning("response of step %d not kept: %s", t, e)
                    continue
                run.responses[t] = SeenResponse(folder, arrived)
            elif self.is_late(run, t):
                self.on_verdict(run, t, AuditVerdict(t, False, TrainingReason.LATE_RESPONSE,
                                                     "no response before the deadline"))

    def is_late(self, run: WatchedRun, step: int) -> bool:
        """Check whether an unserved step is past its deadline: a drawn one response_deadline_s after its draw was
        seen; a requested one response_deadline_s after the next window's anchor was read (when the prover serves
        it), or when its on-chain verdict window is about to close (the prover never anchored the next window);
        an off-chain one twice the deadline after it was asked (it is served at the next anchor)."""
        deadline = run.spec.response_deadline_s
        if step in run.requested:
            if step in run.obliged:
                return time.time() > run.drawn_at[step] + deadline
            return int(self.contract.w3.eth.block_number) >= run.vote_by[step] - REQUEST_GUARD_BLOCKS
        return time.time() > run.drawn_at[step] + deadline * (2 if step in run.offchain else 1)

    def dispatch(self, runs: list[WatchedRun]) -> None:
        """Start the oldest waiting audit whose response arrived, if the worker is free."""
        if self.running is not None:
            return
        for run in runs:
            for t in self.get_waiting(run):
                if t not in run.responses:
                    continue
                try:
                    ctx = self.get_context(run, t)
                except InvalidTraining as e:
                    self.on_verdict(run, t, AuditVerdict(t, False, e.training_reason, str(e)))
                    return
                seen = run.responses[t]
                self.worker.submit(f"{run.run_id.hex()[:10]}:{t}", process_served_audit, ctx, seen.folder, t,
                                   seen.arrived_at, run.drawn_at[t], self.recompute_lock)
                self.running = (run, t)
                return

    def get_context(self, run: WatchedRun, step: int) -> AuditContext:
        """Return the audit context: the published ledger (checked up to the anchored head) and the beacons."""
        entries = read_published_ledger(run.out_dir / "ledger.jsonl", run.run_id, run.prover)
        if step in run.index_of:
            anchor = self.contract.get_anchor(run.run_id, run.index_of[step])
            verify_anchor_head(entries, anchor.last_step, anchor.head)
        return AuditContext(spec=run.spec, corpus=load_corpus(run.spec.corpus_files, run.spec.seq_len),
                            beacons=tuple(run.beacons), entries=tuple(entries), tolerance=self.get_tolerance(run.spec))

    def collect_result(self, runs: list[WatchedRun], timeout_s: float) -> None:
        """Take the worker's verdict when it is done."""
        if self.running is None:
            time.sleep(timeout_s)  # nothing to wait for but the chain and the prover
            return
        result = self.worker.poll(timeout_s)
        if result is None:
            return
        run, step = self.running
        self.running = None
        _, status, value = result
        if status != "ok":
            log.error("audit of step %d failed in the worker: %s (left for a retry)", step, value)
            run.responses.pop(step, None)
            return
        verdict: AuditVerdict = value
        self.on_verdict(run, step, AuditVerdict(step, verdict.valid, verdict.reason, verdict.detail,
                                                verdict.measurement))

    def on_verdict(self, run: WatchedRun, step: int, verdict: AuditVerdict) -> None:
        """Journal a verdict, then (drawn and on-chain requested steps) sign and submit this validator's vote."""
        offchain = step in run.offchain and step not in run.index_of
        seen = run.responses.pop(step, None)
        if seen is not None and self.spool is not None:  # the checkpoints are not kept past the verdict
            shutil.rmtree(seen.folder, ignore_errors=True)
        if not offchain:
            run.schedule.on_finished(step)
        run.offchain.discard(step)
        run.requested.discard(step)
        run.obliged.discard(step)
        record: dict[str, Any] = {
            "run": run.run_id.hex(), "anchor": run.index_of.get(step), "step": step, "valid": verdict.valid,
            "reason": int(verdict.reason), "reason_name": verdict.reason.name, "detail": verdict.detail,
            "measurement": asdict(verdict.measurement) if verdict.measurement else None, "offchain": offchain,
            "requested": step in run.requests_known,
            "validator": self.validator.address, "at": time.time()}
        self.write_journal(record)  # journaled before it is signed and sent
        if not offchain:
            try:
                record["submitted"] = submit_audit_vote(self.contract, self.validator, run.run_id,
                                                        run.index_of[step], step, verdict.valid, int(verdict.reason),
                                                        self.store)
            except ConflictingVerdict as e:  # decided otherwise before (a restart): never sign the second decision
                log.error("refusing to vote on step %d: %s", step, e)
                record["submitted"] = "refused: decided otherwise before"
            except ContractReverted as e:  # e.g. past the verdict window: journaled, the loop goes on
                record["submitted"] = f"reverted: {e.error}"
            except RecoverableError as e:
                record["submitted"] = f"failed: {e}"
        if self.on_record is not None:
            self.on_record(record)
        log.info("run %s step %d%s: %s (%s) %s", run.run_id.hex()[:10], step, " (off-chain)" if offchain else "",
                 "valid" if verdict.valid else "INVALID", verdict.detail, record.get("submitted", ""))

    def write_journal(self, record: dict[str, Any]) -> None:
        """Append one record to the journal."""
        with self.journal.open("a") as f:
            f.write(json.dumps(record, default=float) + "\n")


def run_auditor(runs: list[WatchedRun], *, rpc_url: str, contract_address: str, validator_key: bytes,
                tolerance: AuditTolerance, trajectory: TrajectoryPolicy | None, journal: Path, timeout_s: float,
                threads: int = 1, spool: Path | None = None, recompute_lock: Path | None = None,
                shape_tolerances: dict[str, AuditTolerance] | None = None) -> None:
    """Follow runs until each is finished and all its drawn audits are voted (or the timeout passes)."""
    contract = get_training_contract(rpc_url, contract_address)
    store = Store(journal.parent / f"{journal.stem}.protection", int(contract.w3.eth.chain_id), contract.address)
    validator = Account.from_key(validator_key)
    service = AuditorService(contract=contract, validator=validator, tolerance=tolerance,
                             trajectory=trajectory, journal=journal, worker=CancellableWorker(threads), store=store,
                             spool=spool, recompute_lock=recompute_lock, shape_tolerances=shape_tolerances or {},
                             txm=TxManager(contract.w3, validator, store, confirmations=1))
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            pending = [r for r in runs if not r.closed]
            if not pending:
                break
            for run in pending:
                service.process_run(run)
            service.dispatch(pending)
            service.collect_result(pending, timeout_s=0.3)
    finally:
        service.worker.close()
        store.close()
    if any(not r.closed for r in runs):
        log.warning("auditor stopped with %d runs unfinished", sum(not r.closed for r in runs))

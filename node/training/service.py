"""The auditor as a node role (`verinfer training audit`): watch anchors on chain, audit the drawn steps, vote.

For each run it audits, the auditor knows the declaration (spec.json), the verifier beacon it issued,
and where the prover publishes its ledger and serves responses. It checks the run's on-chain record
against the declaration (data root, procedure hash), the published ledger against the anchored head,
then each drawn step as `node.training.auditor` does; it writes the verdict to its journal before it
signs and submits. A newer audit interrupts a running recomputation only in the sense of the maths
(q = p(1 − p)^k): this auditor finishes every audit, and the policy is reported with the measured k.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from eth_account import Account

from node.protocol.ledger import InvalidTraining, LedgerEntry, TrainingReason
from node.training.auditor import (
    AuditContext,
    AuditResponse,
    AuditTolerance,
    AuditVerdict,
    load_response,
    process_audit,
    read_published_ledger,
)
from node.training.corpus import load_corpus
from node.training.job import get_response_dir
from node.training.onchain import get_audited_steps, get_training_contract, submit_audit_verdict
from node.training.spec import RunSpec

log = logging.getLogger(__name__)


@dataclass
class WatchedRun:
    """One run the auditor follows, and the anchors it has finished."""

    out_dir: Path
    prover: str
    spec: RunSpec
    done_anchors: set[int] = field(default_factory=set)

    @property
    def run_id(self) -> bytes:
        """Return the run id (its spec hash)."""
        return self.spec.spec_hash()


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


def audit_anchor(run: WatchedRun, index: int, *, rpc_url: str, contract_address: str, validator_key: bytes,
                 beacon: bytes, tolerance: AuditTolerance, journal: Path,
                 on_verdict: Callable[[dict[str, object]], None] | None = None) -> list[AuditVerdict]:
    """Audit every drawn step of one anchor and submit the verdicts; return them."""
    contract = get_training_contract(rpc_url, contract_address)
    validator = Account.from_key(validator_key)
    anchor = contract.get_anchor(run.run_id, index)
    drawn_at = time.time()
    steps = get_audited_steps(contract, run.run_id, index)
    verdicts = []
    for step in steps:
        try:
            entries = read_published_ledger(run.out_dir / "ledger.jsonl", run.run_id, run.prover)
            verify_anchor_head(entries, anchor.last_step, anchor.head)
            ctx = AuditContext(spec=run.spec, corpus=load_corpus(run.spec.corpus_files, run.spec.seq_len),
                               beacon=beacon, entries=tuple(entries), tolerance=tolerance)
            response = wait_for_response(get_response_dir(run.out_dir, step), step,
                                         drawn_at + run.spec.response_deadline_s)
            verdict = process_audit(ctx, response, drawn_at)
        except InvalidTraining as e:
            verdict = AuditVerdict(step, False, e.training_reason, str(e))
        verdict = AuditVerdict(step, verdict.valid, verdict.reason, verdict.detail, verdict.measurement)
        record = {"run": run.run_id.hex(), "anchor": index, "step": step, "valid": verdict.valid,
                  "reason": int(verdict.reason), "reason_name": verdict.reason.name, "detail": verdict.detail,
                  "measurement": asdict(verdict.measurement) if verdict.measurement else None, "at": time.time()}
        with journal.open("a") as f:  # journaled before it is signed and sent
            f.write(json.dumps(record, default=float) + "\n")
        submitted = submit_audit_verdict(contract, validator, run.run_id, index, step, verdict.valid,
                                         int(verdict.reason))
        record["submitted"] = submitted
        if on_verdict is not None:
            on_verdict(record)
        log.info("run %s step %d: %s (%s)", run.run_id.hex()[:10], step, "valid" if verdict.valid else "INVALID",
                 verdict.detail)
        verdicts.append(verdict)
    return verdicts


def is_declared_on_chain(run: WatchedRun, data_root: bytes, procedure_hash: bytes, prover: str) -> bool:
    """Check whether the on-chain run has the declaration's data root, procedure hash and prover."""
    corpus = load_corpus(run.spec.corpus_files, run.spec.seq_len)
    return (data_root == corpus.data_root and procedure_hash == run.spec.procedure_hash()
            and prover.lower() == run.prover.lower())


def run_auditor(runs: list[WatchedRun], *, rpc_url: str, contract_address: str, validator_key: bytes,
                beacons: dict[bytes, bytes], tolerance: AuditTolerance, journal: Path, timeout_s: float) -> None:
    """Follow runs until each is finished and all its anchors are audited (or the timeout passes)."""
    contract = get_training_contract(rpc_url, contract_address)
    deadline = time.monotonic() + timeout_s
    pending = list(runs)
    while pending and time.monotonic() < deadline:
        for run in list(pending):
            record = contract.get_run(run.run_id)
            if record.prover == "0x0000000000000000000000000000000000000000":
                continue
            if not is_declared_on_chain(run, record.data_root, record.procedure_hash, record.prover):
                log.error("run %s on chain does not match its declaration: not audited", run.run_id.hex()[:10])
                pending.remove(run)
                continue
            for index in range(record.anchors):
                if index in run.done_anchors:
                    continue
                a = contract.get_anchor(run.run_id, index)
                if contract.w3.eth.block_number < a.block_number + 2:
                    continue
                audit_anchor(run, index, rpc_url=rpc_url, contract_address=contract_address,
                             validator_key=validator_key, beacon=beacons[run.run_id], tolerance=tolerance,
                             journal=journal)
                run.done_anchors.add(index)
            if (record.finished_block or record.slashed) and len(run.done_anchors) == record.anchors:
                pending.remove(run)
        time.sleep(0.5)
    if pending:
        log.warning("auditor stopped with %d runs unfinished", len(pending))

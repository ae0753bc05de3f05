"""The prover's and the auditor's chain side: anchoring heads, reading audit draws, submitting verdicts."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_utils.crypto import keccak
from web3 import Web3
from web3.logs import DISCARD

from chain.errors import ChainError, ContractReverted
from chain.training import AuditVote, TrainingContract, sign_audit_verdict
from node.errors import Reason, RecoverableError
from node.store.leveldb import Store, VerdictRecord
from node.training.job import RunStopped

log = logging.getLogger(__name__)


def get_training_contract(rpc_url: str, address: str) -> TrainingContract:
    """Return a client of the Training contract over HTTP."""
    return TrainingContract(Web3(Web3.HTTPProvider(rpc_url, request_kwargs={"timeout": 30})), address)


def wait_for_block(contract: TrainingContract, number: int, timeout_s: float) -> None:
    """Wait until the chain has mined block `number`."""
    deadline = time.monotonic() + timeout_s
    while contract.w3.eth.block_number < number:
        if time.monotonic() > deadline:
            raise RecoverableError(f"block {number} not mined within {timeout_s} s", Reason.CHAIN_UNAVAILABLE)
        time.sleep(0.2)


def get_audited_steps(contract: TrainingContract, run_id: bytes, index: int) -> list[int]:
    """Return the audited steps of an anchored window (the draw must be ready)."""
    a = contract.get_anchor(run_id, index)
    return [t for t in range(a.first_step, a.last_step + 1) if contract.is_audited(run_id, index, t)]


def get_requested_steps(contract: TrainingContract, run_id: bytes, index: int) -> list[int]:
    """Return the steps of anchor `index`'s window whose audit a validator requested on chain (AuditRequested)."""
    if index < 0:
        return []
    since = contract.get_anchor(run_id, index).block_number
    return sorted({r.step for r in contract.get_audit_requests(run_id, since, index=index)})


@dataclass(frozen=True)
class ChainAudits:
    """The prover's AuditSource on chain: anchor each window, wait for the block after it, read the draw and the
    previous window's requested audits."""

    rpc_url: str
    contract: str
    prover_key: bytes
    run_id: bytes
    final_step: int
    anchor_every: int
    draw_timeout_s: float = 60.0

    def get_beacon(self, index: int) -> bytes:
        """Wait until window `index`'s beacon is fixed on chain (the block after the previous anchor) and return it."""
        contract = get_training_contract(self.rpc_url, self.contract)
        deadline = time.monotonic() + self.draw_timeout_s
        while True:
            try:
                return contract.beacon(self.run_id, index)
            except ContractReverted as e:
                if e.error != "DrawNotReady" or time.monotonic() > deadline:
                    raise
            time.sleep(0.2)

    def on_anchor(self, first_step: int, last_step: int, head: bytes) -> list[int]:
        """Anchor the head, finish the run after its last window, and return the steps to serve now: this window's
        draw and the audits validators requested on the previous window (final once this anchor is mined: the
        contract refuses requests on a window once the next one is anchored)."""
        contract = get_training_contract(self.rpc_url, self.contract)
        account: LocalAccount = Account.from_key(self.prover_key)
        record = contract.get_run(self.run_id)
        if record.slashed or record.finished_block:
            raise RunStopped(f"run {self.run_id.hex()[:10]} is {'slashed' if record.slashed else 'finished'}")
        before = record.anchors
        try:
            receipt = contract.anchor(account, self.run_id, last_step, head)
        except ContractReverted as e:
            if e.error == "NotRunning":  # slashed between the read and the anchor
                raise RunStopped(f"run {self.run_id.hex()[:10]} stopped") from e
            raise
        log.info("anchored steps %d..%d (gas %d)", first_step, last_step, receipt["gasUsed"])
        if last_step == self.final_step and (last_step % self.anchor_every == 0):
            contract.finish(account, self.run_id)
        wait_for_block(contract, int(receipt["blockNumber"]) + 2, self.draw_timeout_s)
        drawn = get_audited_steps(contract, self.run_id, before)
        return sorted(set(drawn) | set(get_requested_steps(contract, self.run_id, before - 1)))


def compute_audit_id(run_id: bytes, step: int) -> int:
    """Return the slashing-protection id of one audited step: uint256(keccak256(run id ‖ uint64 step))."""
    return int.from_bytes(keccak(run_id + step.to_bytes(8, "big")), "big")


def record_audit_vote(store: Store, run_id: bytes, step: int, head: bytes, valid: bool, reason: int) -> VerdictRecord:
    """Record this validator's decision on an audited step (synced) before it is signed; a different decision
    for the same step raises ConflictingVerdict (the store is opened for the Training contract's address)."""
    return store.record_verdict(VerdictRecord(compute_audit_id(run_id, step), "0x" + head.hex(), valid, reason,
                                              "0x" + bytes(32).hex(), 0))


def submit_audit_vote(contract: TrainingContract, validator: LocalAccount, run_id: bytes, index: int, step: int,
                      valid: bool, reason: int, store: Store | None = None) -> str:
    """Sign and submit this validator's own vote on one audited step; return "counted", "settled" (this vote
    settled it), "already-settled" or "skipped" (counted before). With a store, the decision is recorded
    before the signature exists, and a step decided otherwise before is refused (ConflictingVerdict)."""
    head = contract.get_anchor(run_id, index).head
    if store is not None:
        recorded = record_audit_vote(store, run_id, step, head, valid, reason)
        valid, reason = recorded.valid, recorded.reason
    signature = sign_audit_verdict(validator, int(contract.w3.eth.chain_id), contract.address, run_id, step, head,
                                   valid, reason)
    try:
        receipt = contract.submit_votes(validator, run_id, index, step, [AuditVote(valid, reason, signature)])
    except ContractReverted as e:
        # a vote mined after another auditor's settling vote in the same block reverts without revert data
        if e.error == "AlreadySettled" or contract.audit_result(run_id, step) != 0:
            return "already-settled"
        raise
    except ChainError as e:
        raise RecoverableError(f"vote submission failed: {e}", Reason.TX_FAILED) from e
    settled = contract.contract.events.AuditSettled().process_receipt(receipt, errors=DISCARD)
    skipped = contract.contract.events.VoteSkipped().process_receipt(receipt, errors=DISCARD)
    return "settled" if settled else "skipped" if skipped else "counted"

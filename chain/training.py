"""Typed client for the Training contract (contracts/src/Training.sol): runs, anchors, audit draws, verdicts.

The ABI and bytecode come from the committed artifact chain/artifacts/Training.json when it exists;
until it is generated (chain.compile) they are compiled once from contracts/src with the pinned
solc-js and cached by the source's sha256 under $VERINFER_CACHE/artifacts.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from eth_account.messages import encode_typed_data
from eth_account.signers.local import LocalAccount
from eth_utils.crypto import keccak
from web3 import Web3
from web3.types import TxReceipt

from chain.contracts import WEIGHT_DELAY, decode_revert, send, translate_module_error
from chain.errors import ChainError

ARTIFACT = Path(__file__).resolve().parent / "artifacts" / "Training.json"
SOURCE = Path(__file__).resolve().parents[1] / "contracts" / "src" / "Training.sol"
VERDICT_FIELDS = [{"name": "runId", "type": "bytes32"}, {"name": "step", "type": "uint64"},
                  {"name": "anchorHead", "type": "bytes32"}, {"name": "valid", "type": "bool"},
                  {"name": "reason", "type": "uint16"}]


@cache
def load_training_artifact() -> dict[str, Any]:
    """Return the Training contract's ABI and bytecode (committed, else compiled once and cached)."""
    if ARTIFACT.exists():
        committed: dict[str, Any] = json.loads(ARTIFACT.read_text())
        return committed
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    cache_dir = Path(os.environ.get("VERINFER_CACHE", Path.home() / ".cache" / "verinfer")) / "artifacts"
    cached = cache_dir / f"Training-{digest}.json"
    if cached.exists():
        artifact: dict[str, Any] = json.loads(cached.read_text())
        return artifact
    from chain.compile import build_input, run_solc

    standard = build_input()
    standard["sources"] = {k: v for k, v in standard["sources"].items() if k.endswith("Training.sol")}
    out = run_solc(standard)
    c = next(v["Training"] for k, v in out["contracts"].items() if k.endswith("Training.sol"))
    artifact = {"abi": c["abi"], "bytecode": "0x" + c["evm"]["bytecode"]["object"]}
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_suffix(f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps(artifact))
    os.replace(tmp, cached)
    return artifact


def _translate(exc: BaseException) -> ChainError:
    return translate_module_error(exc, ARTIFACT)


def translate_training_error(exc: BaseException) -> ChainError:
    """Return the chain error of an exception, a revert named from Training's ABI (for transactions sent
    through another path, e.g. TxManager, whose translation knows only the hub's errors)."""
    return _translate(exc)


@dataclass(frozen=True)
class RunRecord:
    """A run as stored on chain (Training.Run)."""

    prover: str
    bond: int
    data_root: bytes
    procedure_hash: bytes
    audit_rate_wad: int
    last_step: int
    anchor_every: int
    anchors: int
    finished_block: int
    init_strategy: int
    slashed: bool
    registered_block: int


@dataclass(frozen=True)
class AnchorRecord:
    """One anchored window (Training.Anchor)."""

    first_step: int
    last_step: int
    block_number: int
    head: bytes
    beacon: bytes  # the randomness the window's named positions derive from


@dataclass(frozen=True)
class AuditVote:
    """One validator's signed vote on an audited step (Training.Vote)."""

    valid: bool
    reason: int
    signature: bytes


@dataclass(frozen=True)
class TrainingDeployConfig:
    """Constructor parameters of Training."""

    hub: str
    treasury: str
    min_bond: int = 10**18
    min_signers: int = 2
    verdict_window: int = 100
    max_requests: int = 4  # requested audits per anchor, all validators together (requestAudit)
    weight_delay: int = WEIGHT_DELAY  # blocks a validator's stake must stand before an anchor to count (StakeQuorum)


@dataclass(frozen=True)
class AuditRequest:
    """A validator's request to audit an undrawn step (Training.AuditRequested)."""

    run_id: bytes
    index: int
    step: int
    requester: str
    block_number: int


class TrainingContract:
    """The Training contract at one address, driven by locally held keys."""

    def __init__(self, w3: Web3, address: str) -> None:
        self.w3 = w3
        self.address = Web3.to_checksum_address(address)
        self.contract = w3.eth.contract(address=self.address, abi=load_training_artifact()["abi"])

    @classmethod
    def deploy(cls, w3: Web3, account: LocalAccount, cfg: TrainingDeployConfig) -> tuple[TrainingContract, TxReceipt]:
        """Deploy a Training contract reading validator weights from the hub at cfg.hub."""
        art = load_training_artifact()
        factory = w3.eth.contract(abi=art["abi"], bytecode=art["bytecode"])
        try:
            receipt = send(w3, account, factory.constructor(Web3.to_checksum_address(cfg.hub),
                                                            Web3.to_checksum_address(cfg.treasury), cfg.min_bond,
                                                            cfg.min_signers, cfg.verdict_window,
                                                            cfg.max_requests, cfg.weight_delay))
        except ChainError as exc:
            raise _translate(exc) from exc
        return cls(w3, str(receipt["contractAddress"])), receipt

    def call(self, name: str, *args: Any) -> Any:
        """Call a view; reverts raise ContractReverted with the contract's error name."""
        try:
            return getattr(self.contract.functions, name)(*args).call()
        except Exception as exc:  # translated below
            raise _translate(exc) from exc

    def transact(self, account: LocalAccount, name: str, *args: Any, value: int = 0) -> TxReceipt:
        """Sign and send a transaction and wait for its receipt."""
        try:
            return send(self.w3, account, getattr(self.contract.functions, name)(*args), value=value)
        except Exception as exc:  # translated below
            raise _translate(exc) from exc

    def register_run(self, account: LocalAccount, spec_hash: bytes, nonce: bytes, data_root: bytes,
                     procedure_hash: bytes, init_strategy: int, audit_rate_wad: int, anchor_every: int,
                     bond: int) -> TxReceipt:
        """Register the account's run of spec_hash with its bond; its id is run_id_of(account, spec_hash) (a nonce the
        account used before is refused: NonceReplayed)."""
        return self.transact(account, "registerRun", spec_hash, nonce, data_root, procedure_hash, init_strategy,
                             audit_rate_wad, anchor_every, value=bond)

    def anchor(self, account: LocalAccount, run_id: bytes, last_step: int, head: bytes) -> TxReceipt:
        """Anchor the ledger head after last_step."""
        return self.transact(account, "anchor", run_id, last_step, head)

    def finish(self, account: LocalAccount, run_id: bytes) -> TxReceipt:
        """End a run whose last window was full."""
        return self.transact(account, "finish", run_id)

    def run_id_of(self, prover: str, spec_hash: bytes) -> bytes:
        """Return the contract's id of prover's run of spec_hash (Training.runIdOf)."""
        return bytes(self.call("runIdOf", prover, spec_hash))

    def get_run(self, run_id: bytes) -> RunRecord:
        """Return a run's record."""
        r = self.call("runs", run_id)
        return RunRecord(str(r[0]), int(r[1]), bytes(r[2]), bytes(r[3]), int(r[4]), int(r[5]), int(r[6]), int(r[7]),
                         int(r[8]), int(r[9]), bool(r[10]), int(r[11]))

    def get_anchor(self, run_id: bytes, index: int) -> AnchorRecord:
        """Return an anchored window."""
        a = self.call("anchors", run_id, index)
        return AnchorRecord(int(a[0]), int(a[1]), int(a[2]), bytes(a[3]), bytes(a[4]))

    def beacon(self, run_id: bytes, index: int) -> bytes:
        """Return window `index`'s beacon (stored once anchored; DrawNotReady until the block after the previous
        anchor, or after the registration for window 0, is mined)."""
        return bytes(self.call("beacon", run_id, index))

    def fix_beacon(self, account: LocalAccount, run_id: bytes) -> TxReceipt:
        """Store the next window's beacon before its block hash leaves the 256-block horizon."""
        return self.transact(account, "fixBeacon", run_id)

    def audit_seed(self, run_id: bytes, index: int) -> bytes:
        """Return the randomness of an anchor's audits (reverts DrawNotReady until the block after it)."""
        return bytes(self.call("auditSeed", run_id, index))

    def is_audited(self, run_id: bytes, index: int, step: int) -> bool:
        """Return whether a step of an anchored window is audited."""
        return bool(self.call("isAudited", run_id, index, step))

    def is_audit_due(self, run_id: bytes, index: int, step: int) -> bool:
        """Return whether a step of an anchored window must be audited: drawn or requested."""
        return bool(self.call("isAuditDue", run_id, index, step))

    def request_audit_call(self, run_id: bytes, index: int, step: int) -> Any:
        """Return the unsent requestAudit call (for a caller that journals its transactions: TxManager)."""
        return self.contract.functions.requestAudit(run_id, index, step)

    def request_audit(self, account: LocalAccount, run_id: bytes, index: int, step: int) -> TxReceipt:
        """Request the audit of an undrawn step of the newest anchor (a validator at the anchor; reverts
        NotAValidator, AlreadyDue, RequestsExhausted, PastRequestHorizon, NotRunning, DrawNotReady)."""
        return self.transact(account, "requestAudit", run_id, index, step)

    def requested_at(self, run_id: bytes, step: int) -> int:
        """Return the block a step's audit was requested in (0: not requested)."""
        return int(self.call("requestedAt", run_id, step))

    def request_count(self, run_id: bytes, index: int, validator: str) -> int:
        """Return how many audits a validator requested on an anchor's window."""
        return int(self.call("requestCount", run_id, index, validator))

    def min_audit_rate_wad(self) -> int:
        """Return the protocol's lowest audit rate a run may register (wad)."""
        return int(self.call("MIN_AUDIT_RATE_WAD"))

    def max_requests(self) -> int:
        """Return the cap of requested audits per anchor and per validator."""
        return int(self.call("maxRequests"))

    def verdict_deadline(self, run_id: bytes, index: int, step: int) -> int:
        """Return the last block in which votes on a due step settle."""
        return int(self.call("verdictDeadline", run_id, index, step))

    def get_audit_requests(self, run_id: bytes, from_block: int, to_block: int | str = "latest",
                           index: int | None = None) -> list[AuditRequest]:
        """Return a run's AuditRequested events in a block range (of one anchor's window when index is given)."""
        filters: dict[str, Any] = {"runId": run_id} if index is None else {"runId": run_id, "index": index}
        try:
            logs = self.contract.events.AuditRequested().get_logs(from_block=from_block, to_block=to_block,
                                                                  argument_filters=filters)
        except Exception as exc:  # translated below
            raise _translate(exc) from exc
        return [AuditRequest(bytes(e["args"]["runId"]), int(e["args"]["index"]), int(e["args"]["step"]),
                             str(e["args"]["requester"]), int(e["blockNumber"])) for e in logs]

    def audit_result(self, run_id: bytes, step: int) -> int:
        """Return 0 unsettled, 1 passed, 2 failed."""
        return int(self.call("auditResult", run_id, step))

    def verdict_digest(self, run_id: bytes, step: int, head: bytes, valid: bool, reason: int) -> bytes:
        """Return the contract's EIP-712 digest of an audit verdict."""
        return bytes(self.call("verdictDigest", run_id, step, head, valid, reason))

    def submit_votes(self, account: LocalAccount, run_id: bytes, index: int, step: int,
                     votes: Sequence[AuditVote]) -> TxReceipt:
        """Relay validators' signed votes on one audited step (a vote counted already is skipped, not reverted)."""
        return self.transact(account, "submitVotes", run_id, index, step,
                             [(v.valid, v.reason, v.signature) for v in votes])

    def has_voted(self, run_id: bytes, step: int, validator: str) -> bool:
        """Return whether a validator's vote on a step's audit is counted."""
        return bool(self.call("hasVoted", run_id, step, Web3.to_checksum_address(validator)))

    def credits(self, address: str) -> int:
        """Return withdrawable credits (the treasury's forfeited bonds)."""
        return int(self.call("credits", Web3.to_checksum_address(address)))

    def get_events(self, name: str, from_block: int, to_block: int | str = "latest") -> list[Any]:
        """Return decoded logs of one event in a block range."""
        try:
            return list(getattr(self.contract.events, name)().get_logs(from_block=from_block, to_block=to_block))
        except Exception as exc:  # translated below
            raise _translate(exc) from exc


def compute_verdict_typed_data(chain_id: int, contract: str, run_id: bytes, step: int, head: bytes, valid: bool,
                               reason: int) -> dict[str, Any]:
    """Return the EIP-712 typed data of an audit verdict (domain verinfer-training / 1)."""
    return {"types": {"EIP712Domain": [{"name": "name", "type": "string"}, {"name": "version", "type": "string"},
                                       {"name": "chainId", "type": "uint256"},
                                       {"name": "verifyingContract", "type": "address"}],
                      "AuditVerdict": VERDICT_FIELDS},
            "primaryType": "AuditVerdict",
            "domain": {"name": "verinfer-training", "version": "1", "chainId": chain_id,
                       "verifyingContract": Web3.to_checksum_address(contract)},
            "message": {"runId": run_id, "step": step, "anchorHead": head, "valid": valid, "reason": reason}}


def sign_audit_verdict(account: LocalAccount, chain_id: int, contract: str, run_id: bytes, step: int, head: bytes,
                       valid: bool, reason: int) -> bytes:
    """Return a validator's 65-byte signature of an audit verdict."""
    typed = compute_verdict_typed_data(chain_id, contract, run_id, step, head, valid, reason)
    return bytes(account.sign_message(encode_typed_data(full_message=typed)).signature)


def compute_verdict_digest(chain_id: int, contract: str, run_id: bytes, step: int, head: bytes, valid: bool,
                           reason: int) -> bytes:
    """Return the digest the contract's verdictDigest() returns."""
    m = encode_typed_data(full_message=compute_verdict_typed_data(chain_id, contract, run_id, step, head, valid,
                                                                  reason))
    return keccak(b"\x19" + m.version + m.header + m.body)


__all__ = ["AnchorRecord", "AuditRequest", "AuditVote", "RunRecord", "TrainingContract", "TrainingDeployConfig",
           "compute_verdict_digest", "decode_revert", "load_training_artifact", "sign_audit_verdict",
           "translate_training_error"]

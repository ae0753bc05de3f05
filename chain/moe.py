"""Typed client for the ExpertDuty module (contracts/src/ExpertDuty.sol): duty draws and expert verdicts.

A duty is its uint32 key on chain, `uint16 layer ‖ uint16 expert` (node.protocol.moe.compute_duty_key).

An MoE operator binds its commitment into the hub's fingerprint hash (``compute_moe_fingerprint_hash``);
anyone opens it on the module (``assign_duties``), which fixes the randomness that draws, per duty the inference
used, ``perDuty`` validators from all validators by their settled weight at the commit (stake that stood
``weightDelay`` blocks before it; declared holdings are a hint that narrows nothing). Fewer eligible validators
than ``perDuty``: the open reverts ``Uncoverable``. Draws are lazy: views (``assigned_to``, ``duties_of``) compute
them, and a duty's first counted verdict stores its draw. A drawn validator signs an ``ExpertVerdict`` in the
module's own EIP-712 domain ("verinfer-experts", "1"); anyone relays it; a majority of a duty's drawn validators
settles it. The module slashes no one: the hub committee re-judges a failed duty and its quorum verdict at the hub
settles (and, by the hub's rule, slashes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import Any

from eth_account.messages import encode_typed_data
from eth_account.signers.local import LocalAccount
from eth_utils.crypto import keccak
from web3 import Web3
from web3.types import TxReceipt

from chain.contracts import Hub, ModuleClient, decode_revert, load_artifact, send, translate_module_error
from chain.errors import ContractReverted

ARTIFACT = Path(__file__).resolve().parent / "artifacts" / "ExpertDuty.json"
PER_DUTY = 3  # judges drawn per duty: a majority of 2 settles it, never one
WEIGHT_DELAY = 2  # blocks a validator's stake must stand before a commit to count in its draws (tests, devnets)
DOMAIN_NAME, DOMAIN_VERSION = "verinfer-experts", "1"
VERDICT_FIELDS = [{"name": "inferenceId", "type": "uint256"}, {"name": "duty", "type": "uint32"},
                  {"name": "moeRoot", "type": "bytes32"}, {"name": "valid", "type": "bool"},
                  {"name": "reason", "type": "uint16"}, {"name": "scoresDigest", "type": "bytes32"}]


class DutyResult(IntEnum):
    """A duty's state on chain."""

    OPEN = 0
    PASSED = 1
    FAILED = 2


@dataclass(frozen=True)
class MoeOpening:
    """What opens an MoE inference's commitment on the module (ExpertDuty.MoeOpening)."""

    output_hash: bytes
    artifact_root: bytes
    fingerprint_hash: bytes  # the dense one, before moeRoot is bound in
    router_root: bytes
    counts: tuple[int, ...]
    expert_roots: tuple[bytes, ...]

    def as_tuple(self) -> tuple[bytes, bytes, bytes, bytes, list[int], list[bytes]]:
        """Return the ABI tuple."""
        return (self.output_hash, self.artifact_root, self.fingerprint_hash, self.router_root, list(self.counts),
                list(self.expert_roots))


@dataclass(frozen=True)
class Opened:
    """An opened inference on the module."""

    moe_root: bytes
    model_id: bytes
    commit_block: int
    duties: int
    failed: int  # duties settled failed: the hub committee re-judges them before voting


@dataclass(frozen=True)
class ExpertVote:
    """One assigned validator's signed verdict on one duty (ExpertDuty.ExpertVote)."""

    duty: int
    valid: bool
    reason: int
    scores_digest: bytes
    signature: bytes

    def as_tuple(self) -> tuple[int, bool, int, bytes, bytes]:
        """Return the ABI tuple."""
        return (self.duty, self.valid, self.reason, self.scores_digest, self.signature)


def compute_expert_typed_data(chain_id: int, contract: str, inference_id: int, duty: int, moe_root: bytes,
                              valid: bool, reason: int, scores_digest: bytes) -> dict[str, Any]:
    """Return the EIP-712 typed data of an expert verdict."""
    return {"types": {"EIP712Domain": [{"name": "name", "type": "string"}, {"name": "version", "type": "string"},
                                       {"name": "chainId", "type": "uint256"},
                                       {"name": "verifyingContract", "type": "address"}],
                      "ExpertVerdict": VERDICT_FIELDS},
            "primaryType": "ExpertVerdict",
            "domain": {"name": DOMAIN_NAME, "version": DOMAIN_VERSION, "chainId": chain_id,
                       "verifyingContract": Web3.to_checksum_address(contract)},
            "message": {"inferenceId": inference_id, "duty": duty, "moeRoot": moe_root,
                        "valid": valid, "reason": reason, "scoresDigest": scores_digest}}


def compute_expert_digest(chain_id: int, contract: str, inference_id: int, duty: int, moe_root: bytes,
                          valid: bool, reason: int, scores_digest: bytes) -> bytes:
    """Return the digest ExpertDuty.verdictDigest() returns."""
    m = encode_typed_data(full_message=compute_expert_typed_data(
        chain_id, contract, inference_id, duty, moe_root, valid, reason, scores_digest))
    return keccak(b"\x19" + m.version + m.header + m.body)


def sign_expert_vote(account: LocalAccount, chain_id: int, contract: str, inference_id: int, duty: int,
                     moe_root: bytes, valid: bool, reason: int, scores_digest: bytes) -> ExpertVote:
    """Return an assigned validator's signed verdict on one duty."""
    typed = compute_expert_typed_data(chain_id, contract, inference_id, duty, moe_root, valid, reason, scores_digest)
    signature = bytes(account.sign_message(encode_typed_data(full_message=typed)).signature)
    return ExpertVote(duty, valid, reason, scores_digest, signature)


class ExpertDutyClient(ModuleClient):
    """The ExpertDuty module at one address, driven by locally held keys."""

    ARTIFACT = ARTIFACT

    def set_shape(self, account: LocalAccount, model_id: bytes, layers: int, experts: int) -> TxReceipt:
        """Set an MoE model's shape (`account` must be a hub governor; once per model)."""
        return self.transact(account, "setShape", model_id, layers, experts)

    def declare_holdings(self, account: LocalAccount, model_id: bytes, keys: Sequence[int] | None) -> TxReceipt:
        """Announce the duty keys `account` keeps loaded (None: the whole model): a hint the draws never read."""
        return self.transact(account, "declareHoldings", model_id, keys is None, list(keys or ()))

    def settled_weight_at(self, validator: str, block: int) -> int:
        """Return a validator's draw weight at the end of `block` (min of its weight then and weightDelay before)."""
        return int(self.call("settledWeightAt", Web3.to_checksum_address(validator), block))

    def assign_duties(self, account: LocalAccount, inference_id: int, opening: MoeOpening) -> TxReceipt:
        """Open a checked inference's MoE commitment and fix its draws (anyone may, once; draws are lazy views)."""
        return self.transact(account, "assignDuties", inference_id, opening.as_tuple())

    def opened(self, inference_id: int) -> Opened:
        """Return an inference's record on the module (commit_block 0: not opened)."""
        r = self.call("opened", inference_id)
        return Opened(bytes(r[0]), bytes(r[1]), int(r[2]), int(r[3]), int(r[4]))

    def assigned_to(self, inference_id: int, duty: int) -> list[str]:
        """Return the validators drawn for a duty, in hub slot order (empty: not a used duty)."""
        return [Web3.to_checksum_address(a) for a in self.call("assignedTo", inference_id, duty)]

    def drawable_duties(self, inference_id: int) -> list[int]:
        """Return an opened inference's duty keys (every used one is drawn), in duty-bit order."""
        return [int(d) for d in self.call("drawableDuties", inference_id)]

    def duties_of(self, inference_id: int, validator: str) -> list[int]:
        """Return the duty keys of an inference drawn for `validator` (one view call)."""
        return [int(d) for d in self.call("dutiesOf", inference_id, Web3.to_checksum_address(validator))]

    def assignments(self, inference_id: int) -> dict[int, list[str]]:
        """Return every duty key of an inference with its drawn validators (the lazy draws, read as views)."""
        return {d: self.assigned_to(inference_id, d) for d in self.drawable_duties(inference_id)}

    def duty_result(self, inference_id: int, duty: int) -> DutyResult:
        """Return a duty's result."""
        return DutyResult(int(self.call("duties", inference_id, duty)[3]))

    def submit_verdicts(self, account: LocalAccount, inference_id: int, votes: Sequence[ExpertVote]) -> TxReceipt:
        """Relay drawn validators' signed verdicts (counted ones and votes on settled duties are skipped)."""
        return self.transact(account, "submitExpertVerdicts", inference_id, [v.as_tuple() for v in votes])

    def verdict_digest(self, inference_id: int, duty: int, moe_root: bytes, valid: bool, reason: int,
                       scores_digest: bytes) -> bytes:
        """Return the contract's digest of an expert verdict (to cross-check compute_expert_digest)."""
        return bytes(self.call("verdictDigest", inference_id, duty, moe_root, valid, reason,
                               scores_digest))


def decode_module_revert(exc: ContractReverted) -> ContractReverted:
    """Return a revert the hub's error table did not name (a transaction manager's) named from the module's ABI."""
    if exc.error != "UnknownError" or not exc.data.startswith("0x"):
        return exc
    return decode_revert(bytes.fromhex(exc.data[2:]), ARTIFACT)


def deploy_expert_duty(w3: Web3, account: LocalAccount, hub: Hub, per_duty: int = PER_DUTY,
                       weight_delay: int = WEIGHT_DELAY) -> ExpertDutyClient:
    """Deploy the module beside `hub`; it is granted no hub role (it slashes no one: the hub committee does)."""
    art = load_artifact(ARTIFACT)
    factory = w3.eth.contract(abi=art["abi"], bytecode=art["bytecode"])
    try:
        receipt = send(w3, account, factory.constructor(hub.address, per_duty, weight_delay))
    except Exception as exc:  # translated below
        raise translate_module_error(exc, ARTIFACT) from exc
    return ExpertDutyClient(w3, str(receipt["contractAddress"]))


__all__ = ["PER_DUTY", "WEIGHT_DELAY", "DutyResult", "ExpertDutyClient", "ExpertVote", "MoeOpening", "Opened",
           "compute_expert_digest", "compute_expert_typed_data", "decode_module_revert", "deploy_expert_duty",
           "sign_expert_vote"]

"""Typed client for the SpotCheck module (contracts/src/SpotCheck.sol): runs, window votes, results.

A verifier signs a ``WindowVerdict`` in the module's own EIP-712 domain ("verinfer-spotcheck", "1"), so a
window verdict can never pass for an inference verdict; anyone relays signed votes with ``submit_votes``;
a supermajority of the hub's validator weight settles a window, and a failed one slashes and jails the
operator on the hub (``Verinfer.slashForModule``, granted to the module with ``MODULE_ROLE``).
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

from chain.contracts import MODULE_ROLE, WEIGHT_DELAY, Hub, ModuleClient

ARTIFACT = Path(__file__).resolve().parent / "artifacts" / "SpotCheck.json"
DOMAIN_NAME, DOMAIN_VERSION = "verinfer-spotcheck", "1"
VERDICT_FIELDS = [{"name": "operator", "type": "address"}, {"name": "runId", "type": "bytes32"},
                  {"name": "windowId", "type": "bytes32"}, {"name": "measurementRoot", "type": "bytes32"},
                  {"name": "valid", "type": "bool"}, {"name": "reason", "type": "uint16"},
                  {"name": "policyDigest", "type": "bytes32"}]


class WindowResult(IntEnum):
    """A window's state on chain."""

    OPEN = 0
    PASSED = 1
    FAILED = 2


@dataclass(frozen=True)
class WindowVote:
    """One validator's signed verdict on one window (SpotCheck.Vote)."""

    valid: bool
    reason: int
    measurement_root: bytes
    policy_digest: bytes
    signature: bytes

    def as_tuple(self) -> tuple[bool, int, bytes, bytes, bytes]:
        """Return the ABI tuple."""
        return (self.valid, self.reason, self.measurement_root, self.policy_digest, self.signature)


def compute_window_typed_data(chain_id: int, contract: str, operator: str, run_id: bytes, window_id: bytes,
                              measurement_root: bytes, valid: bool, reason: int,
                              policy_digest: bytes) -> dict[str, Any]:
    """Return the EIP-712 typed data of a window verdict."""
    return {"types": {"EIP712Domain": [{"name": "name", "type": "string"}, {"name": "version", "type": "string"},
                                       {"name": "chainId", "type": "uint256"},
                                       {"name": "verifyingContract", "type": "address"}],
                      "WindowVerdict": VERDICT_FIELDS},
            "primaryType": "WindowVerdict",
            "domain": {"name": DOMAIN_NAME, "version": DOMAIN_VERSION, "chainId": chain_id,
                       "verifyingContract": Web3.to_checksum_address(contract)},
            "message": {"operator": Web3.to_checksum_address(operator), "runId": run_id, "windowId": window_id,
                        "measurementRoot": measurement_root, "valid": valid, "reason": reason,
                        "policyDigest": policy_digest}}


def compute_window_digest(chain_id: int, contract: str, operator: str, run_id: bytes, window_id: bytes,
                          measurement_root: bytes, valid: bool, reason: int, policy_digest: bytes) -> bytes:
    """Return the digest SpotCheck.verdictDigest() returns."""
    m = encode_typed_data(full_message=compute_window_typed_data(
        chain_id, contract, operator, run_id, window_id, measurement_root, valid, reason, policy_digest))
    return keccak(b"\x19" + m.version + m.header + m.body)


def sign_window_vote(account: LocalAccount, chain_id: int, contract: str, operator: str, run_id: bytes,
                     window_id: bytes, valid: bool, reason: int, measurement_root: bytes,
                     policy_digest: bytes) -> WindowVote:
    """Return a validator's signed vote on one window."""
    typed = compute_window_typed_data(chain_id, contract, operator, run_id, window_id, measurement_root, valid,
                                      reason, policy_digest)
    signature = bytes(account.sign_message(encode_typed_data(full_message=typed)).signature)
    return WindowVote(valid, reason, measurement_root, policy_digest, signature)


class SpotCheckClient(ModuleClient):
    """The SpotCheck module at one address, driven by locally held keys."""

    ARTIFACT = ARTIFACT

    def open_run(self, run_id: bytes, account: LocalAccount) -> TxReceipt:
        """Open a spot-check run for `account`, a bonded hub operator."""
        return self.transact(account, "openRun", run_id)

    def submit_votes(self, operator: str, run_id: bytes, window_id: bytes, votes: Sequence[WindowVote],
                     account: LocalAccount) -> TxReceipt:
        """Relay signed votes on one window (a vote counted already is skipped by the contract)."""
        return self.transact(account, "submitVotes", Web3.to_checksum_address(operator), run_id, window_id,
                             [v.as_tuple() for v in votes])

    def window_result(self, operator: str, run_id: bytes, window_id: bytes) -> WindowResult:
        """Return a window's result."""
        return WindowResult(int(self.call("windowResult", Web3.to_checksum_address(operator), run_id, window_id)))

    def has_voted(self, operator: str, run_id: bytes, window_id: bytes, validator: str) -> bool:
        """Return whether a validator's vote on a window is counted."""
        return bool(self.call("hasVoted", Web3.to_checksum_address(operator), run_id, window_id,
                              Web3.to_checksum_address(validator)))

    def verdict_digest(self, operator: str, run_id: bytes, window_id: bytes, measurement_root: bytes, valid: bool,
                       reason: int, policy_digest: bytes) -> bytes:
        """Return the contract's digest of a window verdict (to cross-check compute_window_digest)."""
        return bytes(self.call("verdictDigest", Web3.to_checksum_address(operator), run_id, window_id,
                               measurement_root, valid, reason, policy_digest))


def deploy_spotcheck(w3: Web3, account: LocalAccount, hub: Hub, min_signers: int = 2,
                     weight_delay: int = WEIGHT_DELAY) -> SpotCheckClient:
    """Deploy the module beside `hub` and grant it MODULE_ROLE (`account` must be the hub's admin)."""
    return SpotCheckClient.deploy_beside(w3, account, hub, min_signers, weight_delay)


__all__ = ["MODULE_ROLE", "SpotCheckClient", "WindowResult", "WindowVote", "compute_window_digest",
           "compute_window_typed_data", "deploy_spotcheck", "sign_window_vote"]

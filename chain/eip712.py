"""EIP-712 verdicts (docs/protocol.md): the typed data, its digest, signing and recovery with eth-account."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from eth_account import Account
from eth_account.messages import SignableMessage, encode_typed_data
from eth_account.signers.local import LocalAccount
from eth_utils.crypto import keccak

DOMAIN_NAME = "verinfer"
DOMAIN_VERSION = "1"
VERDICT_FIELDS = [
    {"name": "inferenceId", "type": "uint256"},
    {"name": "artifactRoot", "type": "bytes32"},
    {"name": "valid", "type": "bool"},
    {"name": "reason", "type": "uint16"},
    {"name": "scoresDigest", "type": "bytes32"},
    {"name": "deadline", "type": "uint64"},
]
SECP256K1_HALF_N = 0x7FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF5D576E7357A4501DDFE92F46681B20A0


@dataclass(frozen=True)
class Verdict:
    """One validator's verdict on one inference, as signed."""

    inference_id: int
    artifact_root: bytes
    valid: bool
    reason: int
    scores_digest: bytes
    deadline: int

    def message(self) -> dict[str, Any]:
        """Return the EIP-712 message fields."""
        return {"inferenceId": self.inference_id, "artifactRoot": self.artifact_root, "valid": self.valid,
                "reason": self.reason, "scoresDigest": self.scores_digest, "deadline": self.deadline}


def compute_typed_data(verdict: Verdict, chain_id: int, contract: str) -> dict[str, Any]:
    """Return the full EIP-712 typed data of a verdict for one chain and contract."""
    return {
        "types": {
            "EIP712Domain": [{"name": "name", "type": "string"}, {"name": "version", "type": "string"},
                             {"name": "chainId", "type": "uint256"}, {"name": "verifyingContract", "type": "address"}],
            "Verdict": VERDICT_FIELDS,
        },
        "primaryType": "Verdict",
        "domain": {"name": DOMAIN_NAME, "version": DOMAIN_VERSION, "chainId": chain_id, "verifyingContract": contract},
        "message": verdict.message(),
    }


def _signable(verdict: Verdict, chain_id: int, contract: str) -> SignableMessage:
    return encode_typed_data(full_message=compute_typed_data(verdict, chain_id, contract))


def compute_verdict_digest(verdict: Verdict, chain_id: int, contract: str) -> bytes:
    """Return the 32-byte digest the contract's verdictDigest() returns."""
    m = _signable(verdict, chain_id, contract)
    return keccak(b"\x19" + m.version + m.header + m.body)


def sign_verdict(account: LocalAccount, verdict: Verdict, chain_id: int, contract: str) -> bytes:
    """Return the 65-byte signature r ‖ s ‖ v (low s) of a verdict."""
    signature = bytes(account.sign_message(_signable(verdict, chain_id, contract)).signature)
    if int.from_bytes(signature[32:64], "big") > SECP256K1_HALF_N:  # eth-keys signs low-s; keep it checked
        raise ValueError("high-s signature")
    return signature


def recover_verdict_signer(verdict: Verdict, signature: bytes, chain_id: int, contract: str) -> str:
    """Return the checksummed address that signed a verdict."""
    address: str = Account.recover_message(_signable(verdict, chain_id, contract), signature=signature)
    return address

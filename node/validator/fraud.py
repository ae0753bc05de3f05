"""Stage-1 fraud proofs: the artifact leaf that breaks a rule, with what the contract needs to check it (pure)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from node.errors import InvalidInput, Reason
from node.executer.api import InferencePayload
from node.protocol.artifact import compute_leaf_proof, compute_positions_root, encode_header, encode_leaf
from node.protocol.hashing import keccak256
from node.validator.verify import decode_payload_artifact


@dataclass(frozen=True)
class FraudProof:
    """One artifact leaf that breaks a stage-1 rule, with what the contract needs to check it.

    A sampler-rule proof (proveFraud) carries the header hash; a termination-rule proof
    (proveTermination) carries the whole header, and for the header-level case (empty or over-long
    output: no leaf, position -1) the positions root.
    """

    header_hash: bytes
    leaf: bytes
    proof: list[bytes]
    position: int
    header: bytes = b""
    positions_root: bytes = b""

    @property
    def is_termination(self) -> bool:
        """Check whether this proves the termination rule (proveTermination) rather than the sampler's."""
        return bool(self.header)

    def to_json(self) -> dict[str, Any]:
        """Return the proof as JSON for the store."""
        return {"header_hash": self.header_hash.hex(), "leaf": self.leaf.hex(), "proof": [p.hex() for p in self.proof],
                "position": self.position, "header": self.header.hex(), "positions_root": self.positions_root.hex()}

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> FraudProof:
        """Return a proof stored by to_json."""
        return cls(bytes.fromhex(value["header_hash"]), bytes.fromhex(value["leaf"]),
                   [bytes.fromhex(p) for p in value["proof"]], int(value["position"]),
                   bytes.fromhex(value.get("header", "")), bytes.fromhex(value.get("positions_root", "")))


TERMINATION_REASONS = frozenset({Reason.NOT_TERMINATED, Reason.TOKENS_AFTER_STOP, Reason.OUTPUT_TOO_LONG})


def build_fraud_proof(payload: InferencePayload, position: int | None,
                      reason: Reason = Reason.CHOSEN_MISMATCH) -> FraudProof:
    """Return the fraud proof of a stage-1 failure at `position` (None: header level) of a payload's artifact."""
    art = decode_payload_artifact(payload)
    header = encode_header(art.header)
    if reason in TERMINATION_REASONS:
        if position is None:  # empty or over-long: the header and the positions root prove it
            return FraudProof(keccak256(header), b"", [], -1, header, compute_positions_root(art.positions))
        return FraudProof(keccak256(header), encode_leaf(art.positions, position), compute_leaf_proof(art, position),
                          position, header)
    if position is None:
        raise InvalidInput(f"{reason.name} is not provable from one leaf", reason)
    return FraudProof(keccak256(header), encode_leaf(art.positions, position), compute_leaf_proof(art, position),
                      position)

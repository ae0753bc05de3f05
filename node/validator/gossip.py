"""The verdict gossip message, declared once (pydantic v2): one signed vote and the commitment it is for.

Only the verdict fields are signed (EIP-712: inference id, artifact root, validity, reason, scores
digest, deadline). ``output_hash`` and ``fingerprint_hash`` ride along unsigned: a receiver never
submits them; it takes the commitment from its own record of the InferenceCommitted event (or checks
these against the on-chain commitment) and drops a message whose unsigned fields disagree.

Parsing is strict and bounded (any input ends as a GossipVote or an InvalidGossip, nothing else), and
needs no RPC or disk: it runs inside the libp2p host's validation.
"""

from __future__ import annotations

from typing import Annotated, Self

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError

from chain.contracts import Commitment, Vote
from chain.eip712 import Verdict, recover_verdict_signer
from node.protocol.errors import InvalidInput, Reason

MAX_GOSSIP_BYTES = 2048  # an honest message is about 600 bytes
UINT256_DIGITS = 78

Hex32 = Annotated[StrictStr, Field(pattern=r"^0x[0-9a-fA-F]{64}$")]
Hex65 = Annotated[StrictStr, Field(pattern=r"^0x[0-9a-fA-F]{130}$")]


def _is_uint256(text: str) -> str:
    if int(text) >= 2**256:  # the pattern already bounds the digits, so int() is cheap
        raise ValueError("exceeds uint256")
    return text


DecimalU256 = Annotated[StrictStr, Field(pattern=rf"^(0|[1-9][0-9]{{0,{UINT256_DIGITS - 1}}})$"),
                        AfterValidator(_is_uint256)]


class InvalidGossip(InvalidInput, ValueError):
    """A gossip message that does not parse, or whose signature does not recover."""


class GossipVote(BaseModel):
    """One signed verdict on the verdict topic (`verinfer/<chain id>/<contract>/verdicts`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    inference_id: DecimalU256
    artifact_root: Hex32  # signed
    output_hash: Hex32  # unsigned: never trusted, see the module docstring
    fingerprint_hash: Hex32  # unsigned
    valid: StrictBool
    reason: Annotated[StrictInt, Field(ge=0, le=2**16 - 1)]
    scores_digest: Hex32
    deadline: Annotated[StrictInt, Field(ge=0, le=2**64 - 1)]
    signature: Hex65

    @classmethod
    def from_vote(cls, inference_id: int, commitment: Commitment, vote: Vote) -> Self:
        """Return the message of one signed vote for a commitment."""
        return cls(inference_id=str(inference_id), artifact_root="0x" + commitment.artifact_root.hex(),
                   output_hash="0x" + commitment.output_hash.hex(),
                   fingerprint_hash="0x" + commitment.fingerprint_hash.hex(), valid=vote.valid, reason=vote.reason,
                   scores_digest="0x" + vote.scores_digest.hex(), deadline=vote.deadline,
                   signature="0x" + vote.signature.hex())

    @property
    def id(self) -> int:
        """Return the inference id."""
        return int(self.inference_id)

    def commitment(self) -> Commitment:
        """Return the commitment as the sender claims it (output and fingerprint hashes unsigned)."""
        return Commitment(_b(self.output_hash), _b(self.artifact_root), _b(self.fingerprint_hash))

    def vote(self) -> Vote:
        """Return the signed vote as the contract takes it."""
        return Vote(self.valid, self.reason, _b(self.scores_digest), self.deadline, _b(self.signature))

    def verdict(self) -> Verdict:
        """Return the EIP-712 verdict the signature covers."""
        return Verdict(self.id, _b(self.artifact_root), self.valid, self.reason, _b(self.scores_digest),
                       self.deadline)

    def recover_signer(self, chain_id: int, contract: str) -> str:
        """Return the checksummed address that signed this vote, or raise InvalidGossip."""
        try:
            return recover_verdict_signer(self.verdict(), _b(self.signature), chain_id, contract)
        except InvalidGossip:
            raise
        except Exception as exc:  # eth-keys rejects bad v, r, s in several ways: all one typed rejection
            raise InvalidGossip(f"signature does not recover: {type(exc).__name__}", Reason.WIRE_MALFORMED) from exc

    def encode(self) -> bytes:
        """Return the message's JSON bytes."""
        return self.model_dump_json().encode()


def decode_gossip_vote(data: bytes) -> GossipVote:
    """Return the gossip message in `data`, or raise InvalidGossip saying why."""
    if not isinstance(data, (bytes, bytearray)):
        raise InvalidGossip("gossip message must be bytes", Reason.WIRE_MALFORMED)
    if len(data) > MAX_GOSSIP_BYTES:
        raise InvalidGossip(f"gossip message of {len(data)} bytes exceeds {MAX_GOSSIP_BYTES}", Reason.WIRE_TOO_LARGE)
    try:
        message = GossipVote.model_validate_json(bytes(data))
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "message"
        raise InvalidGossip(f"{where}: {first['msg']}", Reason.WIRE_MALFORMED) from exc
    return message


def encode_vote_message(inference_id: int, commitment: Commitment, vote: Vote) -> bytes:
    """Return the gossip message of one signed vote (with the commitment it is for)."""
    return GossipVote.from_vote(inference_id, commitment, vote).encode()


def decode_vote_message(data: bytes) -> tuple[int, Commitment, Vote]:
    """Return (inference id, claimed commitment, vote) of a gossip message, or raise InvalidGossip."""
    message = decode_gossip_vote(data)
    return message.id, message.commitment(), message.vote()


def _b(hex_text: str) -> bytes:
    return bytes.fromhex(hex_text[2:])


__all__ = ["MAX_GOSSIP_BYTES", "GossipVote", "InvalidGossip", "decode_gossip_vote", "decode_vote_message",
           "encode_vote_message"]

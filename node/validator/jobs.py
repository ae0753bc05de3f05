"""The validator's durable job state: a committed inference to check, its ballot of votes, and their JSON codecs."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from chain.contracts import Commitment, Vote
from node.validator.verify import NO_BLOCK_HASH, ChainFacts


@dataclass(frozen=True)
class Job:
    """A committed inference to check."""

    facts: ChainFacts
    operator: str

    def to_json(self) -> dict[str, Any]:
        """Return the job as JSON for the store."""
        facts = {k: (v.hex() if isinstance(v, bytes) else v) for k, v in asdict(self.facts).items()}
        return {"facts": facts, "operator": self.operator}

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> Job:
        """Return a job stored by to_json."""
        f = value["facts"]
        facts = ChainFacts(int(f["inference_id"]), int(f["user_seed"]), bytes.fromhex(f["model_id"]),
                           int(f["temperature_bits"]), int(f["top_p_bits"]), int(f["top_k"]), int(f["max_tokens"]),
                           bytes.fromhex(f["prompt_hash"]), bytes.fromhex(f["output_hash"]),
                           bytes.fromhex(f["artifact_root"]), bytes.fromhex(f["fingerprint_hash"]),
                           bytes.fromhex(f.get("projection_block_hash", NO_BLOCK_HASH.hex())))
        return cls(facts, str(value["operator"]))

    def commitment(self) -> Commitment:
        """Return the commitment of the InferenceCommitted event this job came from."""
        return Commitment(self.facts.output_hash, self.facts.artifact_root, self.facts.fingerprint_hash)


@dataclass
class Ballot:
    """The signed votes known for one inference, and when to look at submitting them next (monotonic s)."""

    votes: dict[str, Vote]
    first_seen: float
    due: float
    attempts: int = 0
    running: bool = False
    last_missing: frozenset[str] = frozenset()


def vote_to_json(vote: Vote) -> dict[str, Any]:
    """Return a vote as JSON for the store."""
    return {"valid": vote.valid, "reason": vote.reason, "scores_digest": vote.scores_digest.hex(),
            "deadline": vote.deadline, "signature": vote.signature.hex()}


def vote_from_json(value: dict[str, Any]) -> Vote:
    """Return a vote stored by vote_to_json."""
    return Vote(bool(value["valid"]), int(value["reason"]), bytes.fromhex(value["scores_digest"]),
                int(value["deadline"]), bytes.fromhex(value["signature"]))

"""A training run's declaration: model, data, optimiser, schedule, audit parameters — hashed into its run id."""

from __future__ import annotations

import hashlib
import json
from decimal import Decimal
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from node.protocol.hashing import keccak256
from node.protocol.ledger import compute_run_id


class ModelShape(BaseModel):
    """The llama architecture trained (tiny for tests; SmolLM2-135M's for the demo)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    vocab_size: int = Field(49152, gt=0)
    hidden_size: int = Field(64, gt=0)
    intermediate_size: int = Field(128, gt=0)
    num_hidden_layers: int = Field(2, gt=0)
    num_attention_heads: int = Field(4, gt=0)
    num_key_value_heads: int = Field(2, gt=0)
    max_position_embeddings: int = Field(512, gt=0)


SMOLLM2_135M = ModelShape(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                          num_key_value_heads=3, max_position_embeddings=2048)
SHAPES = {"tiny": ModelShape(), "smollm2": SMOLLM2_135M}


class UnknownShape(ValueError):
    """A shape name outside SHAPES."""


def get_shape(name: str) -> ModelShape:
    """Return the named model shape (`tiny` or `smollm2`); UnknownShape otherwise."""
    if name not in SHAPES:
        raise UnknownShape(f"unknown model shape {name!r}: expected one of {', '.join(SHAPES)}")
    return SHAPES[name]


def get_shape_name(shape: ModelShape) -> str:
    """Return the name of a known shape, or "custom"."""
    return next((name for name, s in SHAPES.items() if s == shape), "custom")


def compute_keep_checkpoints(anchor_every: int, offchain: bool = True) -> int:
    """Return the smallest K (the shadow's buffer) that can serve every audit of a step when it is asked.

    Steps are anchored in windows of m = anchor_every; the draw of a window's audits is fixed by the block after
    its anchor, and the prover waits for that draw before it trains further. When the window ending at step e
    is anchored the shadow holds Z(e−1) applied and step e's gradient pending (Z(e) on demand), and the oldest
    state an on-chain audit of the window needs is Z(e−m) (step e−m+1's Z(t−1); window 0 is steps 0..m, whose
    step 0 needs Z(0) = Z(e−m) too): K = m states Z(e−m)..Z(e−1). An auditor's off-chain request (a raised rate)
    is read after that anchor and served at the next one, ending at e + m: its oldest state is again Z(e−m), so
    covering off-chain requests made within the following window takes K = 2m. A request later than that is
    not served (the auditor journals it late; off-chain verdicts never vote).
    """
    if anchor_every < 1:
        raise ValueError(f"anchor_every must be ≥ 1, not {anchor_every}")
    return max(2, (2 if offchain else 1) * anchor_every)


class RunSpec(BaseModel):
    """Everything a verifier needs to replay a step; its canonical JSON hash is the run's spec hash."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    shape: ModelShape = ModelShape()
    init_strategy: Literal["normal-0.02"] = "normal-0.02"  # the pre-agreed set (HF llama init)
    init_seed: int = Field(0, ge=0, lt=2**63)
    corpus_files: int = Field(48, gt=0)  # the first F stdlib .py files in sorted order
    seq_len: int = Field(32, gt=1)
    data_seed: int = Field(0, ge=0, lt=2**63)
    workers: int = Field(2, ge=1, le=16)
    batch_per_worker: int = Field(2, ge=1)
    steps: int = Field(20, gt=0)
    optimiser: Literal["sgd-momentum"] = "sgd-momentum"
    lr_peak: float = Field(0.01, gt=0)
    warmup_steps: int = Field(3, ge=0)
    momentum: float = Field(0.9, ge=0, lt=1)
    # the prover's address: in the spec hash (so the LSH seed) and in the run id (Training.runIdOf), so a copied
    # registration is another prover's run with another seed (issue 31, finding 6)
    prover: str = Field("0x" + "00" * 20, pattern=r"^0x[0-9a-fA-F]{40}$")
    lsh_nonce: str = Field("00" * 32, pattern=r"^[0-9a-f]{64}$")  # the verifier's fresh nonce for this run
    lsh_kind: Literal["count-sketch", "block-sign"] = "block-sign"  # node.protocol.lsh's sketch kinds
    lsh_dim: int = Field(256, gt=1)
    lsh_scale: float = Field(1e5, gt=0)
    named_positions: int = Field(1024, gt=0)
    keep_checkpoints: int = Field(10, ge=2)  # K, the shadow's rolling buffer
    anchor_every: int = Field(5, gt=0)  # m
    audit_rate: float = Field(0.25, ge=0, le=1)
    response_deadline_s: float = Field(30.0, gt=0)

    @field_validator("prover")
    @classmethod
    def _lower(cls, value: str) -> str:
        """Return the address in lower case (one spec hash per prover, whatever the checksum casing)."""
        return value.lower()

    @property
    def global_batch(self) -> int:
        """Return samples per step across workers."""
        return self.workers * self.batch_per_worker

    def spec_hash(self) -> bytes:
        """Return keccak256 of the canonical JSON (keys sorted, no whitespace)."""
        return keccak256(json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":")).encode())

    def run_id(self) -> bytes:
        """Return the run's id on chain: keccak256(abi.encode(prover, spec hash))."""
        return compute_run_id(self.prover, self.spec_hash())

    @property
    def audit_rate_wad(self) -> int:
        """Return the declared audit rate p as the contract's wad (exact decimal: 0.4 → 4e17)."""
        return int(Decimal(repr(self.audit_rate)) * 10**18)

    def procedure_hash(self) -> bytes:
        """Return the hash of the optimiser, schedule and audit parameters (what the contract records with the run:
        the registered rate and m are then those of the declaration, which auditors check)."""
        keys = ("optimiser", "lr_peak", "warmup_steps", "momentum", "steps", "workers", "batch_per_worker", "seq_len",
                "audit_rate", "anchor_every")
        chosen = {k: getattr(self, k) for k in keys}
        return keccak256(json.dumps(chosen, sort_keys=True, separators=(",", ":")).encode())

    def lsh_seed(self) -> bytes:
        """Return the projection seed: sha256(nonce ‖ spec hash), so one nonce never serves two specs."""
        return hashlib.sha256(bytes.fromhex(self.lsh_nonce) + self.spec_hash()).digest()

"""An MoE validator's duties from its config (`experts = ["layer3.e1"]`), and the validator that holds only them.

The setting is parsed at the boundary (pydantic): canonical names only, no repeats. The validator loads only
the tensors its duties need (one expert's matrices, one router, or the shared layers for `shared`) and
answers each assigned duty of one inference with a reason code.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator

from node.moe.trace import MoeTrace
from node.moe.validate import (
    ExpertWeights,
    MoeLimits,
    decide_expert,
    decide_link,
    decide_router,
    load_expert,
    load_router,
    load_shared,
    verify_expert,
    verify_link,
    verify_router,
)
from node.moe.wire import DutySlice
from node.protocol.moe import (
    ROUTER,
    SHARED,
    ExpertKey,
    Holder,
    InvalidMoe,
    MoeCommitment,
    MoeReason,
    compute_vector_hash,
    verify_expert_leaves,
)

log = logging.getLogger(__name__)


class MoeDutiesConfig(BaseModel):
    """The MoE duties a validator holds: `layer<L>.e<E>`, `layer<L>.router`, `shared`; empty: the whole model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    experts: tuple[str, ...] = Field(default=(), max_length=4096)

    @field_validator("experts")
    @classmethod
    def _canonical_and_distinct(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        keys = []
        for name in value:
            try:
                keys.append(ExpertKey.parse(name))
            except InvalidMoe as e:
                raise ValueError(str(e)) from None
        if len(set(keys)) != len(keys):
            raise ValueError("experts repeat a duty")
        return value

    def keys(self) -> frozenset[ExpertKey] | None:
        """Return the held duties (None: the whole model)."""
        return frozenset(ExpertKey.parse(n) for n in self.experts) if self.experts else None

    def holder(self, address: bytes, stake: int) -> Holder:
        """Return this validator as an entry of the assignment's stake snapshot (its duties narrow nothing)."""
        return Holder(address, stake)


class DutyValidator:
    """Holds only the weights of its configured duties and judges them on one inference."""

    def __init__(self, model_dir: Path, config: MoeDutiesConfig, limits: MoeLimits,
                 cache: dict[ExpertKey, Any] | None = None) -> None:
        """Load the configured duties' tensors (through `cache` if given: in-process validators share copies)."""
        keys = config.keys()
        if keys is None:
            raise InvalidMoe("a duty validator needs at least one duty; a whole-model validator runs stage 2",
                             MoeReason.EXPERT_UNKNOWN)
        self.limits = limits
        self.model_dir = model_dir
        self.experts: dict[ExpertKey, ExpertWeights] = {}
        self.routers: dict[int, torch.Tensor] = {}
        self.shared: Any = None
        self._store: dict[ExpertKey, Any] = {} if cache is None else cache
        for key in sorted(keys):
            self.load(key)

    def load(self, key: ExpertKey) -> None:
        """Load one duty's tensors from the model folder (a duty drawn for this validator that it did not preload)."""
        if key not in self._store:
            self._store[key] = load_shared(self.model_dir) if key.expert == SHARED else \
                load_router(self.model_dir, key.layer) if key.expert == ROUTER else load_expert(self.model_dir, key)
        if key.expert == SHARED:
            self.shared = self._store[key]
        elif key.expert == ROUTER:
            self.routers[key.layer] = self._store[key]
        else:
            self.experts[key] = self._store[key]

    def weight_bytes(self) -> int:
        """Return the bytes of every tensor this validator holds."""
        total = sum(w.nbytes() for w in self.experts.values()) + sum(int(r.nbytes) for r in self.routers.values())
        if self.shared is not None:
            total += sum(int(p.nbytes) for n, p in self.shared.named_parameters() if ".experts." not in n)
        return total

    def check(self, commitment: MoeCommitment, trace: MoeTrace, token_ids: Sequence[int],
              assigned: Sequence[ExpertKey]) -> dict[str, MoeReason]:
        """Return a decision per assigned duty (a duty it does not hold is a typed error, never a guess)."""
        root = commitment.root()
        out: dict[str, MoeReason] = {}
        for key in assigned:
            if key in self.experts:
                leaves = commitment.leaves_of(key)
                if not verify_expert_leaves(leaves, commitment.expert_proof(key), root):
                    out[str(key)] = MoeReason.EXPERT_ROOT_MISMATCH
                    continue
                check = verify_expert(self.experts[key], leaves, trace.get_expert_inputs(key))
                out[str(key)] = decide_expert(check, self.limits)
            elif key.expert == ROUTER and key.layer in self.routers:
                rl = [r for r in commitment.router if r.layer == key.layer]
                check_r = verify_router(self.routers[key.layer], rl, trace.inputs[key.layer, [r.position for r in rl]])
                out[str(key)] = decide_router(check_r, self.limits)
            elif key.expert == SHARED and self.shared is not None:
                out[str(key)] = decide_link(verify_link(self.shared, token_ids, commitment, trace), self.limits)
            else:
                raise InvalidMoe(f"assigned {key}, which this validator does not hold", MoeReason.EXPERT_UNKNOWN)
            log.info("duty %s: %s", key, out[str(key)].name)
        return out

    def holds(self, key: ExpertKey) -> bool:
        """Check whether this validator holds the weights of duty `key`."""
        return key in self.experts or (key.expert == ROUTER and key.layer in self.routers) or \
            (key.expert == SHARED and self.shared is not None)

    def check_slice(self, piece: DutySlice) -> MoeReason:
        """Return the decision on one duty from its slice (already rebuilt into the committed moeRoot)."""
        key = piece.key
        if not self.holds(key):
            raise InvalidMoe(f"assigned {key}, which this validator does not hold", MoeReason.EXPERT_UNKNOWN)
        if key.expert not in (ROUTER, SHARED):
            leaves = piece.experts[key]
            if any(a.position >= b.position for a, b in itertools.pairwise(leaves)) or \
                    any(x.position >= piece.positions for x in leaves):
                return MoeReason.MOE_MALFORMED
            return decide_expert(verify_expert(self.experts[key], leaves, piece.inputs), self.limits)
        expected = [(L, t) for L in range(piece.shape.layers) for t in range(piece.positions)]
        if [(r.layer, r.position) for r in piece.router] != expected:
            return MoeReason.ROUTING_INCOMPLETE  # committed router leaves that are not one per (layer, position)
        if key.expert == ROUTER:
            routed = piece.router[key.layer * piece.positions:(key.layer + 1) * piece.positions]
            return decide_router(verify_router(self.routers[key.layer], routed, piece.inputs), self.limits)
        if any(any(a.position >= b.position for a, b in itertools.pairwise(v)) or
               any(x.position >= piece.positions for x in v) for v in piece.experts.values()):
            return MoeReason.MOE_MALFORMED
        hashes = [r.input_hash for r in piece.router]
        rows = piece.inputs.reshape(-1, piece.inputs.shape[-1])
        if any(compute_vector_hash(row) != h for row, h in zip(rows, hashes, strict=True)):
            return MoeReason.EXPERT_INPUT_HASH_MISMATCH  # the walk must measure the committed rows, no others
        token_ids = [*piece.prompt_ids, *piece.output_ids[:-1]]
        return decide_link(verify_link(self.shared, token_ids, piece.commitment(), piece.trace()), self.limits)

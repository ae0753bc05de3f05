"""An executer serving a mixture-of-experts model: the per-expert commitment of every served inference.

After generating, the executer traces the experts in one teacher-forced pass over prompt + output (the
inputs the validator's walk feeds: the last output token is never fed), builds the router and per-expert
leaves, binds moeRoot into the fingerprint hash it commits (``compute_moe_fingerprint_hash``) and keeps
what each duty's slice needs. It serves `GET /v1/moe/{id}/{duty}` (the slice, node.moe.serve) and
`GET /v1/moe/{id}` (the opening anyone submits to ExpertDuty.assignDuties) for its newest inferences.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from node.moe.serve import MoeSliceStore, ServedMoe
from node.moe.trace import build_commitment, record_trace
from node.protocol.moe import compute_moe_fingerprint_hash

log = logging.getLogger(__name__)


class MoeRecorder:
    """Traces one MoE model's served inferences and keeps their commitments for the duties' slices."""

    def __init__(self, model: Any, capacity: int = 256) -> None:
        """Trace `model` (the engine's transformers model); keep the newest `capacity` inferences."""
        self.model = model
        self.slices = MoeSliceStore(capacity)

    def record(self, inference_id: int, prompt_ids: Sequence[int], output_ids: Sequence[int], artifact_root: bytes,
               fingerprint_hash: bytes) -> bytes:
        """Trace one generation, keep its slices; return the fingerprint hash to commit (moeRoot bound in)."""
        trace = record_trace(self.model, [*prompt_ids, *output_ids[:-1]])
        commitment = build_commitment(trace)
        self.slices.put(inference_id, ServedMoe(commitment, trace, tuple(prompt_ids), tuple(output_ids),
                                                artifact_root, fingerprint_hash))
        log.info("MoE commitment recorded", extra={"inference_id": hex(inference_id),
                                                   "leaves": sum(len(v) for v in commitment.experts.values())})
        return compute_moe_fingerprint_hash(fingerprint_hash, commitment.root())


__all__ = ["MoeRecorder"]

"""Decision on projection fingerprints (kind 1): the model must be registered for the kind, and every
source's distance must stay under the profile's calibrated threshold for that source and the response's length."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from node.checks.decision import select_length_bucket
from node.errors import FatalError, Reason
from node.protocol.projection import (
    LAST_HIDDEN,
    InvalidProjectionFingerprint,
    ProjectionMeasurement,
    ProjectionSpec,
    compute_fingerprint_kind,
)


@dataclass(frozen=True)
class ProjectionThresholds:
    """The largest honest-looking distance: flat (below the shortest calibrated length) and per length, for
    every source alike unless a source has thresholds of its own (by_source: LAST_HIDDEN or a layer → them)."""

    max_distance: float
    by_length: dict[int, float] = field(default_factory=dict)  # min positions → threshold
    by_source: dict[int, ProjectionThresholds] = field(default_factory=dict)

    def at(self, positions: int) -> float:
        """Return the threshold for a response of this many generated positions."""
        bucket = select_length_bucket(set(self.by_length), positions)
        return self.max_distance if bucket is None else self.by_length[bucket]

    def for_source(self, source: int) -> ProjectionThresholds:
        """Return the thresholds that apply to one source's distance."""
        return self.by_source.get(source, self)


def require_registered_kind(blob: bytes, kinds: tuple[int, ...], model: str) -> int:
    """Return the blob's fingerprint kind, or raise if the model is not registered for it (kinds: its registration)."""
    kind = compute_fingerprint_kind(blob)
    if kind not in kinds:
        raise InvalidProjectionFingerprint(f"fingerprint kind {kind} is not registered for {model}",
                                           Reason.FINGERPRINT_KIND_NOT_REGISTERED)
    return kind


def decide_projection(m: ProjectionMeasurement, t: ProjectionThresholds, positions: int) -> Reason:
    """Return FINGERPRINT_PROJECTION_DISTANCE when any source's distance exceeds its threshold for the length."""
    over = any(d > t.for_source(layer).at(positions) for layer, d in zip(m.layers, m.source_distances, strict=True))
    return Reason.FINGERPRINT_PROJECTION_DISTANCE if over else Reason.OK


def select_projection_rows(hidden: np.ndarray, layers: np.ndarray | None, recorded: tuple[int, ...],
                           spec: ProjectionSpec, prompt_rows: int) -> list[np.ndarray]:
    """Return per source of the spec the rows a kind-1 fingerprint covers: P − 1 … the last (one per token).

    `hidden` is the last hidden state (rows × hidden), `layers` the engine's recorded decoder layers
    (recorded[i] is layers[i]); a source the engine did not record is a configuration error.
    """
    out = []
    for source in spec.layers:
        if source == LAST_HIDDEN:
            rows = hidden
        elif layers is not None and source in recorded:
            rows = layers[recorded.index(source)]
        else:
            raise FatalError(f"the engine does not record decoder layer {source}", Reason.UNKNOWN_MODEL)
        out.append(np.asarray(rows[prompt_rows - 1:]))
    return out

"""Decision on fingerprint measurements: thresholds from a model profile, a typed reason out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from node.errors import Reason
from node.protocol.fingerprint import ChunkMeasurement


@dataclass(frozen=True)
class FingerprintThresholds:
    """Per-chunk upper bounds; a chunk above any of them fails."""

    max_exponent_mismatches: int
    max_mantissa_error_mean: float
    max_mantissa_error_median: float
    max_sign_mismatches: int


@dataclass(frozen=True)
class FingerprintDecision:
    """Outcome for a whole fingerprint: the first failing chunk and why."""

    reason: Reason
    chunk: int | None

    @property
    def valid(self) -> bool:
        """Check whether every chunk was within the thresholds."""
        return self.reason is Reason.OK


def find_chunk_violation(m: ChunkMeasurement, t: FingerprintThresholds) -> Reason:
    """Return the first threshold one chunk exceeds, or Reason.OK."""
    if m.exponent_mismatches > t.max_exponent_mismatches:
        return Reason.FINGERPRINT_EXPONENT_MISMATCH
    if m.mantissa_error_mean > t.max_mantissa_error_mean:
        return Reason.FINGERPRINT_MANTISSA_MEAN
    if m.mantissa_error_median > t.max_mantissa_error_median:
        return Reason.FINGERPRINT_MANTISSA_MEDIAN
    if m.sign_mismatches > t.max_sign_mismatches:
        return Reason.FINGERPRINT_SIGN_MISMATCH
    return Reason.OK


def decide_fingerprint(measurements: Sequence[ChunkMeasurement], t: FingerprintThresholds) -> FingerprintDecision:
    """Return the decision over all chunks (the first failing chunk wins)."""
    for j, m in enumerate(measurements):
        reason = find_chunk_violation(m, t)
        if reason is not Reason.OK:
            return FingerprintDecision(reason, j)
    return FingerprintDecision(Reason.OK, None)

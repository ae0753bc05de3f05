"""Typed errors of the spot-check protocol; each names the device it is about and carries a spot-check code."""

from __future__ import annotations

from enum import StrEnum

from node.protocol.errors import InvalidInput, Reason


class SpotCode(StrEnum):
    """Why a challenge or an answer was refused (the wire's error codes and the verifier's counters)."""

    MALFORMED = "malformed"
    OVERSIZED = "oversized"
    REPLAYED_NONCE = "replayed_nonce"
    UNKNOWN_DEVICE = "unknown_device"
    LATE_ANSWER = "late_answer"
    MISMATCHED_ANSWER = "mismatched_answer"
    BAD_PARAMS = "bad_params"
    BAD_SIGNATURE = "bad_signature"
    UNKNOWN_VERIFIER = "unknown_verifier"
    EXPIRED_CHALLENGE = "expired_challenge"


_REASONS = {
    SpotCode.MALFORMED: Reason.WIRE_MALFORMED,
    SpotCode.OVERSIZED: Reason.WIRE_TOO_LARGE,
    SpotCode.REPLAYED_NONCE: Reason.NON_CANONICAL,
    SpotCode.UNKNOWN_DEVICE: Reason.OUT_OF_RANGE,
    SpotCode.LATE_ANSWER: Reason.LIMIT_EXCEEDED,
    SpotCode.MISMATCHED_ANSWER: Reason.WIRE_MALFORMED,
    SpotCode.BAD_PARAMS: Reason.OUT_OF_RANGE,
    SpotCode.BAD_SIGNATURE: Reason.WIRE_MALFORMED,
    SpotCode.UNKNOWN_VERIFIER: Reason.OUT_OF_RANGE,
    SpotCode.EXPIRED_CHALLENGE: Reason.LIMIT_EXCEEDED,
}


class SpotcheckError(InvalidInput):
    """A challenge, answer or parameter set that the spot-check protocol refuses (the process keeps running)."""

    code: SpotCode = SpotCode.MALFORMED

    def __init__(self, message: str, *, device: str = "") -> None:
        super().__init__(f"{device}: {message}" if device else message, _REASONS[self.code])
        self.device = device


class MalformedMessage(SpotcheckError):
    """Bytes that are not one valid wire message (bad JSON, wrong fields, out-of-range values)."""

    code = SpotCode.MALFORMED


class OversizedMessage(SpotcheckError):
    """A frame longer than the wire's limit; its bytes are discarded unread."""

    code = SpotCode.OVERSIZED


class ReplayedNonce(SpotcheckError):
    """A challenge nonce this device (or the verifier) has already seen."""

    code = SpotCode.REPLAYED_NONCE


class UnknownDevice(SpotcheckError):
    """A challenge or answer for a device that is not the recipient or not registered."""

    code = SpotCode.UNKNOWN_DEVICE


class LateAnswer(SpotcheckError):
    """An answer that arrived after the latency bound X."""

    code = SpotCode.LATE_ANSWER


class MismatchedAnswer(SpotcheckError):
    """An answer whose device, sequence number, nonce or kind is not the outstanding challenge's."""

    code = SpotCode.MISMATCHED_ANSWER


class InvalidSpotParams(SpotcheckError):
    """Stuffing, challenge or policy parameters outside their domain."""

    code = SpotCode.BAD_PARAMS


class BadSignature(SpotcheckError):
    """A challenge or answer whose signature is malformed or not by the key it names."""

    code = SpotCode.BAD_SIGNATURE


class UnknownVerifier(SpotcheckError):
    """A challenge signed for a verifier that is not in the device's allow-list."""

    code = SpotCode.UNKNOWN_VERIFIER


class ExpiredChallenge(SpotcheckError):
    """A challenge issued too long ago (or too far in the future) for the device to answer it."""

    code = SpotCode.EXPIRED_CHALLENGE

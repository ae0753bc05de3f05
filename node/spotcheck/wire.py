"""Wire messages between pinger and device (pydantic, strict) and their length-prefixed framing (pure).

One frame = uint32 big-endian length ‖ UTF-8 JSON of one message, at most MAX_FRAME bytes. The decoder
never buffers an oversized frame: it reports it once and skips its bytes as they arrive, so a peer cannot
make either side hold more than MAX_FRAME bytes of one message.
"""

from __future__ import annotations

import struct
from typing import Annotated, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from node.spotcheck.answers import MAX_LABELS_PER_CHALLENGE, STATE_SKETCH_DIM
from node.spotcheck.errors import MalformedMessage, OversizedMessage, SpotCode

MAX_FRAME = 4096
HEADER = struct.Struct(">I")
HEX32 = r"^[0-9a-f]{64}$"
DEVICE_ID = r"^[A-Za-z0-9_.:-]{1,64}$"
ADDRESS = r"^0x[0-9a-fA-F]{40}$"
SIGNATURE = r"^[0-9a-f]{130}$"  # EIP-191 r ‖ s ‖ v, checked by node.spotcheck.auth


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    v: Literal[1] = 1
    device_id: str = Field(pattern=DEVICE_ID)


class Challenge(_Message):
    """"Return the LSH of your identifying state" or "the digest of these labels", seeded by a fresh nonce.

    Signed by the verifier it names (``node.spotcheck.auth``); issued_ms is the verifier's wall clock.
    """

    type: Literal["challenge"] = "challenge"
    seq: int = Field(ge=0, lt=1 << 62)
    nonce: str = Field(pattern=HEX32)
    kind: Literal["state", "labels"]
    count: int = Field(ge=0, le=MAX_LABELS_PER_CHALLENGE)
    issued_ms: int = Field(ge=0, lt=1 << 62)
    verifier: str = Field(pattern=ADDRESS)
    signature: str | None = Field(default=None, pattern=SIGNATURE)

    @model_validator(mode="after")
    def _count_fits_kind(self) -> Self:
        if (self.kind == "labels") != (self.count > 0):
            raise ValueError("a labels challenge names count >= 1 labels; a state challenge names none")
        return self


class Answer(_Message):
    """The device's answer: the state's sketch and the step it belongs to, or the labels' digest."""

    type: Literal["answer"] = "answer"
    seq: int = Field(ge=0, lt=1 << 62)
    nonce: str = Field(pattern=HEX32)
    kind: Literal["state", "labels"]
    step: int | None = Field(default=None, ge=0, lt=1 << 62)
    sketch: tuple[int, ...] | None = None
    digest: str | None = Field(default=None, pattern=HEX32)
    signature: str | None = Field(default=None, pattern=SIGNATURE)  # the operator's, over challenge ‖ answer

    @model_validator(mode="after")
    def _fields_fit_kind(self) -> Self:
        if self.kind == "state":
            if self.step is None or self.sketch is None or len(self.sketch) != STATE_SKETCH_DIM or self.digest:
                raise ValueError(f"a state answer carries a step and a {STATE_SKETCH_DIM}-entry sketch only")
            if any(not -(1 << 31) <= v < 1 << 31 for v in self.sketch):
                raise ValueError("sketch entries are int32")
        elif self.digest is None or self.sketch is not None or self.step is not None:
            raise ValueError("a labels answer carries a digest only")
        return self


class ErrorReply(_Message):
    """A refusal of a challenge, with the spot-check code (the device keeps running)."""

    type: Literal["error"] = "error"
    seq: int | None = Field(default=None, ge=0, lt=1 << 62)
    code: SpotCode
    message: str = Field(max_length=300)


Message = Annotated[Challenge | Answer | ErrorReply, Field(discriminator="type")]
_ADAPTER: TypeAdapter[Challenge | Answer | ErrorReply] = TypeAdapter(Message)


def parse_message(data: bytes) -> Challenge | Answer | ErrorReply:
    """Parse one frame's body strictly; anything else is MalformedMessage (never a crash)."""
    if len(data) > MAX_FRAME:
        raise OversizedMessage(f"message of {len(data)} bytes over the {MAX_FRAME}-byte limit")
    try:
        return _ADAPTER.validate_json(data, strict=True)
    except (ValidationError, UnicodeDecodeError, ValueError) as exc:
        first = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else str(exc)
        raise MalformedMessage(f"not a spot-check message: {first}"[:250]) from None


def encode_frame(message: Challenge | Answer | ErrorReply) -> bytes:
    """Return the framed bytes of one message (length prefix + compact JSON)."""
    body = message.model_dump_json(exclude_none=True).encode()
    if len(body) > MAX_FRAME:
        raise OversizedMessage(f"refusing to send a {len(body)}-byte message", device=message.device_id)
    return HEADER.pack(len(body)) + body


def encode_raw_frame(body: bytes) -> bytes:
    """Return arbitrary bytes framed (tests and fault injection send malformed bodies this way)."""
    return HEADER.pack(len(body)) + body


class FrameDecoder:
    """Split a byte stream into frame bodies; oversized frames come out as OversizedMessage and are skipped."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._skip = 0

    def feed(self, data: bytes) -> list[bytes | OversizedMessage]:
        """Take received bytes; return the complete frames (or oversize reports) they finish."""
        self._buffer += data
        out: list[bytes | OversizedMessage] = []
        while True:
            if self._skip:
                dropped = min(self._skip, len(self._buffer))
                del self._buffer[:dropped]
                self._skip -= dropped
                if self._skip:
                    return out
            if len(self._buffer) < HEADER.size:
                return out
            (length,) = HEADER.unpack_from(self._buffer)
            if length > MAX_FRAME:
                del self._buffer[:HEADER.size]
                self._skip = length
                out.append(OversizedMessage(f"frame of {length} bytes over the {MAX_FRAME}-byte limit"))
                continue
            if len(self._buffer) < HEADER.size + length:
                return out
            out.append(bytes(self._buffer[HEADER.size:HEADER.size + length]))
            del self._buffer[:HEADER.size + length]

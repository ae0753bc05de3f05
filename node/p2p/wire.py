"""The payload protocol's wire messages (`/verinfer/payload/1`), declared once, with strict parsers.

  request   uint32 length ‖ ASCII decimal inference id (1..78 digits, canonical, < 2^256)
  answer    uint8 status (0 found, 1 not found) ‖ uint32 length ‖ payload JSON bytes (≤ MAX_PAYLOAD)

A stream may carry several request/answer pairs in turn: the server waits `keepalive` seconds for the
next request after each answer, and a fetcher keeps a stream it read a whole answer from for its next
fetch to that peer, so a warm fetch skips the stream negotiation (multistream-select), which cost most
of a fetch. A peer that closes after one answer (the first version) is still served the same way.

The request is parsed byte by byte, not with `int()`: `int()` also takes a sign, whitespace,
underscores and non-ASCII digits ("٧" is 7), so one id would have many spellings and a negative
or huge one would reach the store, whose keys are uint256 (finding 5 of issue 15).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from node.errors import InvalidInput, Reason

UINT256_LIMIT = 2**256
MAX_ID_DIGITS = len(str(UINT256_LIMIT - 1))  # 78
MAX_REQUEST = MAX_ID_DIGITS  # bytes a request body may have; a longer length prefix is refused unread
MAX_PAYLOAD = 32 * 2**20
FOUND, NOT_FOUND = 0, 1
MAX_FETCHES_PER_PEER = 4  # payload streams a node opens to one peer at once (more wait their turn)
# payload streams a node serves to one peer at once, more are reset; twice the above, so an honest
# peer never meets it, even counting streams whose answer it has read but the server has not yet closed
MAX_STREAMS_PER_PEER = 2 * MAX_FETCHES_PER_PEER
ANSWER_HEADER = 5  # status byte and uint32 length
_DIGITS = frozenset(b"0123456789")


class PayloadRequest(BaseModel):
    """One request for the payload of an inference id (a uint256, as on chain)."""

    model_config = ConfigDict(frozen=True, strict=True, extra="forbid")

    inference_id: Annotated[int, Field(ge=0, lt=UINT256_LIMIT)]


def encode_payload_request(request: PayloadRequest) -> bytes:
    """Return the request's wire bytes: the length prefix and the canonical decimal id."""
    body = str(request.inference_id).encode("ascii")
    return len(body).to_bytes(4, "big") + body


def check_request_length(n: int) -> int:
    """Return a request's announced body length, or raise InvalidInput before anything is read."""
    if n == 0:
        raise InvalidInput("empty payload request", Reason.TRUNCATED)
    if n > MAX_REQUEST:
        raise InvalidInput(f"payload request of {n} bytes exceeds {MAX_REQUEST}", Reason.WIRE_TOO_LARGE)
    return n


def decode_payload_request(body: bytes) -> PayloadRequest:
    """Parse a request body strictly (ASCII digits only, no sign, space or leading zero, < 2^256)."""
    check_request_length(len(body))
    bad = next((i for i, b in enumerate(body) if b not in _DIGITS), None)
    if bad is not None:
        raise InvalidInput(f"byte 0x{body[bad]:02x} is not an ASCII digit", Reason.WIRE_MALFORMED, position=bad)
    if len(body) > 1 and body[0] == ord("0"):
        raise InvalidInput("inference id with a leading zero", Reason.NON_CANONICAL, position=0)
    value = int(body.decode("ascii"))  # ASCII digits only, at most 78 of them: cheap and exact
    if value >= UINT256_LIMIT:
        raise InvalidInput("inference id is not a uint256", Reason.OUT_OF_RANGE)
    return PayloadRequest(inference_id=value)


def encode_answer(body: bytes | None) -> bytes:
    """Return an answer's wire bytes: found with the body, or not found."""
    if body is None:
        return bytes([NOT_FOUND]) + (0).to_bytes(4, "big")
    if len(body) > MAX_PAYLOAD:
        raise InvalidInput(f"answer of {len(body)} bytes exceeds {MAX_PAYLOAD}", Reason.WIRE_TOO_LARGE)
    return bytes([FOUND]) + len(body).to_bytes(4, "big") + body


def decode_answer_header(header: bytes) -> tuple[int, int]:
    """Return (status, body length) of an answer header, or raise InvalidInput for a broken one."""
    if len(header) != ANSWER_HEADER:
        raise InvalidInput(f"answer header of {len(header)} bytes", Reason.TRUNCATED)
    status, n = header[0], int.from_bytes(header[1:], "big")
    if status not in (FOUND, NOT_FOUND):
        raise InvalidInput(f"answer status {status}", Reason.WIRE_MALFORMED)
    if n > MAX_PAYLOAD:
        raise InvalidInput(f"answer of {n} bytes exceeds {MAX_PAYLOAD}", Reason.WIRE_TOO_LARGE)
    if status == NOT_FOUND and n != 0:
        raise InvalidInput(f"not-found answer with {n} bytes", Reason.NON_CANONICAL)
    return status, n

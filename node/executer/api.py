"""Wire messages of the executer's OpenAI-compatible API, declared once (pydantic v2).

Requests accept the OpenAI fields we honour and reject what we cannot do (n > 1, streaming, unknown
fields) with a clear message; verinfer's own fields arrive through the openai client's ``extra_body``,
which it merges into the JSON body.

Every model here crosses a process, so every field is strict (no "1" for 1, no true for 1), ranged
(uint64 seeds, uint256 ids, uint32 token ids) and bounded (no peer makes us allocate more than the
protocol's own limits), and unknown fields are refused. The payload a validator fetches is the most
exposed: any operator endpoint or libp2p peer can send one, so it is checked here down to its base64.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from typing import Annotated, Any, Literal, Self, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)

from node.protocol.artifact import MAX_OUTPUT_TOKENS, MAX_WIRE_BYTES
from node.protocol.errors import InvalidInput, Reason
from node.protocol.fingerprint import CHUNK_BASE64_CHARS, CHUNK_BYTES, MAX_FINGERPRINT_CHUNKS
from node.protocol.projection import KIND_PROJECTION

MAX_TOP_LOGPROBS = 20
MAX_MODEL_NAME_CHARS = 256
# What one request's text may hold: the executer's HTTP body limit (8 MiB), so that whatever the
# executer accepted, its payload passes a validator's parse. A chat template adds tokens per message,
# so more messages than MAX_MESSAGES could never fit the artifact's prompt limit anyway.
MAX_TEXT_CHARS = 8 * 2**20
MAX_MESSAGES = 2**16
MAX_ARTIFACT_BASE64_CHARS = 4 * -(-MAX_WIRE_BYTES // 3)
# The largest payload JSON a valid inference can produce (artifact, proofs, text with JSON escapes, slack).
MAX_PAYLOAD_BYTES = MAX_ARTIFACT_BASE64_CHARS + MAX_FINGERPRINT_CHUNKS * (CHUNK_BASE64_CHARS + 3) \
    + 6 * MAX_TEXT_CHARS + 2**20

_M = TypeVar("_M", bound=BaseModel)
UINT32_MAX = 2**32 - 1
UINT64_MAX = 2**64 - 1
UINT256_MAX = 2**256 - 1

Role = Literal["system", "user", "assistant", "developer", "tool"]
StrictFloat = Annotated[float, Field(strict=True, allow_inf_nan=False)]
TokenId = Annotated[StrictInt, Field(ge=0, le=UINT32_MAX)]
Text = Annotated[StrictStr, Field(max_length=MAX_TEXT_CHARS)]
Hex32 = Annotated[StrictStr, Field(pattern=r"^0x[0-9a-fA-F]{64}$")]


class InvalidPayload(InvalidInput, ValueError):
    """A payload that does not parse: typed (a reason code) and still a ValueError for older callers."""


def _is_below(bound: int) -> Callable[[str], str]:
    def check(text: str) -> str:
        if int(text) > bound:  # the pattern already limits the digits, so int() is cheap
            raise ValueError(f"must be at most {bound}")
        return text
    return check


def _is_canonical_base64(low: int, high: int) -> Callable[[str], str]:
    def check(text: str) -> str:
        try:
            raw = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ValueError(f"not base64: {exc}") from exc
        if base64.b64encode(raw).decode("ascii") != text:  # one encoding per byte string
            raise ValueError("not canonical base64")
        if not low <= len(raw) <= high:
            raise ValueError(f"base64 of {len(raw)} bytes, expected {low}..{high}")
        return text
    return check


def _are_whole_pieces(pieces: list[str]) -> list[str]:
    """Check piece sizes by the blob's kind: TOPLOC chunks are 258 bytes each; a projection blob's pieces
    (kind byte 0x01 first) are 258 bytes except the last."""
    sizes = [len(base64.b64decode(p)) for p in pieces]
    projection = base64.b64decode(pieces[0])[:1] == bytes([KIND_PROJECTION]) if pieces else False
    whole = sizes[:-1] if projection else sizes
    if any(n != CHUNK_BYTES for n in whole):
        raise ValueError(f"fingerprint pieces must be {CHUNK_BYTES} bytes (a projection blob's last may be shorter)")
    return pieces


# Decimal strings, as the executer writes them: no sign, no leading zeros, no "_", no whitespace,
# ASCII digits only (Python's int() would take all of those, and Unicode digits too).
DecimalU64 = Annotated[StrictStr, Field(pattern=r"^(0|[1-9][0-9]{0,19})$"), AfterValidator(_is_below(UINT64_MAX))]
DecimalU256 = Annotated[StrictStr, Field(pattern=r"^(0|[1-9][0-9]{0,77})$"), AfterValidator(_is_below(UINT256_MAX))]
# A TOPLOC chunk is 258 bytes; a kind-1 (projection) blob travels as pieces of at most 258, the last shorter.
ProofChunk = Annotated[StrictStr, Field(max_length=CHUNK_BASE64_CHARS),
                       AfterValidator(_is_canonical_base64(1, CHUNK_BYTES))]
ArtifactBase64 = Annotated[StrictStr, Field(min_length=1, max_length=MAX_ARTIFACT_BASE64_CHARS),
                           AfterValidator(_is_canonical_base64(1, MAX_WIRE_BYTES))]


class ChatMessage(BaseModel):
    """One chat message: a role the chat templates know and string content (what promptHash binds)."""

    model_config = ConfigDict(extra="forbid")

    role: Role
    content: Text


def _check_text_total(texts: list[str]) -> None:
    if sum(len(t) for t in texts) > MAX_TEXT_CHARS:
        raise ValueError(f"the request's text exceeds {MAX_TEXT_CHARS} characters")


class _SamplingFields(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: StrictStr = Field(min_length=1, max_length=MAX_MODEL_NAME_CHARS)
    temperature: StrictFloat = Field(1.0, ge=0.0, le=100.0)
    top_p: StrictFloat = Field(1.0, gt=0.0, le=1.0)
    top_k: StrictInt = Field(0, ge=-1, le=UINT32_MAX)  # -1 and 0 both mean off
    max_tokens: StrictInt | None = Field(None, ge=0, le=MAX_OUTPUT_TOKENS)
    seed: StrictInt | None = Field(None, ge=0, le=UINT64_MAX)
    n: StrictInt = Field(1, ge=1, le=1)
    stream: Literal[False] = False
    # OpenAI fields clients often send at their neutral value; anything else would be silently ignored
    presence_penalty: StrictFloat | None = Field(None, ge=0.0, le=0.0)
    frequency_penalty: StrictFloat | None = Field(None, ge=0.0, le=0.0)
    stop: Literal[None] = None
    user: StrictStr | None = Field(None, max_length=MAX_MODEL_NAME_CHARS)
    # verinfer fields (extra_body)
    inference_id: StrictInt | StrictStr | None = None
    verification_proof_to_validate: Annotated[list[ProofChunk], AfterValidator(_are_whole_pieces)] | None = \
        Field(None, max_length=MAX_FINGERPRINT_CHUNKS)
    output_token_ids: list[TokenId] | None = Field(None, max_length=MAX_OUTPUT_TOKENS)

    @field_validator("inference_id")
    @classmethod
    def _parse_inference_id(cls, value: int | str | None) -> int | None:
        if isinstance(value, str):  # decimal or 0x-hex, as a uint256 is written in JSON; nothing looser
            text = value.lower()
            digits = text[2:] if text.startswith("0x") else text
            alphabet = "0123456789abcdef" if text.startswith("0x") else "0123456789"
            if not 0 < len(digits) <= 78 or any(c not in alphabet for c in digits):
                raise ValueError("inference_id must be a uint256 (integer, decimal or 0x-hex string)")
            value = int(digits, 16 if text.startswith("0x") else 10)
        if value is not None and not 0 <= value <= UINT256_MAX:
            raise ValueError("inference_id must be a uint256")
        return value


class ChatCompletionRequest(_SamplingFields):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)

    @model_validator(mode="after")
    def _check_size(self) -> Self:
        _check_text_total([m.content for m in self.messages])
        return self


class CompletionRequest(_SamplingFields):
    """POST /v1/completions."""

    prompt: Text = Field(min_length=1)
    logprobs: StrictInt | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)


class VerinferInfo(BaseModel):
    """What a validator needs to find and check this inference."""

    model_config = ConfigDict(extra="forbid")

    inference_id: DecimalU256
    user_seed: DecimalU64
    run_seed: Hex32
    model_id: Hex32
    prompt_hash: Hex32
    output_hash: Hex32
    artifact_root: Hex32
    fingerprint_hash: Hex32
    k: StrictInt = Field(ge=1, le=UINT32_MAX)
    artifact_url: StrictStr = Field(max_length=4096)
    payload_url: StrictStr = Field(max_length=4096)


class FingerprintCheck(BaseModel):
    """Verification-instance mode's answer: per-chunk measurements and the profile's decision."""

    model_config = ConfigDict(extra="forbid")

    valid: StrictBool
    reason: StrictStr
    profile: StrictStr
    calibrated: StrictBool
    chunks: list[dict[StrictStr, float | int]] = Field(max_length=MAX_FINGERPRINT_CHUNKS)


class ChatRequestBody(BaseModel):
    """The request a payload carries for a chat inference: the messages promptHash bound."""

    model_config = ConfigDict(extra="forbid")

    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)

    @model_validator(mode="after")
    def _check_size(self) -> Self:
        _check_text_total([m.content for m in self.messages])
        return self


class TextRequestBody(BaseModel):
    """The request a payload carries for a completion: the prompt text promptHash bound."""

    model_config = ConfigDict(extra="forbid")

    prompt: Text = Field(min_length=1)


def _parse_request_body(value: Any) -> dict[str, Any]:
    """Return a payload's request as the plain dict callers read, after a strict parse."""
    if isinstance(value, dict) and "messages" in value:
        return ChatRequestBody.model_validate(value).model_dump()
    if isinstance(value, dict) and "prompt" in value:
        return TextRequestBody.model_validate(value).model_dump()
    raise ValueError("request must be an object with either 'messages' or 'prompt'")


class _PayloadHead(BaseModel):
    """The fields every payload starts with: which model and inference, and the request as accepted.

    ``request`` stays a plain dict for its readers ({"messages": [{"role", "content"}, …]} or
    {"prompt": text}), but only after ChatRequestBody or TextRequestBody accepted it.
    """

    model_config = ConfigDict(extra="forbid")

    model: StrictStr = Field(min_length=1, max_length=MAX_MODEL_NAME_CHARS)
    model_id: Hex32
    inference_id: DecimalU256
    user_seed: DecimalU64
    request: dict[str, Any]

    @field_validator("request", mode="before")
    @classmethod
    def _parse_request(cls, value: Any) -> dict[str, Any]:
        return _parse_request_body(value)


class InferencePayload(_PayloadHead):
    """GET /v1/payloads/{inference_id}: everything a validator fetches for one inference."""

    artifact: ArtifactBase64  # base64 of the zstd wire form
    verification_proofs: Annotated[list[ProofChunk], AfterValidator(_are_whole_pieces)] = \
        Field(min_length=1, max_length=MAX_FINGERPRINT_CHUNKS)


class StockPayload(_PayloadHead):
    """GET /v1/payloads/{inference_id} for a stock-sampler model (docs/protocol.md §13.1): the request and the
    served tokens; no artifact and no fingerprint exist for a stock engine."""

    output_ids: list[TokenId] = Field(min_length=1, max_length=MAX_OUTPUT_TOKENS)


def decode_stock_payload(raw: bytes | bytearray | str) -> StockPayload:
    """Return the stock payload in raw JSON, or raise InvalidPayload (also a ValueError) saying why."""
    return _decode_model(StockPayload, raw)


def decode_inference_payload(raw: bytes | bytearray | str) -> InferencePayload:
    """Return the payload in raw JSON, or raise InvalidPayload (also a ValueError) saying why."""
    return _decode_model(InferencePayload, raw)


def _decode_model(model: type[_M], raw: bytes | bytearray | str) -> _M:
    """Return raw JSON as `model`, or raise InvalidPayload saying why (size first, before any parsing)."""
    if not isinstance(raw, (bytes, bytearray, str)):
        raise InvalidPayload("payload must be JSON bytes", Reason.WIRE_MALFORMED)
    if len(raw) > MAX_PAYLOAD_BYTES:
        raise InvalidPayload(f"payload of {len(raw)} bytes exceeds {MAX_PAYLOAD_BYTES}", Reason.WIRE_TOO_LARGE)
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "payload"
        raise InvalidPayload(f"{where}: {first['msg']}", Reason.WIRE_MALFORMED) from exc


class ErrorBody(BaseModel):
    """OpenAI-style error object."""

    model_config = ConfigDict(extra="forbid")

    message: StrictStr
    type: StrictStr
    param: StrictStr | None = None
    code: StrictStr | None = None

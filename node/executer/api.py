"""Wire messages of the executer's OpenAI-compatible API, declared once (pydantic v2).

Requests accept the OpenAI fields we honour and reject what we cannot do (n > 1, streaming) with
a clear message; verinfer's own fields arrive through the openai client's ``extra_body``, which
it merges into the JSON body.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_TOP_LOGPROBS = 20


class ChatMessage(BaseModel):
    """One chat message; only role and content are bound by promptHash."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str


class _SamplingFields(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str
    temperature: float = Field(1.0, ge=0.0, le=100.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1, le=2**32 - 1)  # -1 and 0 both mean off
    max_tokens: int | None = Field(None, ge=0, le=32_768)
    seed: int | None = Field(None, ge=0, le=2**64 - 1)
    n: int = Field(1, ge=1, le=1)
    stream: Literal[False] = False
    # verinfer fields (extra_body)
    inference_id: int | str | None = None
    verification_proof_to_validate: list[str] | None = None
    output_token_ids: list[int] | None = None

    @field_validator("inference_id")
    @classmethod
    def _parse_inference_id(cls, value: int | str | None) -> int | str | None:
        if isinstance(value, str):
            value = int(value, 0)
        if value is not None and not 0 <= value < 2**256:
            raise ValueError("inference_id must be a uint256")
        return value


class ChatCompletionRequest(_SamplingFields):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)


class CompletionRequest(_SamplingFields):
    """POST /v1/completions."""

    prompt: str = Field(min_length=1)
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)


class VerinferInfo(BaseModel):
    """What a validator needs to find and check this inference."""

    inference_id: str
    user_seed: str
    run_seed: str
    model_id: str
    prompt_hash: str
    output_hash: str
    artifact_root: str
    fingerprint_hash: str
    k: int
    artifact_url: str
    payload_url: str


class FingerprintCheck(BaseModel):
    """Verification-instance mode's answer: per-chunk measurements and the profile's decision."""

    valid: bool
    reason: str
    profile: str
    calibrated: bool
    chunks: list[dict[str, float | int]]


class InferencePayload(BaseModel):
    """GET /v1/payloads/{inference_id}: everything a validator fetches for one inference."""

    model: str
    model_id: str
    inference_id: str
    user_seed: str
    request: dict[str, Any]
    artifact: str  # base64 of the zstd wire form
    verification_proofs: list[str]


class ErrorBody(BaseModel):
    """OpenAI-style error object."""

    message: str
    type: str
    param: str | None = None
    code: str | None = None

"""The executer's OpenAI-compatible HTTP API (aiohttp).

Routes: GET /v1/models, POST /v1/chat/completions, POST /v1/completions (non-streaming),
GET /v1/artifacts/{root} (zstd wire bytes), GET /v1/payloads/{inference_id} (JSON), GET /health.
Every generated choice carries ``verification_proofs`` and the response a ``verinfer`` object.
A chat request with ``max_tokens=0`` and ``verification_proof_to_validate`` is answered in
verification-instance mode: one prefill, fingerprint measurements and the profile's decision.

Access (``ApiSettings``): the generating and verifying routes (``/v1/chat/completions``,
``/v1/completions``) may require ``Authorization: Bearer <key>`` and pass an admission door in front
of the one engine: a bounded queue (full: 503) and a per-client limit (over it: 429), both with
``Retry-After``, decided before the body is read, so a refused request costs no work. The read-only
routes stay open on purpose: validators fetch ``/v1/payloads/{id}`` and ``/v1/artifacts/{root}``
without any key, and what they fetch is checked against the commitments on chain anyway;
``/v1/models`` and ``/health`` reveal nothing that is not public.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import re
import time
import tomllib
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import numpy as np
from aiohttp import web
from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict

from node.errors import FatalError, InvalidInput, Reason, VerinferError
from node.executer.api import (
    ChatCompletionRequest,
    CompletionRequest,
    ErrorBody,
    FingerprintCheck,
    VerinferInfo,
)
from node.executer.service import ExecuterService, ServedInference
from node.executer.stock import StockServed, StockService
from node.protocol.artifact import MAX_OUTPUT_TOKENS, MAX_PROMPT_TOKENS
from node.protocol.fingerprint import decode_fingerprint_base64, encode_fingerprint_base64
from node.protocol.prompt import compute_prompt_hash, normalise_messages
from node.protocol.sampler import SamplingParams
from node.protocol.seed import run_seed
from node.protocol.stock import STOCK_ARTIFACT_ROOT

log = logging.getLogger(__name__)

DEFAULT_MAX_TOKENS = 256
SERVICE_KEY: web.AppKey[ExecuterService | StockService] = web.AppKey("service")
PROFILE_KEY = web.AppKey("profile", dict)
LIMIT_KEY: web.AppKey[PromptLimit] = web.AppKey("prompt_limit")
LOCK_KEY = web.AppKey("engine_lock", asyncio.Lock)
DISCONNECT_POLL_S = 0.1  # how often a queued request looks whether its client is still there
SHA256_PREFIX = "sha256:"
MAX_BODY_BYTES = 8 * 2**20
# The deepest JSON a request needs is 4 (body → messages → message → content); the parser is never given more.
MAX_JSON_DEPTH = 32
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


class ApiError(Exception):
    """An error answered to the client as an OpenAI-style JSON body."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.body = status, ErrorBody(message=message, type=kind, param=param, code=code)
        self.headers = headers or {}


def _error_response(err: ApiError) -> web.Response:
    return web.json_response({"error": err.body.model_dump()}, status=err.status, headers=err.headers)


class ApiSettings(BaseSettings):
    """Who may call the generating routes and how many requests may wait for the engine (TOML + env)."""

    model_config = SettingsConfigDict(env_prefix="VERINFER_API_", extra="forbid", frozen=True)

    keys: Annotated[list[SecretStr], NoDecode] = Field(
        default_factory=list, description="accepted bearer keys, each the key itself or 'sha256:<hex of its "
        "sha256>'; VERINFER_API_KEYS takes them comma-separated; empty: no key needed")
    max_queue: int = Field(16, ge=1, description="admitted requests waiting for the engine, all clients together; "
                           "one more is answered 503")
    max_concurrent_per_client: int = Field(4, ge=1, description="requests one client (its key, or its IP address "
                                           "when no keys are set) may have running or waiting; one more is 429")
    queue_timeout: float = Field(120.0, gt=0, description="seconds a request may wait for the engine before a 503")
    retry_after: int = Field(1, ge=0, description="seconds sent as Retry-After with a 429 or 503")

    @classmethod
    def settings_customise_sources(
        cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Environment variables win over the TOML file's values (passed as init arguments)."""
        return env_settings, init_settings

    @field_validator("keys", mode="before")
    @classmethod
    def _split_keys(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [k.strip() for k in value.split(",") if k.strip()]
        return value

    @field_validator("keys")
    @classmethod
    def _check_keys(cls, keys: list[SecretStr]) -> list[SecretStr]:
        for key in keys:
            text = key.get_secret_value()
            if not text.strip() or text != text.strip():
                raise ValueError("an API key must be non-empty, without surrounding spaces")
            if text.startswith(SHA256_PREFIX):
                digest = text.removeprefix(SHA256_PREFIX)
                if len(digest) != 64 or any(c not in "0123456789abcdefABCDEF" for c in digest):
                    raise ValueError("a hashed API key is 'sha256:' and 64 hex digits")
        return keys

    def compute_key_digests(self) -> tuple[bytes, ...]:
        """Return the sha256 of every accepted key (the stored hash as it is for 'sha256:' entries)."""
        digests = []
        for key in self.keys:
            text = key.get_secret_value()
            if text.startswith(SHA256_PREFIX):
                digests.append(bytes.fromhex(text.removeprefix(SHA256_PREFIX)))
            else:
                digests.append(hashlib.sha256(text.encode("utf-8")).digest())
        return tuple(digests)


def load_api_settings(path: Path | None, **overrides: Any) -> ApiSettings:
    """Return the API settings from a TOML file (optional) with VERINFER_API_* variables and overrides on top."""
    values: dict[str, Any] = tomllib.loads(path.read_text()) if path else {}
    values.update(overrides)
    return ApiSettings(**values)


def get_default_api_settings() -> ApiSettings:
    """Return the defaults, environment not read: an open API with the default limits (devnets, tests)."""
    return ApiSettings.model_construct()


class _Ticket:
    """One admitted request: counted in its client's slots, and in the queue until it reaches the engine."""

    def __init__(self, client: str) -> None:
        self.client, self.queued = client, True


_TICKET: ContextVar[_Ticket] = ContextVar("verinfer_api_ticket")


class Admission:
    """The door in front of the one engine: bearer keys, a bounded queue and a per-client limit.

    Counts only requests it admitted; the engine lock (``LOCK_KEY``) stays the one thing that
    serialises the engine. Whatever way a request ends (answer, error, timeout, client gone,
    cancellation) its slots are given back in one ``finally``.
    """

    def __init__(self, settings: ApiSettings, engine_lock: asyncio.Lock) -> None:
        self.settings, self.engine_lock = settings, engine_lock
        self._digests = settings.compute_key_digests()
        self.waiting = 0  # admitted, not yet on the engine
        self.clients: Counter[str] = Counter()  # admitted and not yet answered, per client

    def _retry_headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.settings.retry_after)}

    def authenticate(self, request: web.Request) -> str:
        """Return the client's name for the limits: its key's hash when keys are set, else its address."""
        if not self._digests:
            return f"ip:{request.remote}"
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise ApiError(401, "this executer needs an API key: send 'Authorization: Bearer <key>'",
                           code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
        presented = hashlib.sha256(token.strip().encode("utf-8")).digest()
        match = b""
        for digest in self._digests:  # every key compared, in constant time: no timing tells which or how close
            if hmac.compare_digest(digest, presented):
                match = digest
        if not match:
            raise ApiError(401, "invalid API key", code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
        return "key:" + match.hex()[:16]

    @asynccontextmanager
    async def admit(self, client: str) -> AsyncIterator[_Ticket]:
        """Hold a slot of the client's and one of the queue's for one request, or refuse it (429, 503)."""
        s = self.settings
        if self.clients[client] >= s.max_concurrent_per_client:
            log.info("api: refused %s: %d requests running or waiting", client, self.clients[client])
            raise ApiError(429, f"too many concurrent requests from this client (at most "
                           f"{s.max_concurrent_per_client}); retry later", kind="rate_limit_error",
                           code="rate_limit_exceeded", headers=self._retry_headers())
        if self.waiting >= s.max_queue:
            log.warning("api: queue full (%d waiting), refused %s", self.waiting, client)
            raise ApiError(503, "the executer is busy: its queue is full; retry later", kind="server_error",
                           code="queue_full", headers=self._retry_headers())
        ticket = _Ticket(client)
        self.clients[client] += 1
        self.waiting += 1
        try:
            yield ticket
        finally:
            if ticket.queued:
                self.waiting -= 1
            self.clients[client] -= 1
            if not self.clients[client]:
                del self.clients[client]

    async def _acquire_engine(self, request: web.Request, ticket: _Ticket) -> None:
        """Wait for the engine until it is free, the queue timeout passes (503) or the client leaves."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.queue_timeout
        acquire = asyncio.ensure_future(self.engine_lock.acquire())  # one waiter, so it keeps its place in line
        try:
            while not acquire.done():
                if request.transport is None or request.transport.is_closing():
                    log.info("api: %s left while queued", ticket.client)
                    raise ApiError(499, "client closed the request", code="client_closed")
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise ApiError(503, f"the executer is busy: no engine within {self.settings.queue_timeout:g} s; "
                                   "retry later", kind="server_error", code="queue_timeout",
                                   headers=self._retry_headers())
                await asyncio.wait([acquire], timeout=min(DISCONNECT_POLL_S, remaining))
        except BaseException:
            if acquire.done() and not acquire.cancelled():
                self.engine_lock.release()  # it got the engine just as this request gave up
            else:
                acquire.cancel()
            raise
        ticket.queued = False
        self.waiting -= 1

    async def run(self, request: web.Request, fn: Callable[..., Any], *args: Any) -> Any:
        """Run fn(*args) on the engine in a worker thread, after waiting for it in the admitted queue."""
        ticket = _TICKET.get()
        await self._acquire_engine(request, ticket)
        try:
            work = asyncio.ensure_future(asyncio.to_thread(fn, *args))
        except BaseException:
            self.engine_lock.release()
            raise
        # The lock is freed when the thread ends, not when this task does: a cancelled handler cannot
        # stop the engine, so the next request must not start on it meanwhile.
        work.add_done_callback(lambda _: self.engine_lock.release())
        return await asyncio.shield(work)


ADMISSION_KEY = web.AppKey("admission", Admission)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _guarded(handler: Handler) -> Handler:
    """Return the handler behind the API key check and the admission door."""

    async def guarded(request: web.Request) -> web.StreamResponse:
        admission = request.app[ADMISSION_KEY]
        client = admission.authenticate(request)
        async with admission.admit(client) as ticket:
            token = _TICKET.set(ticket)
            try:
                return await handler(request)
            finally:
                _TICKET.reset(token)

    return guarded


@web.middleware
async def error_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    """Turn every failure into an OpenAI-style JSON error; never leak a traceback to the client."""
    try:
        response: web.StreamResponse = await handler(request)
        return response
    except ApiError as err:
        return _error_response(err)
    except web.HTTPException as exc:
        return _error_response(ApiError(exc.status, exc.reason or "error", code=str(exc.status)))
    except InvalidInput as exc:
        return _error_response(ApiError(400, str(exc), code=exc.reason.name.lower()))
    except VerinferError as exc:
        log.exception("request failed")
        return _error_response(ApiError(500, str(exc), kind="server_error"))
    except Exception:  # the server must answer, and keep serving, whatever the engine did
        log.exception("unexpected error")
        return _error_response(ApiError(500, "internal error", kind="server_error"))


def measure_json_depth(raw: bytes) -> int:
    """Return the deepest nesting of arrays and objects in JSON text, without parsing it (brackets inside strings
    do not count; text that is not JSON gets a number all the same, and the parser refuses it afterwards)."""
    if raw.count(b"[") + raw.count(b"{") <= MAX_JSON_DEPTH:  # the common case: nothing to scan
        return raw.count(b"[") + raw.count(b"{")
    brackets = _JSON_STRING.sub(b"", raw).translate(None, _NOT_BRACKETS)
    if not brackets:
        return 0
    steps = np.frombuffer(brackets, dtype=np.uint8)
    return int(np.cumsum(np.where((steps == ord("[")) | (steps == ord("{")), 1, -1), dtype=np.int32).max())


async def _parse(request: web.Request, model: type[Any]) -> Any:
    raw = await request.read()  # at most client_max_size bytes (413 beyond)
    depth = measure_json_depth(raw)
    if depth > MAX_JSON_DEPTH:  # before the parser: deep nesting crashes the process, not just the request
        raise ApiError(400, f"request body nests {depth} levels deep; at most {MAX_JSON_DEPTH} are accepted",
                       code="json_too_deep")
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise ApiError(400, f"request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        raise ApiError(400, f"invalid request: {param}: {first['msg']}", param=param) from exc


@dataclass(frozen=True)
class PromptLimit:
    """How long a prompt may be: the model's context in tokens, and the most characters any one token covers."""

    context: int  # prompt + output tokens the model takes (its max_position_embeddings, within the protocol's cap)
    chars_per_token: int

    def check_chars(self, chars: int, param: str = "messages") -> None:
        """Refuse text that cannot fit the context whatever it tokenises to (before the tokenizer sees it)."""
        if chars > 2 * self.chars_per_token * self.context:  # x2: normalisers may merge characters
            raise ApiError(400, f"the prompt of {chars} characters cannot fit the model's context of {self.context} "
                           "tokens", param=param, code="context_length_exceeded")

    def check_tokens(self, prompt: int, output: int, param: str = "messages") -> None:
        """Refuse a prompt whose tokens and the requested output exceed the model's context."""
        if prompt > MAX_PROMPT_TOKENS or prompt + output > self.context:
            raise ApiError(400, f"the prompt of {prompt} tokens and {output} output tokens exceed the model's context "
                           f"of {self.context} tokens", param=param, code="context_length_exceeded")


def load_prompt_limit(service: ExecuterService | StockService) -> PromptLimit:
    """Return the prompt limit of the served model (its config.json and its tokenizer's vocabulary)."""
    config_path = service.files.path / "config.json"
    config = json.loads(config_path.read_text()) if config_path.exists() else {}
    context = int(config.get("max_position_embeddings") or MAX_PROMPT_TOKENS)
    longest = max((len(t) for t in service.tokenizer.hf.get_vocab()), default=1)
    return PromptLimit(min(context, MAX_PROMPT_TOKENS + MAX_OUTPUT_TOKENS), max(longest, 1))


def _service(request: web.Request, model: str) -> ExecuterService | StockService:
    service = request.app[SERVICE_KEY]
    if model != service.files.spec.name:
        raise ApiError(404, f"model {model!r} is not served here; try GET /v1/models", param="model",
                       code="model_not_found")
    return service


def _params(req: ChatCompletionRequest | CompletionRequest) -> SamplingParams:
    max_tokens = DEFAULT_MAX_TOKENS if req.max_tokens is None else req.max_tokens
    if max_tokens < 1:
        raise ApiError(400, "max_tokens must be >= 1 (0 only with verification_proof_to_validate)",
                       param="max_tokens")
    return SamplingParams(req.temperature, req.top_p, max(req.top_k, 0), max_tokens)


async def _run(request: web.Request, fn: Any, *args: Any) -> Any:
    # one engine, one request at a time, in a thread: the loop stays free
    return await request.app[ADMISSION_KEY].run(request, fn, *args)


def _verinfer_info(request: web.Request, s: ServedInference, service: ExecuterService) -> dict[str, Any]:
    base = f"{request.scheme}://{request.host}"
    return VerinferInfo(
        inference_id=str(s.inference_id), user_seed=str(s.user_seed), run_seed="0x" + s.artifact.header.run_seed.hex(),
        model_id="0x" + service.files.model_id.hex(), prompt_hash="0x" + s.prompt_hash.hex(),
        output_hash="0x" + s.output_hash.hex(), artifact_root="0x" + s.artifact.root.hex(),
        fingerprint_hash="0x" + s.fingerprint_hash.hex(), k=service.k,
        artifact_url=f"{base}/v1/artifacts/0x{s.artifact.root.hex()}",
        payload_url=f"{base}/v1/payloads/{s.inference_id}",
    ).model_dump()


def _refuse_for_stock(logprobs: Any, proofs: Any) -> None:
    """Raise ApiError for what a stock-sampler model cannot answer: logprobs and fingerprint checks."""
    if logprobs:
        raise ApiError(400, "logprobs are not kept for a stock-sampler model", param="logprobs")
    if proofs is not None:
        raise ApiError(400, "a stock-sampler model has no fingerprints to verify",
                       param="verification_proof_to_validate")


def _stock_info(request: web.Request, s: StockServed, service: StockService) -> dict[str, Any]:
    """Return the verinfer block of a stock-sampler response: its commitment (docs/protocol.md §13.1)."""
    base = f"{request.scheme}://{request.host}"
    return {"inference_id": str(s.inference_id), "user_seed": str(s.user_seed),
            "run_seed": "0x" + run_seed(s.user_seed, s.inference_id).hex(),
            "model_id": "0x" + service.files.model_id.hex(), "prompt_hash": "0x" + s.prompt_hash.hex(),
            "output_hash": "0x" + s.output_hash.hex(), "artifact_root": "0x" + STOCK_ARTIFACT_ROOT.hex(),
            "fingerprint_hash": "0x" + s.fingerprint_hash.hex(), "sampler": service.files.spec.sampler,
            "payload_url": f"{base}/v1/payloads/{s.inference_id}"}


def _stock_usage(prompt_ids: Any, s: StockServed) -> dict[str, int]:
    p, n = len(prompt_ids), len(s.output_ids)
    return {"prompt_tokens": p, "completion_tokens": n, "total_tokens": p + n}


def _usage(s: ServedInference) -> dict[str, int]:
    p, n = len(s.artifact.header.prompt_token_ids), len(s.generation.output_ids)
    return {"prompt_tokens": p, "completion_tokens": n, "total_tokens": p + n}


def _chat_logprobs(service: ExecuterService, s: ServedInference, top: int) -> dict[str, Any]:
    tok = service.tokenizer

    def entry(token_id: int, logprob: float) -> dict[str, Any]:
        text = tok.token_text(token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    content = []
    for sample in s.generation.samples:
        item = entry(sample.chosen, sample.chosen_raw_logprob)
        item["top_logprobs"] = [entry(t, lp) for t, lp in zip(sample.token_ids, sample.raw_logprobs, strict=True)][:top]
        content.append(item)
    return {"content": content}


async def chat_completions(request: web.Request) -> web.Response:
    """POST /v1/chat/completions."""
    req: ChatCompletionRequest = await _parse(request, ChatCompletionRequest)
    service = _service(request, req.model)
    if isinstance(service, StockService):
        _refuse_for_stock(req.logprobs, req.verification_proof_to_validate)
    elif req.max_tokens == 0 and req.verification_proof_to_validate is not None:
        return await _verify_chat(request, service, req)
    params = _params(req)
    limit = request.app[LIMIT_KEY]
    limit.check_chars(sum(len(m.content) for m in req.messages))
    messages = normalise_messages([m.model_dump() for m in req.messages])
    prompt_ids = service.tokenizer.encode_chat(messages)
    limit.check_tokens(len(prompt_ids), params.max_tokens)
    prompt_hash = compute_prompt_hash(service.files.model_id, messages=messages)
    if isinstance(service, StockService):
        stock: StockServed = await _run(request, service.infer, prompt_ids, prompt_hash, params, req.seed,
                                        req.inference_id, {"messages": messages})
        reply = {"role": "assistant", "content": service.tokenizer.decode(stock.output_ids)}
        return web.json_response({
            "id": f"chatcmpl-{stock.inference_id:064x}"[:40], "object": "chat.completion", "created": int(time.time()),
            "model": req.model, "choices": [{"index": 0, "message": reply, "logprobs": None,
                                             "finish_reason": "stop" if service.is_stop(stock) else "length"}],
            "usage": _stock_usage(prompt_ids, stock), "verinfer": _stock_info(request, stock, service)})
    s: ServedInference = await _run(request, service.infer, prompt_ids, prompt_hash, params, req.seed,
                                    req.inference_id, {"messages": messages})
    message = {"role": "assistant", "content": service.tokenizer.decode(s.generation.output_ids),
               "verification_proofs": encode_fingerprint_base64(s.fingerprint)}
    choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": s.generation.finish_reason,
                              "logprobs": None}
    if req.logprobs:
        choice["logprobs"] = _chat_logprobs(service, s, req.top_logprobs or 0)
    return web.json_response({
        "id": f"chatcmpl-{s.inference_id:064x}"[:40], "object": "chat.completion", "created": int(time.time()),
        "model": req.model, "choices": [choice], "usage": _usage(s), "verinfer": _verinfer_info(request, s, service),
    })


async def _verify_chat(request: web.Request, service: ExecuterService, req: ChatCompletionRequest) -> web.Response:
    """Verification-instance mode: the last message is the response to check; one prefill."""
    limit = request.app[LIMIT_KEY]
    limit.check_chars(sum(len(m.content) for m in req.messages))
    messages = normalise_messages([m.model_dump() for m in req.messages])
    if len(messages) < 2 or messages[-1]["role"] != "assistant":
        raise ApiError(400, "verification needs the response as the last, assistant, message", param="messages")
    prompt_ids = service.tokenizer.encode_chat(messages[:-1])
    if req.output_token_ids is not None:
        output_ids = tuple(req.output_token_ids)
    else:  # re-tokenise the text; a generation that stopped ends with the stop token, never shown as text
        output_ids = service.tokenizer.encode_response(messages[-1]["content"])
    if not output_ids:
        raise ApiError(400, "the response has no tokens", param="messages")
    limit.check_tokens(len(prompt_ids), len(output_ids))
    proofs = decode_fingerprint_base64(req.verification_proof_to_validate or [])
    report = await _run(request, service.check_fingerprint, prompt_ids, output_ids, proofs)
    profile = request.app[PROFILE_KEY]
    check = FingerprintCheck(
        valid=report.decision.valid, reason=report.decision.reason.name, profile=profile["path"],
        calibrated=profile["calibrated"],
        chunks=[{"exponent_mismatches": m.exponent_mismatches, "sign_mismatches": m.sign_mismatches,
                 "mantissa_error_mean": m.mantissa_error_mean, "mantissa_error_median": m.mantissa_error_median,
                 "mantissa_compared": m.mantissa_compared} for m in report.measurements],
    )
    return web.json_response({"id": "chatcmpl-verification", "object": "chat.completion.verification",
                              "created": int(time.time()), "model": req.model, "choices": [],
                              "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(output_ids),
                                        "total_tokens": len(prompt_ids) + len(output_ids)},
                              "verification": check.model_dump()})


async def completions(request: web.Request) -> web.Response:
    """POST /v1/completions."""
    req: CompletionRequest = await _parse(request, CompletionRequest)
    service = _service(request, req.model)
    params = _params(req)
    limit = request.app[LIMIT_KEY]
    limit.check_chars(len(req.prompt), "prompt")
    prompt_ids = service.tokenizer.encode_text(req.prompt)
    limit.check_tokens(len(prompt_ids), params.max_tokens, "prompt")
    prompt_hash = compute_prompt_hash(service.files.model_id, prompt=req.prompt)
    if isinstance(service, StockService):
        _refuse_for_stock(req.logprobs, None)
        stock: StockServed = await _run(request, service.infer, prompt_ids, prompt_hash, params, req.seed,
                                        req.inference_id, {"prompt": req.prompt})
        return web.json_response({
            "id": f"cmpl-{stock.inference_id:064x}"[:40], "object": "text_completion", "created": int(time.time()),
            "model": req.model, "choices": [{"index": 0, "text": service.tokenizer.decode(stock.output_ids),
                                             "logprobs": None,
                                             "finish_reason": "stop" if service.is_stop(stock) else "length"}],
            "usage": _stock_usage(prompt_ids, stock), "verinfer": _stock_info(request, stock, service)})
    s: ServedInference = await _run(request, service.infer, prompt_ids, prompt_hash, params, req.seed,
                                    req.inference_id, {"prompt": req.prompt})
    choice: dict[str, Any] = {"index": 0, "text": service.tokenizer.decode(s.generation.output_ids),
                              "finish_reason": s.generation.finish_reason, "logprobs": None,
                              "verification_proofs": encode_fingerprint_base64(s.fingerprint)}
    if req.logprobs is not None:
        tok = service.tokenizer
        samples = s.generation.samples
        choice["logprobs"] = {
            "tokens": [tok.token_text(x.chosen) for x in samples],
            "token_logprobs": [x.chosen_raw_logprob for x in samples],
            "top_logprobs": [{tok.token_text(t): lp for t, lp in list(zip(x.token_ids, x.raw_logprobs, strict=True))
                              [:req.logprobs]} for x in samples],
        }
    return web.json_response({
        "id": f"cmpl-{s.inference_id:064x}"[:40], "object": "text_completion", "created": int(time.time()),
        "model": req.model, "choices": [choice], "usage": _usage(s), "verinfer": _verinfer_info(request, s, service),
    })


async def list_models(request: web.Request) -> web.Response:
    """GET /v1/models."""
    service = request.app[SERVICE_KEY]
    return web.json_response({"object": "list", "data": [{
        "id": service.files.spec.name, "object": "model", "created": 0, "owned_by": "verinfer",
        "verinfer": {"model_id": "0x" + service.files.model_id.hex(), "k": service.files.spec.k,
                     "vocab_size": service.files.spec.vocab_size, "chat": service.files.spec.chat,
                     "backend": service.info.backend, "dtype": service.info.dtype,
                     "sampler": service.files.spec.sampler},
    }]})


def _parse_int(text: str, what: str) -> int:
    try:
        return int(text, 0)
    except ValueError as exc:
        raise ApiError(400, f"{what} must be an integer or 0x-hex, got {text!r}") from exc


async def get_artifact(request: web.Request) -> web.Response:
    """GET /v1/artifacts/{root}: the artifact's zstd wire bytes."""
    root_text = request.match_info["root"].removeprefix("0x")
    try:
        root = bytes.fromhex(root_text)
    except ValueError as exc:
        raise ApiError(400, "artifact root must be 32 bytes of hex") from exc
    service = request.app[SERVICE_KEY]
    wire = None if isinstance(service, StockService) else service.artifact_wire(root)
    if wire is None:
        raise ApiError(404, "unknown artifact root", code="not_found")
    return web.Response(body=wire, content_type="application/octet-stream")


async def get_payload(request: web.Request) -> web.Response:
    """GET /v1/payloads/{inference_id}: request, artifact and fingerprint of one inference."""
    service = request.app[SERVICE_KEY]
    body = service.payload_json(_parse_int(request.match_info["inference_id"], "inference id"))
    if body is None:
        raise ApiError(404, "unknown inference id", code="not_found")
    return web.Response(body=body, content_type="application/json")


async def health(request: web.Request) -> web.Response:
    """GET /health."""
    return web.json_response({"status": "ok", "model": request.app[SERVICE_KEY].files.spec.name})


def create_app(service: ExecuterService | StockService, profile_path: str, calibrated: bool,
               settings: ApiSettings | None = None, workload: Any = None) -> web.Application:
    """Return the aiohttp application serving one executer (settings None: open, default limits).

    ``workload``: a WorkloadRecord to serve read-only under /v1/workload/, behind the API keys; it
    holds prompts, outputs and tensors, so it is never served without a key (refused at start-up).
    """
    app = web.Application(middlewares=[error_middleware], client_max_size=MAX_BODY_BYTES)
    app[SERVICE_KEY] = service
    app[PROFILE_KEY] = {"path": profile_path, "calibrated": calibrated}
    app[LIMIT_KEY] = load_prompt_limit(service)
    app[LOCK_KEY] = asyncio.Lock()
    app[ADMISSION_KEY] = Admission(settings or get_default_api_settings(), app[LOCK_KEY])
    app.add_routes([
        web.get("/v1/models", list_models),
        web.post("/v1/chat/completions", _guarded(chat_completions)),
        web.post("/v1/completions", _guarded(completions)),
        web.get("/v1/artifacts/{root}", get_artifact),
        web.get("/v1/payloads/{inference_id}", get_payload),
        web.get("/health", health),
    ])
    moe = getattr(service, "moe", None)
    if moe is not None:  # duty slices and openings, open to anyone as the payloads are (node.moe.serve)
        from node.moe.serve import add_moe_routes

        add_moe_routes(app, moe.slices)
    if workload is not None:
        from node.workload.http import create_workload_app

        digests = (settings or get_default_api_settings()).compute_key_digests()
        if not digests:
            raise FatalError("the workload record is served only behind API keys: set keys in --api-config "
                             "or VERINFER_API_KEYS", Reason.OUT_OF_RANGE)
        app.add_subapp("/v1/workload", create_workload_app(workload, digests, prefix=""))
    return app


__all__ = ["Admission", "ApiError", "ApiSettings", "create_app", "load_api_settings"]

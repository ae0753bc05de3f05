"""Read-only HTTP API over a workload record (aiohttp), for a verifier that does not copy the folder.

GET /v1/workload/graphs                  graph summaries, one page (?kind= &limit= &after=)
GET /v1/workload/graphs/{id}             one graph as JSON (MLIR text included; 413 above max_json_bytes)
GET /v1/workload/graphs/{id}/traces      ids of the traces that executed it, one page
GET /v1/workload/resolve?graph_id=       the recorded graph an id names (a pending key → its verification graph)
GET /v1/workload/missing?graph_id=&mode= what is missing to verify a graph (pending exports reported as such)
GET /v1/workload/traces                  trace ids, one page
GET /v1/workload/traces/{id}             one trace
GET /v1/workload/traces/{id}/tensors     the tensor references it recorded, one page (?role=)
GET /v1/workload/tensors/{sha256}        the tensor's safetensors bytes, re-verified, then streamed in chunks
GET /v1/workload/devices                 the device registry and links, one page each
Lists answer ``{"items": [...], "next": cursor | null}``; pass ``after=cursor`` for the next page
(``limit`` ≤ ``max_page``). Every route needs ``Authorization: Bearer <key>`` when keys are configured
(sha256 digests of the accepted keys, compared in constant time).

Abuse limits (``WorkloadApiLimits``), per key (the digest of the presented key; the peer address
when no keys are configured): a token bucket of requests (429 + Retry-After), a token bucket of
response bytes (a tensor flood is 429 once its bytes are spent), at most ``max_inflight_per_key``
requests in flight (429, never queued), and a global bound on blocking record reads so that one key
cannot occupy every worker thread. A tensor larger than ``max_tensor_bytes`` is 413 before its blob is
read; a JSON body above ``max_json_bytes`` is 413. Errors carry the typed reason (LIMIT_EXCEEDED for
413/429); bad ids are 404, a damaged object 409 (the verifier learns it is damaged).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import hmac
import json
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from node.errors import Reason
from node.workload.errors import InvalidObject, UnknownObject, WorkloadError
from node.workload.model import tensor_ref_from_json, to_json
from node.workload.query import compute_missing
from node.workload.store import WorkloadRecord, encode_safetensors

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
MAX_ID = 256


class WorkloadApiLimits(BaseModel):
    """Limits of the read API (operator configuration)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_page: int = Field(100, ge=1, le=10_000)
    max_json_bytes: int = Field(16 * 2**20, ge=256)
    max_tensor_bytes: int = Field(256 * 2**20, ge=1024)
    chunk_bytes: int = Field(2**20, ge=1024)
    requests_per_s: float = Field(20.0, gt=0)
    request_burst: float = Field(40.0, ge=1)
    bytes_per_s: float = Field(64.0 * 2**20, gt=0)
    bytes_burst: float = Field(256.0 * 2**20, ge=1024)
    max_inflight_per_key: int = Field(2, ge=1)
    max_inflight: int = Field(4, ge=1)


class LimitExceeded(WorkloadError):
    """A request over one of the API's limits (413 for size, 429 for rate)."""

    def __init__(self, message: str, status: int, retry_after: float = 0.0, *, obj: str) -> None:
        super().__init__(message, Reason.LIMIT_EXCEEDED, obj=obj)
        self.status = status
        self.retry_after = retry_after


@dataclass
class TokenBucket:
    """A refilling budget (requests or bytes)."""

    rate: float
    burst: float
    tokens: float
    stamp: float

    def take(self, amount: float, now: float) -> float:
        """Spend amount if available and return 0; else return the seconds until it would be."""
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if amount <= self.tokens:
            self.tokens -= amount
            return 0.0
        return (amount - self.tokens) / self.rate


@dataclass
class KeyState:
    """One reader's budgets and requests in flight."""

    requests: TokenBucket
    bytes: TokenBucket
    inflight: int = 0


@dataclass
class ApiState:
    """The per-app limiter state (event-loop confined: no locks needed)."""

    limits: WorkloadApiLimits
    reads: asyncio.Semaphore | None = None
    keys: dict[str, KeyState] = field(default_factory=dict)

    def get_key(self, key: str) -> KeyState:
        """Return (creating with full budgets) a reader's state; the table is bounded by evicting idle readers."""
        if key not in self.keys:
            if len(self.keys) >= 4096:
                for stale in [k for k, s in self.keys.items() if s.inflight == 0][:1024]:
                    del self.keys[stale]
            now, lim = time.monotonic(), self.limits
            self.keys[key] = KeyState(TokenBucket(lim.requests_per_s, lim.request_burst, lim.request_burst, now),
                                      TokenBucket(lim.bytes_per_s, lim.bytes_burst, lim.bytes_burst, now))
        return self.keys[key]


RECORD_KEY: web.AppKey[WorkloadRecord] = web.AppKey("workload_record", WorkloadRecord)
STATE_KEY: web.AppKey[ApiState] = web.AppKey("workload_api_state", ApiState)
READER_KEY = "workload_reader"  # request-scoped: the reader's limiter key


def get_presented_digest(header: str | None) -> bytes | None:
    """Return sha256 of a bearer key, or None without one."""
    if not header or not header.startswith("Bearer "):
        return None
    return hashlib.sha256(header[7:].encode()).digest()


def is_authorized(header: str | None, digests: Sequence[bytes]) -> bool:
    """Check a bearer header against the accepted key digests (every digest compared, constant time)."""
    if not digests:
        return True
    presented = get_presented_digest(header)
    if presented is None:
        return False
    ok = False
    for digest in digests:
        ok |= hmac.compare_digest(presented, digest)
    return ok


def _error(exc: WorkloadError, status: int) -> web.Response:
    headers = {}
    if isinstance(exc, LimitExceeded) and exc.retry_after > 0:
        headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after)))
    return web.json_response({"error": str(exc), "reason": exc.reason.name, "object": exc.obj}, status=status,
                             headers=headers)


def _middleware(digests: Sequence[bytes]) -> Any:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        header = request.headers.get("Authorization")
        if not is_authorized(header, digests):
            return web.json_response({"error": "a workload-record key is required"}, status=401,
                                     headers={"WWW-Authenticate": "Bearer"})
        if any(len(v) > MAX_ID for v in request.match_info.values()):
            return web.json_response({"error": "id too long"}, status=400)
        presented = get_presented_digest(header)
        reader = presented.hex() if digests and presented else f"peer:{request.remote}"
        state = request.app[STATE_KEY]
        key = state.get_key(reader)
        wait = key.requests.take(1.0, time.monotonic())
        try:
            if wait > 0:
                raise LimitExceeded("request rate over the limit", 429, wait, obj=request.path)
            if key.inflight >= state.limits.max_inflight_per_key:
                raise LimitExceeded("too many requests in flight for this key", 429, 1.0, obj=request.path)
        except LimitExceeded as exc:
            return _error(exc, exc.status)
        request[READER_KEY] = reader
        key.inflight += 1
        try:
            return await handler(request)
        except LimitExceeded as exc:
            return _error(exc, exc.status)
        except UnknownObject as exc:
            return _error(exc, 404)
        except InvalidObject as exc:
            return _error(exc, 400)
        except WorkloadError as exc:
            return _error(exc, 409)
        finally:
            key.inflight -= 1

    return middleware


async def _run(request: web.Request, fn: Callable[[WorkloadRecord], Any]) -> Any:
    """Run a blocking record read in a worker thread, at most max_inflight at a time across readers."""
    state = request.app[STATE_KEY]
    if state.reads is None:
        state.reads = asyncio.Semaphore(state.limits.max_inflight)
    async with state.reads:
        return await asyncio.to_thread(fn, request.app[RECORD_KEY])


def _charge_bytes(request: web.Request, size: int) -> None:
    """Spend a reader's byte budget, or raise 429 (the response is not produced)."""
    state = request.app[STATE_KEY]
    wait = state.get_key(request[READER_KEY]).bytes.take(float(size), time.monotonic())
    if wait > 0:
        raise LimitExceeded(f"byte rate over the limit ({size} bytes asked)", 429, wait, obj=request.path)


def _json(request: web.Request, data: Any) -> web.Response:
    """Return a JSON response within the size cap and the reader's byte budget."""
    body = json.dumps(data, separators=(",", ":")).encode()
    limit = request.app[STATE_KEY].limits.max_json_bytes
    if len(body) > limit:
        raise LimitExceeded(f"response of {len(body)} bytes over the {limit}-byte cap", 413, obj=request.path)
    _charge_bytes(request, len(body))
    return web.Response(body=body, content_type="application/json")


def _page_args(request: web.Request) -> tuple[str | None, int]:
    """Return (after, limit) from the query: after is an opaque hex cursor; limit capped at max_page."""
    limits = request.app[STATE_KEY].limits
    try:
        limit = int(request.query.get("limit", limits.max_page))
        after = request.query.get("after")
        decoded = None if after is None else bytes.fromhex(after).decode()
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidObject(f"bad page arguments ({exc})", obj=request.path) from exc
    if not 1 <= limit <= limits.max_page:
        raise InvalidObject(f"limit must lie in [1, {limits.max_page}]", obj=request.path)
    return decoded, limit


def _page(items: list[Any], cursors: list[str], limit: int) -> dict[str, Any]:
    """Return one page; `next` is the last item's cursor when the page is full."""
    return {"items": items, "next": cursors[-1].encode().hex() if len(items) == limit and cursors else None}


async def list_graphs(request: web.Request) -> web.Response:
    """Return graph summaries, one page."""
    after, limit = _page_args(request)
    kind = request.query.get("kind")

    def read(r: WorkloadRecord) -> dict[str, Any]:
        entries = r.graph_entries(after, limit)
        items = [{"graph_id": e["graph_id"], "kind": e["kind"], "name": e["name"], "parent_id": e.get("parent_id"),
                  "inputs": len(e["inputs"]), "outputs": len(e["outputs"]), "ops": len(e["ops"])}
                 for e in entries]
        page = _page(items, [str(e["graph_id"]) for e in entries], limit)
        page["items"] = [i for i in items if kind is None or i["kind"] == kind]  # filter within the page
        return page

    return _json(request, await _run(request, read))


async def get_graph(request: web.Request) -> web.Response:
    """Return one graph."""
    gid = request.match_info["graph_id"]
    return _json(request, await _run(request, lambda r: to_json(r.get_graph(gid))))


async def get_graph_traces(request: web.Request) -> web.Response:
    """Return the traces of a graph, one page."""
    gid = request.match_info["graph_id"]
    after, limit = _page_args(request)
    ids = await _run(request, lambda r: r.trace_ids_of_graph(gid, after, limit))
    return _json(request, _page(ids, ids, limit))


async def resolve_graph(request: web.Request) -> web.Response:
    """Return the recorded graph an id names, and the state of a pending export."""
    gid = _query_id(request, "graph_id")

    def read(r: WorkloadRecord) -> dict[str, Any]:
        resolved = r.resolve_graph_id(gid)
        pending = None if resolved is not None else compute_missing(r, gid).pending
        return {"graph_id": resolved, "pending": pending}

    return _json(request, await _run(request, read))


async def get_missing(request: web.Request) -> web.Response:
    """Return what is missing to verify a graph."""
    gid, mode = _query_id(request, "graph_id"), request.query.get("mode", "exact")

    def read(r: WorkloadRecord) -> dict[str, Any]:
        report = compute_missing(r, gid, mode)
        return {**dataclasses.asdict(report), "verifiable": report.is_verifiable}

    return _json(request, await _run(request, read))


def _query_id(request: web.Request, name: str) -> str:
    value = request.query.get(name, "")
    if not value or len(value) > MAX_ID:
        raise InvalidObject(f"query parameter {name} is missing or too long", obj=request.path)
    return value


async def list_traces(request: web.Request) -> web.Response:
    """Return trace ids, one page."""
    after, limit = _page_args(request)
    ids = await _run(request, lambda r: r.trace_ids(after, limit))
    return _json(request, _page(ids, ids, limit))


async def get_trace(request: web.Request) -> web.Response:
    """Return one trace."""
    tid = request.match_info["trace_id"]
    return _json(request, await _run(request, lambda r: to_json(r.get_trace(tid))))


async def get_trace_tensors(request: web.Request) -> web.Response:
    """Return the tensor references of a trace, one page (role filtered within the page)."""
    tid, role = request.match_info["trace_id"], request.query.get("role")
    after, limit = _page_args(request)
    refs = await _run(request, lambda r: r.tensor_refs_of_trace(tid, after, limit))
    cursors = [f"{ref.event_id or ''}\0{ref.name}" for ref in refs]
    page = _page([to_json(ref) for ref in refs], cursors, limit)
    page["items"] = [i for i in page["items"] if role is None or tensor_ref_from_json(i).role == role]
    return _json(request, page)


async def get_tensor(request: web.Request) -> web.StreamResponse:
    """Stream a tensor's safetensors bytes in chunks, verified against its address first (413 above the cap)."""
    sha = request.match_info["sha256"]
    limits = request.app[STATE_KEY].limits
    size = await _run(request, lambda r: r.get_tensor_size(sha))
    if size > limits.max_tensor_bytes:
        raise LimitExceeded(f"tensor of {size} bytes over the {limits.max_tensor_bytes}-byte cap", 413, obj=sha)
    _charge_bytes(request, size)
    body = await _run(request, lambda r: encode_safetensors(r.get_tensor(sha), sha))
    response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
    response.content_length = len(body)
    await response.prepare(request)
    view = memoryview(body)
    for start in range(0, len(body), limits.chunk_bytes):
        await response.write(view[start:start + limits.chunk_bytes])  # waits for a slow reader (bounded buffer)
    await response.write_eof()
    return response


async def get_devices(request: web.Request) -> web.Response:
    """Return the device registry and its links, one page of each."""
    after, limit = _page_args(request)

    def read(r: WorkloadRecord) -> dict[str, Any]:
        devices, links = r.devices(), r.links()
        page_devices = [d for d in devices if after is None or d.device_id > after][:limit]
        return {"devices": [to_json(d) for d in page_devices],
                "links": [to_json(x) for x in links if any(x.a == d.device_id for d in page_devices)],
                "next": page_devices[-1].device_id.encode().hex() if len(page_devices) == limit else None}

    return _json(request, await _run(request, read))


def create_workload_app(record: WorkloadRecord, key_digests: Sequence[bytes] = (), prefix: str = "/v1/workload",
                        limits: WorkloadApiLimits | None = None) -> web.Application:
    """Return the read-only workload API (prefix "": routes for mounting with add_subapp("/v1/workload", …))."""
    app = web.Application(middlewares=[_middleware(tuple(key_digests))])
    app[RECORD_KEY] = record
    app[STATE_KEY] = ApiState(limits or WorkloadApiLimits())
    app.router.add_get(f"{prefix}/graphs", list_graphs)
    app.router.add_get(f"{prefix}/graphs/{{graph_id}}", get_graph)
    app.router.add_get(f"{prefix}/graphs/{{graph_id}}/traces", get_graph_traces)
    app.router.add_get(f"{prefix}/resolve", resolve_graph)
    app.router.add_get(f"{prefix}/missing", get_missing)
    app.router.add_get(f"{prefix}/traces", list_traces)
    app.router.add_get(f"{prefix}/traces/{{trace_id:.+?}}/tensors", get_trace_tensors)
    app.router.add_get(f"{prefix}/traces/{{trace_id:.+}}", get_trace)
    app.router.add_get(f"{prefix}/tensors/{{sha256}}", get_tensor)
    app.router.add_get(f"{prefix}/devices", get_devices)
    return app

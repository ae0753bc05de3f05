"""Read-only HTTP API over a workload record (aiohttp), for a verifier that does not copy the folder.

GET /v1/workload/graphs                  graph summaries (?kind=)
GET /v1/workload/graphs/{id}             one graph as JSON (MLIR text included)
GET /v1/workload/graphs/{id}/traces      ids of the traces that executed it
GET /v1/workload/traces/{id}             one trace
GET /v1/workload/traces/{id}/tensors     the tensor references it recorded (?role=)
GET /v1/workload/tensors/{sha256}        the tensor's safetensors bytes (re-verified before they are sent)
GET /v1/workload/devices                 the device registry and links
Every route needs ``Authorization: Bearer <key>`` when keys are configured (sha256 digests of the
accepted keys, compared in constant time). Nothing writes; the record is the node's own open handle.
Bad ids are 404 with the typed error's reason; a damaged object is 409 (the verifier learns it is damaged).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from aiohttp import web

from node.workload.errors import UnknownObject, WorkloadError
from node.workload.model import to_json
from node.workload.query import get_graph_summaries, get_tensors
from node.workload.store import WorkloadRecord, encode_safetensors

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
RECORD_KEY: web.AppKey[WorkloadRecord] = web.AppKey("workload_record", WorkloadRecord)
MAX_ID = 256


def is_authorized(header: str | None, digests: Sequence[bytes]) -> bool:
    """Check a bearer header against the accepted key digests (every digest compared, constant time)."""
    if not digests:
        return True
    if not header or not header.startswith("Bearer "):
        return False
    presented = hashlib.sha256(header[7:].encode()).digest()
    ok = False
    for digest in digests:
        ok |= hmac.compare_digest(presented, digest)
    return ok


def _auth(digests: Sequence[bytes]) -> Any:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not is_authorized(request.headers.get("Authorization"), digests):
            return web.json_response({"error": "a workload-record key is required"}, status=401,
                                     headers={"WWW-Authenticate": "Bearer"})
        if any(len(v) > MAX_ID for v in request.match_info.values()):
            return web.json_response({"error": "id too long"}, status=400)
        try:
            return await handler(request)
        except UnknownObject as exc:
            return web.json_response({"error": str(exc), "reason": exc.reason.name, "object": exc.obj}, status=404)
        except WorkloadError as exc:
            return web.json_response({"error": str(exc), "reason": exc.reason.name, "object": exc.obj}, status=409)

    return middleware


async def _run(request: web.Request, fn: Callable[[WorkloadRecord], Any]) -> Any:
    """Run a blocking record read in a worker thread."""
    return await asyncio.to_thread(fn, request.app[RECORD_KEY])


async def list_graphs(request: web.Request) -> web.Response:
    """Return graph summaries."""
    kind = request.query.get("kind")
    return web.json_response(await _run(request, lambda r: get_graph_summaries(r, kind=kind)))


async def get_graph(request: web.Request) -> web.Response:
    """Return one graph."""
    gid = request.match_info["graph_id"]
    return web.json_response(await _run(request, lambda r: to_json(r.get_graph(gid))))


async def get_graph_traces(request: web.Request) -> web.Response:
    """Return the traces of a graph."""
    gid = request.match_info["graph_id"]
    return web.json_response(await _run(request, lambda r: r.trace_ids_of_graph(gid)))


async def get_trace(request: web.Request) -> web.Response:
    """Return one trace."""
    tid = request.match_info["trace_id"]
    return web.json_response(await _run(request, lambda r: to_json(r.get_trace(tid))))


async def get_trace_tensors(request: web.Request) -> web.Response:
    """Return the tensor references of a trace."""
    tid, role = request.match_info["trace_id"], request.query.get("role")
    refs = await _run(request, lambda r: [to_json(t) for t in get_tensors(r, trace_id=tid, role=role)])
    return web.json_response(refs)


async def get_tensor(request: web.Request) -> web.Response:
    """Return a tensor's safetensors bytes, verified against its address first."""
    sha = request.match_info["sha256"]
    body = await _run(request, lambda r: encode_safetensors(r.get_tensor(sha), sha))
    return web.Response(body=body, content_type="application/octet-stream")


async def get_devices(request: web.Request) -> web.Response:
    """Return the device registry."""
    return web.json_response(await _run(request, lambda r: {"devices": [to_json(d) for d in r.devices()],
                                                            "links": [to_json(x) for x in r.links()]}))


def create_workload_app(record: WorkloadRecord, key_digests: Sequence[bytes] = (),
                        prefix: str = "/v1/workload") -> web.Application:
    """Return the read-only workload API (prefix "": routes for mounting with add_subapp("/v1/workload", …))."""
    app = web.Application(middlewares=[_auth(tuple(key_digests))])
    app[RECORD_KEY] = record
    app.router.add_get(f"{prefix}/graphs", list_graphs)
    app.router.add_get(f"{prefix}/graphs/{{graph_id}}", get_graph)
    app.router.add_get(f"{prefix}/graphs/{{graph_id}}/traces", get_graph_traces)
    app.router.add_get(f"{prefix}/traces/{{trace_id:.+?}}/tensors", get_trace_tensors)
    app.router.add_get(f"{prefix}/traces/{{trace_id:.+}}", get_trace)
    app.router.add_get(f"{prefix}/tensors/{{sha256}}", get_tensor)
    app.router.add_get(f"{prefix}/devices", get_devices)
    return app

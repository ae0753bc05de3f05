"""The operator's side of the MoE duties: keep what it committed per inference and serve each duty its slice.

`GET /v1/moe/{inference_id}/{duty}` answers the slice of one duty (node.moe.wire): 200 with the bytes, 400 for
an id or duty that is not canonical or not a duty of the model, 404 for an inference it does not keep. Anyone may
ask (as for dense payloads, the data is what the operator committed to publishing); what a request costs is one
encoding of rows already in memory, and the store keeps a bounded number of inferences.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass

from aiohttp import web

from node.moe.trace import MoeTrace
from node.moe.wire import encode_duty_slice
from node.protocol.moe import ExpertKey, InvalidMoe, MoeCommitment

log = logging.getLogger(__name__)
MAX_ID_DIGITS = 78  # 2**256 has 78 decimal digits


@dataclass(frozen=True, eq=False)
class ServedMoe:
    """What the operator committed for one inference on an MoE model, as its duties' slices need it."""

    commitment: MoeCommitment
    trace: MoeTrace
    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    artifact_root: bytes
    fingerprint_hash: bytes  # the dense one, before moeRoot is bound in


class MoeSliceStore:
    """The operator's recent MoE inferences, oldest dropped first beyond `capacity`."""

    def __init__(self, capacity: int = 256) -> None:
        self.capacity = capacity
        self._items: OrderedDict[int, ServedMoe] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, inference_id: int, served: ServedMoe) -> None:
        """Keep one inference's commitment and trace."""
        with self._lock:
            self._items[inference_id] = served
            self._items.move_to_end(inference_id)
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)

    def get(self, inference_id: int) -> ServedMoe | None:
        """Return one inference's commitment and trace, if kept."""
        with self._lock:
            return self._items.get(inference_id)

    def encode(self, inference_id: int, key: ExpertKey) -> bytes | None:
        """Return one duty's slice of an inference, None if not kept (InvalidMoe if not a duty of the model)."""
        served = self.get(inference_id)
        if served is None:
            return None
        return encode_duty_slice(served.commitment, served.trace, key, served.prompt_ids, served.output_ids,
                                 served.artifact_root, served.fingerprint_hash)


def parse_inference_id(text: str) -> int:
    """Return a path's inference id (decimal, < 2**256); ValueError otherwise."""
    if not text.isdigit() or len(text) > MAX_ID_DIGITS or int(text) >= 2**256:
        raise ValueError(f"inference id {text[:80]!r} is not a uint256")
    return int(text)


def add_moe_routes(app: web.Application, store: MoeSliceStore) -> None:
    """Add `GET /v1/moe/{inference_id}/{duty}` to an executer's HTTP app."""

    async def get_slice(request: web.Request) -> web.Response:
        try:
            inference_id = parse_inference_id(request.match_info["inference_id"])
            key = ExpertKey.parse(request.match_info["duty"])
            raw = await asyncio.to_thread(store.encode, inference_id, key)
        except (ValueError, InvalidMoe) as exc:
            return web.json_response({"error": str(exc)[:200]}, status=400)
        if raw is None:
            return web.json_response({"error": "unknown inference"}, status=404)
        return web.Response(body=raw, content_type="application/octet-stream")

    app.router.add_get("/v1/moe/{inference_id}/{duty}", get_slice)


def make_moe_app(store: MoeSliceStore) -> web.Application:
    """Return an HTTP app that serves only MoE duty slices (the MoE devnet's operators run one each)."""
    app = web.Application(client_max_size=1024)
    add_moe_routes(app, store)
    return app


__all__ = ["MoeSliceStore", "ServedMoe", "add_moe_routes", "make_moe_app", "parse_inference_id"]

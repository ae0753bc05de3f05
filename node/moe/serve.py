"""The operator's side of the MoE duties: keep what it committed per inference and serve each duty its slice.

`GET /v1/moe/{inference_id}/{duty}` answers the slice of one duty (node.moe.wire): 200 with the bytes, 400 for
an id or duty that is not canonical or not a duty of the model, 404 for an inference it does not keep.
`GET /v1/moe/{inference_id}` answers the opening (JSON, `MoeOpeningWire`) that anyone submits to
ExpertDuty.assignDuties. Anyone may ask (as for dense payloads, the data is what the operator committed to
publishing); what a request costs is one encoding of rows already in memory, and the store keeps a bounded number
of inferences in memory. On a chain the store also writes each inference's trace to the node's LevelDB (synced)
before its commit is sent, and reads back from there what memory no longer holds (an executer restarted between
commit and duty keeps serving every slice it committed to).
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from chain.moe import MoeOpening
from node.moe.trace import ExpertRows, MoeTrace, build_commitment
from node.moe.wire import encode_duty_slice
from node.protocol.artifact import compute_output_hash
from node.protocol.moe import ExpertKey, InvalidMoe, MoeCommitment, MoeReason

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


class DurableMoeStore(Protocol):
    """Where an MoE executer keeps its traces durably (node.store.leveldb.Store)."""

    def put_served_moe(self, inference_id: int, blob: bytes) -> None:
        """Persist (synced) one inference's encoded trace."""

    def get_served_moe(self, inference_id: int) -> bytes | None:
        """Return one inference's encoded trace."""


def encode_served_moe(served: ServedMoe) -> bytes:
    """Return one served MoE inference as bytes (an npz of its trace and ids; the commitment is rebuilt from them,
    the block outputs, which are never served, are left out)."""
    trace = served.trace
    keys = sorted(trace.outputs)
    input_keys = sorted(trace.expert_inputs)
    meta = {"num_experts": trace.num_experts, "keys": [[k.layer, k.expert] for k in keys],
            "input_keys": [[k.layer, k.expert] for k in input_keys],
            "artifact_root": served.artifact_root.hex(), "fingerprint_hash": served.fingerprint_hash.hex()}
    arrays: dict[str, np.ndarray] = {
        "meta": np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8), "inputs": trace.inputs,
        "experts": trace.experts, "weights": trace.weights,  # `mixed` is diagnostics, never served: not kept
        "prompt_ids": np.asarray(served.prompt_ids, dtype=np.int64),
        "output_ids": np.asarray(served.output_ids, dtype=np.int64)}
    for i, key in enumerate(keys):
        arrays[f"p{i}"], arrays[f"o{i}"] = trace.outputs[key].positions, trace.outputs[key].outputs
    for i, key in enumerate(input_keys):
        arrays[f"x{i}"] = trace.expert_inputs[key]
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # type: ignore[arg-type]
    return buffer.getvalue()


def decode_served_moe(blob: bytes) -> ServedMoe:
    """Return a served MoE inference from `encode_served_moe`'s bytes (its commitment rebuilt from the trace)."""
    with np.load(io.BytesIO(blob), allow_pickle=False) as z:
        meta = json.loads(z["meta"].tobytes())
        outputs = {ExpertKey(layer, expert): ExpertRows(z[f"p{i}"], z[f"o{i}"])
                   for i, (layer, expert) in enumerate(meta["keys"])}
        expert_inputs = {ExpertKey(layer, expert): z[f"x{i}"] for i, (layer, expert) in enumerate(meta["input_keys"])}
        trace = MoeTrace(z["inputs"], z["experts"], z["weights"], outputs, np.zeros(0, dtype=np.float32),
                         int(meta["num_experts"]), expert_inputs)
        prompt_ids = tuple(int(t) for t in z["prompt_ids"])
        output_ids = tuple(int(t) for t in z["output_ids"])
    return ServedMoe(build_commitment(trace), trace, prompt_ids, output_ids, bytes.fromhex(meta["artifact_root"]),
                     bytes.fromhex(meta["fingerprint_hash"]))


class MoeSliceStore:
    """The operator's MoE inferences: the newest `capacity` in memory, every one on disk when `durable` is set."""

    def __init__(self, capacity: int = 256, durable: DurableMoeStore | None = None) -> None:
        self.capacity = capacity
        self.durable = durable
        self._items: OrderedDict[int, ServedMoe] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, inference_id: int, served: ServedMoe) -> None:
        """Keep one inference's commitment and trace (on disk first, synced, when durable)."""
        if self.durable is not None:
            self.durable.put_served_moe(inference_id, encode_served_moe(served))
        self._keep(inference_id, served)

    def _keep(self, inference_id: int, served: ServedMoe) -> None:
        with self._lock:
            self._items[inference_id] = served
            self._items.move_to_end(inference_id)
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)

    def get(self, inference_id: int) -> ServedMoe | None:
        """Return one inference's commitment and trace, if kept (memory first, then disk)."""
        with self._lock:
            served = self._items.get(inference_id)
        if served is not None or self.durable is None:
            return served
        blob = self.durable.get_served_moe(inference_id)
        if blob is None:
            return None
        served = decode_served_moe(blob)
        self._keep(inference_id, served)
        return served

    def encode(self, inference_id: int, key: ExpertKey) -> bytes | None:
        """Return one duty's slice of an inference, None if not kept (InvalidMoe if not a duty of the model)."""
        served = self.get(inference_id)
        if served is None:
            return None
        return encode_duty_slice(served.commitment, served.trace, key, served.prompt_ids, served.output_ids,
                                 served.artifact_root, served.fingerprint_hash)


Hex32 = Field(pattern=r"^0x[0-9a-f]{64}$")
MAX_EXPERTS = 1 << 20  # layers × experts of any model the module accepts (uint16 × uint16, far fewer in practice)


class MoeOpeningWire(BaseModel):
    """GET /v1/moe/{inference_id}: the opening of an inference's moeRoot (ExpertDuty.MoeOpening), hex."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    output_hash: str = Hex32
    artifact_root: str = Hex32
    fingerprint_hash: str = Hex32  # the dense one, before moeRoot is bound in
    router_root: str = Hex32
    counts: list[int] = Field(max_length=MAX_EXPERTS)
    expert_roots: list[str] = Field(max_length=MAX_EXPERTS)

    @classmethod
    def of(cls, o: MoeOpening) -> MoeOpeningWire:
        """Return the wire form of an opening."""
        return cls(output_hash="0x" + o.output_hash.hex(), artifact_root="0x" + o.artifact_root.hex(),
                   fingerprint_hash="0x" + o.fingerprint_hash.hex(), router_root="0x" + o.router_root.hex(),
                   counts=list(o.counts), expert_roots=["0x" + r.hex() for r in o.expert_roots])

    def opening(self) -> MoeOpening:
        """Return the opening (InvalidMoe if its per-expert lists differ in length or a root is not 32 bytes)."""
        if len(self.counts) != len(self.expert_roots) or any(not 0 <= c < 2**32 for c in self.counts):
            raise InvalidMoe("an opening has one uint32 count and one root per expert", MoeReason.MOE_MALFORMED)
        try:
            roots = tuple(bytes.fromhex(r.removeprefix("0x")) for r in self.expert_roots)
        except ValueError as exc:
            raise InvalidMoe(f"an expert root is not hex: {exc}", MoeReason.MOE_MALFORMED) from exc
        if any(len(r) != 32 for r in roots):
            raise InvalidMoe("an expert root is not 32 bytes", MoeReason.MOE_MALFORMED)
        return MoeOpening(bytes.fromhex(self.output_hash[2:]), bytes.fromhex(self.artifact_root[2:]),
                          bytes.fromhex(self.fingerprint_hash[2:]), bytes.fromhex(self.router_root[2:]),
                          tuple(self.counts), roots)


def compute_opening(served: ServedMoe) -> MoeOpening:
    """Return what opens one kept inference's moeRoot on the module."""
    router_root, counts, roots = served.commitment.opening()
    return MoeOpening(compute_output_hash(served.output_ids), served.artifact_root, served.fingerprint_hash,
                      router_root, tuple(counts), tuple(roots))


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

    async def get_opening(request: web.Request) -> web.Response:
        try:
            inference_id = parse_inference_id(request.match_info["inference_id"])
        except ValueError as exc:
            return web.json_response({"error": str(exc)[:200]}, status=400)
        served = await asyncio.to_thread(store.get, inference_id)  # from disk after a restart: not on the loop
        if served is None:
            return web.json_response({"error": "unknown inference"}, status=404)
        wire = await asyncio.to_thread(lambda: MoeOpeningWire.of(compute_opening(served)))
        return web.Response(body=wire.model_dump_json(), content_type="application/json")

    app.router.add_get("/v1/moe/{inference_id}", get_opening)
    app.router.add_get("/v1/moe/{inference_id}/{duty}", get_slice)


def make_moe_app(store: MoeSliceStore) -> web.Application:
    """Return an HTTP app that serves only MoE duty slices (the MoE devnet's operators run one each)."""
    app = web.Application(client_max_size=1024)
    add_moe_routes(app, store)
    return app


__all__ = ["DurableMoeStore", "MoeOpeningWire", "MoeSliceStore", "ServedMoe", "add_moe_routes", "compute_opening",
           "decode_served_moe", "encode_served_moe", "make_moe_app", "parse_inference_id"]

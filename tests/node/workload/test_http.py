"""The read-only HTTP API over a record: auth, reads, typed 404/409, tensors verified before they are sent."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import numpy as np
import safetensors.numpy
from aiohttp.test_utils import TestClient, TestServer

from node.workload.http import create_workload_app
from node.workload.model import Device, Graph, Trace, TraceEvent
from node.workload.store import WorkloadRecord

KEY = "reader-key"


def test_read_api(tmp_path: Path, add_graph: Graph) -> None:
    with WorkloadRecord.open(tmp_path / "rec") as rec:
        rec.put_device(Device("h0", "h0", "cpu", 1))
        gid = rec.put_graph(add_graph)
        rec.put_trace(Trace("inference/1", gid, "inference", (TraceEvent("e", "op", "add", "h0", 0, 5, ("op0",)),)))
        ref = rec.put_tensor(np.arange(6, dtype=np.float32).reshape(2, 3), role="input", name="x",
                             trace_id="inference/1")
        bad = rec.put_tensor(np.ones(4, dtype=np.float32), role="output", name="y", trace_id="inference/1")
        blob = rec.root / "blobs" / bad.sha256[:2] / f"{bad.sha256}.safetensors"
        data = bytearray(blob.read_bytes())
        data[-1] ^= 1
        blob.write_bytes(bytes(data))
        asyncio.run(_exercise(rec, gid, ref.sha256, bad.sha256))


async def _exercise(rec: WorkloadRecord, gid: str, sha: str, bad: str) -> None:
    app = create_workload_app(rec, [hashlib.sha256(KEY.encode()).digest()])
    async with TestClient(TestServer(app)) as client:
        assert (await client.get("/v1/workload/graphs")).status == 401
        assert (await client.get("/v1/workload/graphs", headers={"Authorization": "Bearer nope"})).status == 401
        auth = {"Authorization": f"Bearer {KEY}"}
        graphs = await (await client.get("/v1/workload/graphs", headers=auth)).json()
        assert [g["graph_id"] for g in graphs] == [gid]
        graph = await (await client.get(f"/v1/workload/graphs/{gid}", headers=auth)).json()
        assert "stablehlo.add" in graph["mlir"]
        assert await (await client.get(f"/v1/workload/graphs/{gid}/traces", headers=auth)).json() == ["inference/1"]
        trace = await (await client.get("/v1/workload/traces/inference/1", headers=auth)).json()
        assert trace["events"][0]["op_ids"] == ["op0"]
        refs = await (await client.get("/v1/workload/traces/inference/1/tensors?role=input", headers=auth)).json()
        assert [r["sha256"] for r in refs] == [sha]
        body = await (await client.get(f"/v1/workload/tensors/{sha}", headers=auth)).read()
        expected = np.arange(6, dtype=np.float32).reshape(2, 3)
        np.testing.assert_array_equal(safetensors.numpy.load(body)["data"], expected)
        missing = await client.get(f"/v1/workload/graphs/{'0' * 64}", headers=auth)
        assert missing.status == 404 and (await missing.json())["object"] == "0" * 64
        damaged = await client.get(f"/v1/workload/tensors/{bad}", headers=auth)
        assert damaged.status == 409 and (await damaged.json())["reason"] == "CORRUPTED_ENTRY"
        assert (await client.post("/v1/workload/graphs", headers=auth)).status == 405  # read-only


def test_the_executer_serves_the_record_only_behind_its_api_keys(tmp_path: Path, tiny: object) -> None:
    import pytest

    from node.checks.fingerprint import FingerprintThresholds
    from node.errors import FatalError
    from node.executer.server import create_app, load_api_settings
    from node.executer.service import ExecuterService

    service = ExecuterService(tiny.files, tiny.tokenizer, tiny.engine,  # type: ignore[attr-defined]
                              FingerprintThresholds(2, 1.0, 1.0, 0))
    with WorkloadRecord.open(tmp_path / "rec") as rec:
        rec.put_device(Device("h0", "h0", "cpu", 1))
        with pytest.raises(FatalError, match="behind API keys"):
            create_app(service, "profile", True, load_api_settings(None), workload=rec)
        app = create_app(service, "profile", True, load_api_settings(None, keys=[KEY]), workload=rec)
        asyncio.run(_exercise_executer(app))


async def _exercise_executer(app: object) -> None:
    async with TestClient(TestServer(app)) as client:  # type: ignore[arg-type]
        assert (await client.get("/v1/workload/devices")).status == 401
        devices = await (await client.get("/v1/workload/devices", headers={"Authorization": f"Bearer {KEY}"})).json()
        assert [d["device_id"] for d in devices["devices"]] == ["h0"]
        assert (await client.get("/health")).status == 200  # the executer's own routes are unchanged

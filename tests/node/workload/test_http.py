"""The read-only HTTP API over a record: auth, reads, typed 404/409, tensors verified before they are sent;
pagination, size caps and per-key rate limits under abuse."""

from __future__ import annotations

import asyncio
import hashlib
import time
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.numpy
from aiohttp.test_utils import TestClient, TestServer

from node.workload.http import WorkloadApiLimits, create_workload_app
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
        assert [g["graph_id"] for g in graphs["items"]] == [gid] and graphs["next"] is None
        graph = await (await client.get(f"/v1/workload/graphs/{gid}", headers=auth)).json()
        assert "stablehlo.add" in graph["mlir"]
        traces = await (await client.get(f"/v1/workload/graphs/{gid}/traces", headers=auth)).json()
        assert traces == {"items": ["inference/1"], "next": None}
        resolved = await (await client.get("/v1/workload/resolve", params={"graph_id": gid}, headers=auth)).json()
        assert resolved == {"graph_id": gid, "pending": None}
        pending = await (await client.get("/v1/workload/resolve", params={"graph_id": "pending/m/8"},
                                          headers=auth)).json()
        assert pending["graph_id"] is None and pending["pending"].startswith("not requested")
        trace = await (await client.get("/v1/workload/traces/inference/1", headers=auth)).json()
        assert trace["events"][0]["op_ids"] == ["op0"]
        refs = await (await client.get("/v1/workload/traces/inference/1/tensors?role=input", headers=auth)).json()
        assert [r["sha256"] for r in refs["items"]] == [sha]
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


KEYS = ["abuser-key", "honest-key"]


def _app(rec: WorkloadRecord, **limits: Any) -> Any:
    return create_workload_app(rec, [hashlib.sha256(k.encode()).digest() for k in KEYS],
                               limits=WorkloadApiLimits(**limits))


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _record_many_traces(rec: WorkloadRecord, add_graph: Graph, n: int) -> str:
    rec.put_device(Device("h0", "h0", "cpu", 1))
    gid = rec.put_graph(add_graph)
    for i in range(n):
        rec.put_trace(Trace(f"inference/{i:04d}", gid, "inference", (TraceEvent("e", "op", "add", "h0", 0, 5),)))
    return gid


def test_lists_are_paginated_and_bounded(tmp_path: Path, add_graph: Graph) -> None:
    with WorkloadRecord.open(tmp_path / "rec") as rec:
        gid = _record_many_traces(rec, add_graph, 120)
        for i in range(3):
            rec.put_tensor(np.full(4, i, dtype=np.int64), role="input", name=f"t{i}", event_id="e",
                           trace_id="inference/0000")
        asyncio.run(_paginate(rec, gid))


async def _paginate(rec: WorkloadRecord, gid: str) -> None:
    async with TestClient(TestServer(_app(rec, max_page=50, request_burst=100))) as client:
        seen: list[str] = []
        after = None
        pages = 0
        while True:
            params = {"limit": "50", **({} if after is None else {"after": after})}
            body = await (await client.get(f"/v1/workload/graphs/{gid}/traces", params=params,
                                           headers=_auth(KEYS[1]))).json()
            seen += body["items"]
            pages += 1
            after = body["next"]
            if after is None:
                break
        assert pages == 3 and seen == [f"inference/{i:04d}" for i in range(120)]
        everything = await client.get("/v1/workload/traces", params={"limit": "100000"}, headers=_auth(KEYS[1]))
        assert everything.status == 400 and (await everything.json())["reason"] == "OUT_OF_RANGE"
        bad_cursor = await client.get("/v1/workload/traces", params={"after": "zz"}, headers=_auth(KEYS[1]))
        assert bad_cursor.status == 400
        first = await (await client.get("/v1/workload/traces/inference/0000/tensors", params={"limit": "2"},
                                        headers=_auth(KEYS[1]))).json()
        rest = await (await client.get("/v1/workload/traces/inference/0000/tensors",
                                       params={"limit": "2", "after": first["next"]}, headers=_auth(KEYS[1]))).json()
        assert [r["name"] for r in first["items"] + rest["items"]] == ["t0", "t1", "t2"] and rest["next"] is None


def test_size_caps_stream_small_tensors_and_refuse_large_ones(tmp_path: Path, add_graph: Graph) -> None:
    with WorkloadRecord.open(tmp_path / "rec") as rec:
        gid = _record_many_traces(rec, add_graph, 1)
        small = np.arange(700, dtype=np.float32)  # 2.8 kB: three 1 kB chunks
        big = np.zeros(4096, dtype=np.float32)  # 16 kB: over the cap
        refs = [rec.put_tensor(a, role="input", name=n, trace_id="inference/0000")
                for a, n in ((small, "s"), (big, "b"))]
        asyncio.run(_sizes(rec, gid, refs[0].sha256, refs[1].sha256, small))


async def _sizes(rec: WorkloadRecord, gid: str, small: str, big: str, expected: np.ndarray) -> None:
    app = _app(rec, max_tensor_bytes=8192, chunk_bytes=1024, max_json_bytes=512)
    async with TestClient(TestServer(app)) as client:
        ok = await client.get(f"/v1/workload/tensors/{small}", headers=_auth(KEYS[1]))
        assert ok.status == 200
        np.testing.assert_array_equal(safetensors.numpy.load(await ok.read())["data"], expected)
        refused = await client.get(f"/v1/workload/tensors/{big}", headers=_auth(KEYS[1]))
        assert refused.status == 413 and (await refused.json())["reason"] == "LIMIT_EXCEEDED"
        graph = await client.get(f"/v1/workload/graphs/{gid}", headers=_auth(KEYS[1]))  # 877 bytes of JSON
        assert graph.status == 413 and (await graph.json())["object"].endswith(gid)
    async with TestClient(TestServer(_app(rec, bytes_per_s=1024, bytes_burst=8192))) as client:  # a tensor flood
        statuses = [(await client.get(f"/v1/workload/tensors/{small}", headers=_auth(KEYS[0]))).status
                    for _ in range(4)]
        assert statuses == [200, 200, 429, 429]  # 2.9 kB each from an 8 kB budget
        assert (await client.get(f"/v1/workload/tensors/{small}", headers=_auth(KEYS[1]))).status == 200


def test_a_flooding_key_is_rate_limited_and_an_honest_reader_stays_served(tmp_path: Path, add_graph: Graph) -> None:
    with WorkloadRecord.open(tmp_path / "rec") as rec:
        gid = _record_many_traces(rec, add_graph, 100)
        ref = rec.put_tensor(np.zeros(5000, dtype=np.float32), role="input", name="x", trace_id="inference/0000")
        asyncio.run(_flood(rec, gid, ref.sha256))


async def _flood(rec: WorkloadRecord, gid: str, sha: str) -> None:
    app = _app(rec, requests_per_s=5, request_burst=10, bytes_per_s=20_000, bytes_burst=120_000)
    async with TestClient(TestServer(app)) as client:
        async def abuse(i: int) -> int:
            path = f"/v1/workload/tensors/{sha}" if i % 2 else f"/v1/workload/graphs/{gid}/traces"
            response = await client.get(path, params={} if i % 2 else {"limit": "100"}, headers=_auth(KEYS[0]))
            if response.status == 429:
                assert int(response.headers["Retry-After"]) >= 1
                assert (await response.json())["reason"] == "LIMIT_EXCEEDED"
            return response.status

        async def honest() -> tuple[list[int], float]:
            statuses, worst = [], 0.0
            for _ in range(5):
                t0 = time.perf_counter()
                statuses.append((await client.get(f"/v1/workload/tensors/{sha}", headers=_auth(KEYS[1]))).status)
                worst = max(worst, time.perf_counter() - t0)
                await asyncio.sleep(0.05)
            return statuses, worst

        flood = asyncio.gather(*(abuse(i) for i in range(300)))  # listings and 20 kB tensors, all at once
        (honest_statuses, worst), abused = await asyncio.gather(honest(), flood)
        assert abused.count(429) >= 250  # a 10-request burst and 2 in flight: the rest refused at once
        assert honest_statuses == [200] * 5  # the other key's budgets are its own
        assert worst < 5.0  # measured ~10-50 ms on the shared 2-core CPU; the bound only catches starvation

"""The record on real plyvel and safetensors: round trips, never overwrite, typed errors for damage."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import plyvel
import pytest
import torch

from node.workload.errors import (
    ConflictingObject,
    CorruptedEntry,
    RecordLocked,
    RootMismatch,
    TamperedTensor,
    TruncatedBlob,
    UnknownObject,
    WorkloadError,
)
from node.workload.model import Device, Graph, Link, Trace, TraceEvent
from node.workload.store import WorkloadRecord, encode_entry


@pytest.fixture
def record(tmp_path: Path, devices: tuple[list[Device], list[Link]]) -> WorkloadRecord:
    rec = WorkloadRecord.open(tmp_path / "rec")
    for d in devices[0]:
        rec.put_device(d)
    for link in devices[1]:
        rec.put_link(link)
    yield rec
    rec.close()


def test_devices_and_links_round_trip(record: WorkloadRecord, devices: tuple[list[Device], list[Link]]) -> None:
    assert sorted(record.devices(), key=lambda d: d.device_id) == sorted(devices[0], key=lambda d: d.device_id)
    assert {ln.link_id for ln in record.links()} == {ln.link_id for ln in devices[1]}
    record.put_device(devices[0][0])  # identical again: fine
    with pytest.raises(ConflictingObject, match="device/h0"):
        record.put_device(dataclasses.replace(devices[0][0], memory_bytes=1))
    with pytest.raises(UnknownObject, match="nowhere"):
        record.put_link(Link("h0", "nowhere", 1, 1.0))


@pytest.mark.parametrize("array", [
    np.arange(12, dtype=np.float32).reshape(3, 4),
    np.array([[1, -2]], dtype=np.int64),
    np.array([True, False]),
    torch.randn(2, 5, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16),
    torch.arange(6, dtype=torch.float16),
    torch.tensor(2.5),
], ids=["f32", "i64", "bool", "bf16", "f16", "scalar"])
def test_tensor_round_trip(record: WorkloadRecord, array: np.ndarray | torch.Tensor) -> None:
    ref = record.put_tensor(array, role="activation", name="h", event_id="e0", trace_id="t0")
    out = record.get_tensor(ref)
    if isinstance(array, torch.Tensor):
        assert out.dtype.name == str(array.dtype).removeprefix("torch.")
        np.testing.assert_array_equal(out.astype(np.float32), array.float().numpy())  # exact for these dtypes
    else:
        np.testing.assert_array_equal(out, array)
        assert out.dtype == array.dtype
    assert ref.shape == tuple(out.shape)
    assert record.get_tensor(ref.sha256).tobytes() == out.tobytes()


def test_big_endian_input_gets_the_same_address(record: WorkloadRecord) -> None:
    a = np.arange(5, dtype="<i4")
    assert record.put_tensor(a, role="input", name="a").sha256 == \
        record.put_tensor(a.astype(">i4"), role="input", name="b").sha256


def test_a_tensor_reference_is_never_overwritten(record: WorkloadRecord) -> None:
    record.put_tensor(np.zeros(3), role="output", name="y", trace_id="t")
    record.put_tensor(np.zeros(3), role="output", name="y", trace_id="t")  # same again
    with pytest.raises(ConflictingObject, match="y"):
        record.put_tensor(np.ones(3), role="output", name="y", trace_id="t")
    np.testing.assert_array_equal(record.get_tensor(record.tensor_refs()[0]), np.zeros(3))


def _blob(record: WorkloadRecord, sha: str) -> Path:
    return record.root / "blobs" / sha[:2] / f"{sha}.safetensors"


def test_tampered_tensor(record: WorkloadRecord) -> None:
    ref = record.put_tensor(np.arange(8, dtype=np.float32), role="output", name="y")
    path = _blob(record, ref.sha256)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(TamperedTensor) as err:
        record.get_tensor(ref)
    assert err.value.obj == ref.sha256


def test_truncated_and_missing_blob(record: WorkloadRecord) -> None:
    ref = record.put_tensor(np.arange(8, dtype=np.float32), role="output", name="y")
    path = _blob(record, ref.sha256)
    path.write_bytes(path.read_bytes()[:-5])
    with pytest.raises(TruncatedBlob, match=ref.sha256):
        record.get_tensor(ref)
    path.unlink()
    with pytest.raises(UnknownObject, match="missing"):
        record.get_tensor(ref)
    with pytest.raises(UnknownObject):
        record.get_tensor("0" * 64)


def test_corrupted_index_entry(tmp_path: Path, add_graph: Graph) -> None:
    with WorkloadRecord.open(tmp_path / "r") as rec:
        rec.put_device(Device("d", "d", "cpu", 1))
        rec.put_graph(add_graph)
    db = plyvel.DB(str(tmp_path / "r" / "index"))
    raw = db.get(b"device/d")
    db.put(b"device/d", raw[:-2] + b"9}")  # flipped byte, checksum left as it was
    db.put(f"graph/{add_graph.graph_id}".encode(), encode_entry({"kind": "logical"}))  # valid checksum, bad shape
    db.close()
    with pytest.raises(RootMismatch):  # the record as a whole no longer hashes to its root
        WorkloadRecord.open(tmp_path / "r", readonly=True)
    with WorkloadRecord.open(tmp_path / "r", reroot=True) as rec:  # accepted as it is: each entry still checked
        with pytest.raises(CorruptedEntry, match="device/d"):
            rec.get_device("d")
        with pytest.raises(CorruptedEntry, match=add_graph.graph_id):
            rec.get_graph(add_graph.graph_id)


def test_graph_round_trip_and_parent_required(record: WorkloadRecord, add_graph: Graph) -> None:
    gid = record.put_graph(add_graph)
    assert record.put_graph(dataclasses.replace(add_graph, name="again", graph_id="")) == gid
    assert record.get_graph(gid) == add_graph
    child = Graph("verification", "v", add_graph.mlir, add_graph.inputs, add_graph.outputs, add_graph.ops,
                  parent_id="f" * 64)
    with pytest.raises(UnknownObject, match="f" * 64):
        record.put_graph(child)


def test_trace_validation_writes_nothing_on_failure(record: WorkloadRecord, add_graph: Graph) -> None:
    gid = record.put_graph(add_graph)
    good = TraceEvent("e0", "op", "add", "h0", 0, 10, ("op0",))
    bad_op = TraceEvent("e1", "op", "mul", "h0", 10, 20, ("op7",))
    with pytest.raises(UnknownObject, match="op7"):
        record.put_trace(Trace("t", gid, "inference", (good, bad_op)))
    with pytest.raises(UnknownObject, match="ghost"):
        record.put_trace(Trace("t", gid, "inference", (TraceEvent("e2", "op", "x", "ghost", 0, 1),)))
    assert record.traces() == [] and record.trace_ids_of_graph(gid) == []
    trace = Trace("t", gid, "inference", (good,))
    record.put_trace(trace)
    assert record.get_trace("t") == trace and record.trace_ids_of_graph(gid) == ["t"]
    with pytest.raises(ConflictingObject):
        record.put_trace(Trace("t", gid, "inference", ()))


def test_one_writer_and_snapshot_readers(record: WorkloadRecord) -> None:
    with pytest.raises(RecordLocked):
        WorkloadRecord.open(record.root)
    ref = record.put_tensor(np.ones(2, dtype=np.float32), role="input", name="x")
    with WorkloadRecord.open(record.root, readonly=True) as reader:
        np.testing.assert_array_equal(reader.get_tensor(ref), np.ones(2, dtype=np.float32))
        assert len(reader.devices()) == 3
        with pytest.raises(WorkloadError, match="read-only"):
            reader.put_device(Device("z", "z", "cpu", 1))
    with pytest.raises(UnknownObject):
        WorkloadRecord.open(record.root / "nothing", readonly=True)


def test_compiled_module_cache(record: WorkloadRecord, add_graph: Graph) -> None:
    gid = record.put_graph(add_graph)
    assert record.get_compiled(gid, "llvm-cpu") is None
    record.put_compiled(gid, "llvm-cpu", b"\x00vmfb")
    assert record.get_compiled(gid, "llvm-cpu") == b"\x00vmfb"


def test_ids_with_slashes_do_not_leak_between_graphs(record: WorkloadRecord, add_graph: Graph) -> None:
    # a trace may name a graph not recorded yet (e.g. "pending/<model>/<length>"); ids may contain "/"
    record.put_trace(Trace("inference/1", "pending/m/4", "inference", ()))
    record.put_trace(Trace("inference/2", "pending/m/4/x", "inference", ()))
    assert record.trace_ids_of_graph("pending/m/4") == ["inference/1"]
    assert record.trace_ids_of_graph("pending/m/4/x") == ["inference/2"]


def test_graph_text_and_bytecode_are_both_kept(record: WorkloadRecord, add_graph: Graph) -> None:
    from iree.compiler import ir

    gid = record.put_graph(add_graph)
    bytecode = record.get_bytes(record.get_graph_entry(gid)["mlir_bytecode_sha256"])
    assert bytecode.startswith(b"ML\xefR")  # MLIR bytecode magic
    with ir.Context():
        assert "stablehlo.multiply" in str(ir.Module.parse(bytecode))


def test_scans_page_by_cursor_without_reading_past_the_page(record: WorkloadRecord, add_graph: Graph) -> None:
    gid = record.put_graph(add_graph)
    for i in range(7):
        record.put_trace(Trace(f"t/{i}", gid, "inference", ()))
    record.put_trace(Trace("t/10", gid, "inference", ()))  # shares the prefix "t/1": cursors are exclusive keys
    pages, after = [], None
    while True:
        page = record.trace_ids_of_graph(gid, after, 3)
        pages.append(page)
        if len(page) < 3:
            break
        after = page[-1]
    assert pages == [["t/0", "t/1", "t/10"], ["t/2", "t/3", "t/4"], ["t/5", "t/6"]]
    assert record.trace_ids(limit=2) == ["t/0", "t/1"]
    for i in range(3):
        record.put_tensor(np.full(2, i), role="input", name=f"x{i}", event_id="e", trace_id="t/1")
    record.put_tensor(np.full(2, 9), role="input", name="x9", event_id="e", trace_id="t/10")
    assert [r.name for r in record.tensor_refs_of_trace("t/1")] == ["x0", "x1", "x2"]  # not t/10's
    assert [r.name for r in record.tensor_refs_of_trace("t/1", "e\0x0", 1)] == ["x1"]


def test_a_pending_key_resolves_once_to_a_verification_graph(record: WorkloadRecord, add_graph: Graph) -> None:
    gid = record.put_graph(add_graph)
    record.put_graph_request("pending/m/float32/32/abc", {"length": 32})
    record.put_graph_request("pending/m/float32/32/abc", {"length": 32})  # idempotent
    record.put_trace(Trace("t/0", "pending/m/float32/32/abc", "inference", ()))
    assert record.resolve_graph_id("pending/m/float32/32/abc") is None
    with pytest.raises(WorkloadError, match="not a verification graph"):
        record.resolve_graph_request("pending/m/float32/32/abc", gid, gid)  # a logical graph is refused
    verify = Graph(kind="verification", name="v", mlir=add_graph.mlir, inputs=add_graph.inputs,
                   outputs=add_graph.outputs, ops=add_graph.ops, parent_id=gid)
    record.put_graph(verify)
    record.resolve_graph_request("pending/m/float32/32/abc", gid, verify.graph_id)
    assert record.resolve_graph_id("pending/m/float32/32/abc") == verify.graph_id
    assert record.trace_ids_of_graph(verify.graph_id) == ["t/0"]
    record.resolve_graph_request("pending/m/float32/32/abc", gid, verify.graph_id)  # the same again: a no-op
    assert record.trace_ids_of_graph(verify.graph_id) == ["t/0"]

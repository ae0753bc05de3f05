"""The record has one Merkle root over its entries, verified on open: dropped or edited entries are refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import plyvel
import pytest
from typer.testing import CliRunner

from node.cli_workload import workload_app
from node.workload.errors import CorruptedEntry, RootMismatch
from node.workload.model import Device, Graph, Trace, TraceEvent
from node.workload.store import PENDING_ROOT, ROOT_FILE, WorkloadRecord, decode_entry, encode_entry

runner = CliRunner()


def invoke(*args: str) -> tuple[int, str]:
    result = runner.invoke(workload_app, list(args))
    return result.exit_code, result.output


@pytest.fixture
def record(tmp_path: Path, add_graph: Graph) -> Path:
    path = tmp_path / "rec"
    with WorkloadRecord.open(path) as rec:
        rec.put_device(Device("cpu0", "h", "cpu", 2**30))
        rec.put_graph(add_graph)
        for name, value in (("x", np.ones((2, 3), np.float32)), ("w", np.full((2, 3), 2.0, np.float32)),
                            ("y", np.full((2, 3), 6.0, np.float32))):
            rec.put_tensor(value, role="input" if name == "x" else "weight" if name == "w" else "output", name=name,
                           event_id="e0", trace_id="t0")
        rec.put_trace(Trace("t0", add_graph.graph_id, "inference",
                            (TraceEvent("e0", "op", "add", "cpu0", 0, 10, ("op0",)),)))
    return path


def edit_entry(path: Path, key: bytes, change: object) -> None:
    """Rewrite an index entry with a valid checksum (what passed `query --check` before roots)."""
    db = plyvel.DB(str(path / "index"))
    value = decode_entry(key.decode(), db.get(key))
    change(value)  # type: ignore[operator]
    db.put(key, encode_entry(value))
    db.close()


def test_the_root_is_stable_and_printed(record: Path) -> None:
    with WorkloadRecord.open(record, readonly=True) as rec:
        root, entries = rec.root_hash, rec.leaf_count
    assert json.loads((record / ROOT_FILE).read_text())["root"] == root.hex() and entries > 5
    code, out = invoke("root", "--record", str(record), "--json")
    assert code == 0 and json.loads(out) == {"root": root.hex(), "entries": entries}
    with WorkloadRecord.open(record) as rec:  # a compiled-module cache entry is not part of the root
        rec.put_compiled(rec.graph_entries()[0]["graph_id"], "t", b"vmfb")
        assert rec.root_hash == root
        rec.put_device(Device("cpu1", "h", "cpu", 1))
        assert rec.root_hash != root
    assert invoke("ls", "--record", str(record), "--expect-root", root.hex())[0] == 2  # not the signed root


def test_a_flipped_byte_in_leveldbs_log_is_refused_not_a_silently_dropped_trace(record: Path) -> None:
    logs = [p for p in (record / "index").glob("*.log") if b"trace/t0" in p.read_bytes()]
    assert logs, "the trace is still in LevelDB's log"
    data = bytearray(logs[0].read_bytes())
    at = data.index(b"trace/t0") + 40  # inside the trace's entry: LevelDB drops the whole log record
    data[at] ^= 0x01
    logs[0].write_bytes(bytes(data))
    with pytest.raises(RootMismatch):
        WorkloadRecord.open(record, readonly=True)
    code, out = invoke("ls", "--record", str(record), "--json")
    assert code == 2 and "root" in out, out  # before: exit 0 and no traces
    with pytest.raises(RootMismatch):  # the writer does not take it over silently either
        WorkloadRecord.open(record)


@pytest.mark.parametrize("edit", ["ref-to-other-tensor", "changed-role", "event-on-missing-device"])
def test_index_edits_with_recomputed_checksums_are_refused(record: Path, edit: str) -> None:
    with WorkloadRecord.open(record, readonly=True) as rec:
        refs = {r.name: r for r in rec.tensor_refs_of_trace("t0")}
    if edit == "ref-to-other-tensor":
        edit_entry(record, b"ref/t0\0e0\0y", lambda v: v.update(sha256=refs["x"].sha256))
    elif edit == "changed-role":
        edit_entry(record, b"ref/t0\0e0\0w", lambda v: v.update(role="input"))
    else:
        edit_entry(record, b"trace/t0", lambda v: v["events"][0].update(device_id="gpu9"))
    for args in (("query", "--trace", "t0", "--check"), ("export-trace", "t0", "--out", str(record / "t.json")),
                 ("ls",)):
        code, out = invoke(*args, "--record", str(record))
        assert code == 2 and "root" in out, (args, out)  # before: query --check and export-trace exit 0


def test_devices_are_checked_when_a_trace_is_read(record: Path) -> None:
    """Even in a record re-rooted over the edit (a prover signing an inconsistent record)."""
    edit_entry(record, b"trace/t0", lambda v: v["events"][0].update(device_id="gpu9"))
    WorkloadRecord.open(record, reroot=True).close()
    with WorkloadRecord.open(record, readonly=True) as rec:
        with pytest.raises(CorruptedEntry, match="gpu9"):
            rec.get_trace("t0")
        with pytest.raises(CorruptedEntry, match="gpu9"):
            rec.traces()
    assert invoke("export-trace", "t0", "--out", str(record / "t.json"), "--record", str(record))[0] == 2


def test_a_crash_between_a_batch_and_its_root_is_recovered(record: Path, tmp_path: Path) -> None:
    before = (record / ROOT_FILE).read_text()
    with WorkloadRecord.open(record) as rec:
        rec.put_device(Device("cpu1", "h", "cpu", 1))
        after = rec.root_hash
    # as if the writer died after the batch and ROOT.pending, before ROOT was replaced
    (record / PENDING_ROOT).write_text((record / ROOT_FILE).read_text())
    (record / ROOT_FILE).write_text(before)
    with WorkloadRecord.open(record, readonly=True) as rec:
        assert rec.root_hash == after
    with WorkloadRecord.open(record) as rec:  # the writer promotes the pending root
        assert rec.root_hash == after
    assert json.loads((record / ROOT_FILE).read_text())["root"] == after.hex()
    assert not (record / PENDING_ROOT).exists()
    # a copied folder opens the same way; a folder without a root is refused
    shutil.copytree(record, tmp_path / "copy")
    WorkloadRecord.open(tmp_path / "copy", readonly=True).close()
    (tmp_path / "copy" / ROOT_FILE).unlink()
    with pytest.raises(RootMismatch, match="none"):
        WorkloadRecord.open(tmp_path / "copy", readonly=True)

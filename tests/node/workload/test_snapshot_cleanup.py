"""Read-only opens leave no snapshot behind: closed, collected, at exit, or after a killed reader."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from node.workload.model import Device
from node.workload.store import SNAPSHOT_PREFIX, WorkloadRecord


@pytest.fixture
def tmpdir_and_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    with WorkloadRecord.open(tmp_path / "rec") as rec:
        rec.put_device(Device("cpu0", "h", "cpu", 1))
    return temp, tmp_path / "rec"


def snapshots(temp: Path) -> list[Path]:
    return sorted(temp.glob(f"{SNAPSHOT_PREFIX}*"))


def test_context_manager_and_garbage_collection_remove_the_snapshot(tmpdir_and_record: tuple[Path, Path]) -> None:
    temp, path = tmpdir_and_record
    with WorkloadRecord.open(path, readonly=True) as rec:
        assert rec.get_device("cpu0").host == "h" and len(snapshots(temp)) == 1
    assert snapshots(temp) == []
    for _ in range(5):  # readers that are never closed
        rec = WorkloadRecord.open(path, readonly=True)
        assert rec.devices()
        del rec
    gc.collect()
    assert snapshots(temp) == []


CHILD = """
import os, sys
from pathlib import Path
from node.workload.store import WorkloadRecord
rec = WorkloadRecord.open(Path(sys.argv[1]), readonly=True)
assert rec.devices()
holder = [rec]  # kept alive until exit
if sys.argv[2] == "kill":
    os._exit(0)  # no atexit handlers: as if killed
"""


def run_child(path: Path, temp: Path, mode: str) -> None:
    env = {**os.environ, "TMPDIR": str(temp), "PYTHONPATH": str(Path.cwd())}
    subprocess.run([sys.executable, "-c", CHILD, str(path), mode], check=True, env=env, timeout=120)


def test_a_reader_that_exits_without_close_leaves_nothing(tmpdir_and_record: tuple[Path, Path]) -> None:
    temp, path = tmpdir_and_record
    run_child(path, temp, "exit")
    assert snapshots(temp) == []


def test_a_killed_readers_snapshot_is_removed_by_the_next_open(tmpdir_and_record: tuple[Path, Path]) -> None:
    temp, path = tmpdir_and_record
    run_child(path, temp, "kill")
    assert len(snapshots(temp)) == 1  # the killed process could not clean up
    keep = temp / f"{SNAPSHOT_PREFIX}{os.getpid()}-mine"  # a live process's snapshot is not touched
    keep.mkdir()
    with WorkloadRecord.open(path, readonly=True):
        assert snapshots(temp) == sorted([keep, *[p for p in snapshots(temp) if p != keep]])
        assert len(snapshots(temp)) == 2  # the live one and this reader's own
    assert snapshots(temp) == [keep]

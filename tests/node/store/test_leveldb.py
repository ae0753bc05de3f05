"""The node's LevelDB store on a real LevelDB: lock, identity, cache re-verification, slashing protection."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from node.store.leveldb import ConflictingVerdict, Store, StoreLocked, StoreMismatch, VerdictRecord

CONTRACT = "0x5FbDB2315678afecb367f032d93F642f64180aa3"


def record(valid: bool = True, deadline: int = 100, scores: str = "0x01") -> VerdictRecord:
    return VerdictRecord(7, "0x" + "ab" * 32, valid, 0 if valid else 504, scores, deadline)


def test_a_second_process_cannot_open_the_database(tmp_path: Path) -> None:
    with Store(tmp_path, 31337, CONTRACT):
        code = ("import sys; from pathlib import Path; from node.store.leveldb import Store, StoreLocked\n"
                f"try:\n    Store(Path({str(tmp_path)!r}), 31337, {CONTRACT!r})\nexcept StoreLocked:\n    sys.exit(3)")
        assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 3
        with pytest.raises(StoreLocked):  # nor a second handle in this process
            Store(tmp_path, 31337, CONTRACT)
    Store(tmp_path, 31337, CONTRACT).close()  # released on close


def test_a_database_of_another_chain_or_contract_is_refused(tmp_path: Path) -> None:
    Store(tmp_path, 31337, CONTRACT).close()
    with pytest.raises(StoreMismatch):
        Store(tmp_path, 1, CONTRACT)
    with pytest.raises(StoreMismatch):
        Store(tmp_path, 31337, "0x" + "11" * 20)
    Store(tmp_path, 31337, CONTRACT.lower()).close()  # address case does not matter


def test_cached_payloads_are_reverified_on_read(tmp_path: Path) -> None:
    with Store(tmp_path, 31337, CONTRACT) as store:
        store.put_payload(b"c" * 32, b"good")
        assert store.get_payload(b"c" * 32, lambda raw: raw == b"good") == b"good"
        assert store.get_payload(b"c" * 32, lambda raw: False) is None  # corrupted: dropped
        assert store.get_payload(b"c" * 32, lambda raw: True) is None  # and gone, to be refetched
        assert store.get_payload(b"d" * 32, lambda raw: True) is None


def test_cursors_survive_a_restart(tmp_path: Path) -> None:
    with Store(tmp_path, 31337, CONTRACT) as store:
        assert store.cursor("events").load() == []
        store.cursor("events").save([(11, "0x" + "dd" * 32), (12, "0x" + "ee" * 32)])
    with Store(tmp_path, 31337, CONTRACT) as store:
        assert store.cursor("events").load() == [(11, "0x" + "dd" * 32), (12, "0x" + "ee" * 32)]
        assert store.cursor("other").load() == []


def test_slashing_protection_allows_identical_and_refuses_conflicting(tmp_path: Path) -> None:
    with Store(tmp_path, 31337, CONTRACT) as store:
        first = store.record_verdict(record(True, deadline=100))
        assert first == record(True, deadline=100)
        again = store.record_verdict(record(True, deadline=999))  # same decision, later deadline
        assert again == first  # the stored record is re-signed: the same signature
        with pytest.raises(ConflictingVerdict):
            store.record_verdict(record(False))
        assert store.record_verdict(record(True, scores="0x02")) == first  # scores may move, the decision not
        with pytest.raises(ConflictingVerdict):
            store.record_verdict(VerdictRecord(7, "0x" + "cd" * 32, True, 0, "0x01", 100))  # another artifact
    with Store(tmp_path, 31337, CONTRACT) as store:  # synced: still there after a restart
        assert store.get_verdict(7) == first
        with pytest.raises(ConflictingVerdict):
            store.record_verdict(record(False))
        assert list(store.verdicts()) == [first]


def test_namespaces_keep_chains_apart(tmp_path: Path) -> None:
    with Store(tmp_path / "a", 31337, CONTRACT) as a, Store(tmp_path / "b", 31337, "0x" + "22" * 20) as b:
        a.record_verdict(record(True))
        assert b.get_verdict(7) is None


def test_journal_entries_are_ordered_by_nonce(tmp_path: Path) -> None:
    with Store(tmp_path, 31337, CONTRACT) as store:
        for nonce in (10, 2, 7):
            store.journal_put(nonce, {"nonce": nonce, "raw": "0x00"})
        assert [e["nonce"] for e in store.journal_entries()] == [2, 7, 10]
        assert store.journal_get(7) == {"nonce": 7, "raw": "0x00"}


def test_a_closed_store_raises_instead_of_crashing(tmp_path: Path) -> None:
    from node.store.leveldb import StoreClosed

    store = Store(tmp_path, 31337, CONTRACT)
    cursor = store.cursor("events")
    store.close()
    with pytest.raises(StoreClosed):  # a late worker thread after shutdown: typed, not a segfault
        cursor.save([(1, "0x00")])
    with pytest.raises(StoreClosed):
        store.get_verdict(1)

import dataclasses

import plyvel
import pytest
from eth_account import Account

from node.errors import FatalError
from node.protocol.hashing import keccak256
from node.protocol.ledger import InvalidTraining, LedgerEntry, TrainingReason, compute_genesis_head, seal_entry
from node.training.ledger_store import LedgerStore, NonceBook, recover_head_signer, sign_head

RUN = keccak256(b"run")
PROVER = Account.from_key(b"\x07" * 32)


def entry(step: int, prev: bytes) -> LedgerEntry:
    return seal_entry(LedgerEntry(run_id=RUN, step=step, prev_head=prev, positions=(1, 5), values=(0.25, float(step)),
                                  batch_roots=(keccak256(b"%d" % step),), lsh=(1, 2), replica_lsh=((1, 2),), lr=0.01))


def test_entries_chain_and_survive_a_reopen(tmp_path):
    store = LedgerStore(tmp_path / "l", RUN)
    head = compute_genesis_head(RUN)
    for t in range(3):
        e = entry(t, head)
        store.process_entry(e, sign_head(PROVER, RUN, t, e.head))
        head = e.head
    store.close()
    store = LedgerStore(tmp_path / "l", RUN)
    assert store.get_head() == (2, head)
    got, sig = store.get_entry(1)
    assert got.head == entry(1, store.get_entry(0)[0].head).head and got.values == (0.25, 1.0)
    assert recover_head_signer(RUN, 1, got.head, sig) == PROVER.address
    assert [e.step for e in store.entries()] == [0, 1, 2]
    store.close()


def test_a_non_chaining_entry_is_refused_and_nothing_is_written(tmp_path):
    store = LedgerStore(tmp_path / "l", RUN)
    e0 = entry(0, compute_genesis_head(RUN))
    store.process_entry(e0, b"")
    for bad in (entry(1, keccak256(b"other")), entry(2, e0.head), dataclasses.replace(entry(1, e0.head), lr=0.5)):
        with pytest.raises(InvalidTraining) as err:
            store.process_entry(bad, b"")
        assert err.value.training_reason in (TrainingReason.LEDGER_NOT_CHAINED, TrainingReason.LEDGER_STEP_GAP)
    assert store.get_head() == (0, e0.head)
    with pytest.raises(InvalidTraining):
        store.get_entry(1)
    store.close()


def test_a_second_open_is_fatal(tmp_path):
    store = LedgerStore(tmp_path / "l", RUN)
    with pytest.raises(FatalError):
        LedgerStore(tmp_path / "l", RUN)
    store.close()


def test_a_replayed_nonce_is_refused(tmp_path):
    db = plyvel.DB(str(tmp_path / "n"), create_if_missing=True)
    book = NonceBook(db)
    book.process_nonce(b"\x01" * 32, RUN)
    book.process_nonce(b"\x01" * 32, RUN)  # the same run again is idempotent
    with pytest.raises(InvalidTraining) as e:
        book.process_nonce(b"\x01" * 32, keccak256(b"another run"))
    assert e.value.training_reason == TrainingReason.NONCE_REPLAYED
    db.close()

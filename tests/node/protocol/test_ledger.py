import dataclasses
import math

import numpy as np
import pytest

from node.errors import InvalidInput
from node.protocol.hashing import keccak256
from node.protocol.ledger import (
    InvalidTraining,
    LedgerEntry,
    TrainingReason,
    compute_audit_draw,
    compute_batch_root,
    compute_entry_head,
    compute_genesis_head,
    compute_run_id,
    seal_entry,
    verify_batch_root,
    verify_chain,
)
from node.protocol.merkle import compute_leaf_hash, compute_merkle_root

RUN = bytes(range(32))


def make_chain(n: int) -> list[LedgerEntry]:
    head = compute_genesis_head(RUN)
    out = []
    for t in range(n):
        entry = seal_entry(LedgerEntry(
            run_id=RUN, step=t, prev_head=head, positions=(3, 9, 11), values=(0.5, -1.25, float(t)),
            batch_roots=() if t == 0 else (keccak256(b"a%d" % t), keccak256(b"b%d" % t)),
            lsh=(1, -2, 3), replica_lsh=((1, 0, 3), (1, -4, 3)), loss=2.5, lr=1e-3))
        out.append(entry)
        head = entry.head
    return out


def test_chain_verifies_and_returns_last_head():
    chain = make_chain(5)
    assert verify_chain(chain, compute_genesis_head(RUN), 0) == chain[-1].head
    assert verify_chain(chain[2:], chain[1].head, 2) == chain[-1].head


@pytest.mark.parametrize("field,value", [("values", (0.5, -1.25, 2.0000002)), ("lsh", (1, -2, 4)),
                                         ("lr", 2e-3), ("loss", math.nan), ("positions", (3, 9, 12)),
                                         ("replica_lsh", ((1, 0, 3), (1, -4, 2)))])
def test_any_changed_field_breaks_the_chain(field, value):
    chain = make_chain(4)
    chain[2] = dataclasses.replace(chain[2], **{field: value})
    with pytest.raises(InvalidTraining) as e:
        verify_chain(chain, compute_genesis_head(RUN), 0)
    assert e.value.training_reason == TrainingReason.LEDGER_NOT_CHAINED and e.value.step == 2
    assert isinstance(e.value, InvalidInput) and "step 2" in str(e.value)


def test_resealed_entry_does_not_chain_to_the_next():
    chain = make_chain(4)
    chain[1] = seal_entry(dataclasses.replace(chain[1], values=(0.0, 0.0, 0.0)))
    with pytest.raises(InvalidTraining) as e:
        verify_chain(chain, compute_genesis_head(RUN), 0)
    assert e.value.step == 2


def test_skipped_and_repeated_steps_are_gaps():
    chain = make_chain(4)
    with pytest.raises(InvalidTraining) as e:
        verify_chain([chain[0], chain[2]], compute_genesis_head(RUN), 0)
    assert e.value.training_reason == TrainingReason.LEDGER_STEP_GAP
    with pytest.raises(InvalidTraining):
        verify_chain([chain[0], chain[1], chain[1]], compute_genesis_head(RUN), 0)


def test_malformed_entries_are_refused():
    entry = make_chain(1)[0]
    for bad in (dict(positions=(9, 3, 11)), dict(values=(1.0,)), dict(lsh=(1 << 31,)), dict(batch_roots=(b"x",)),
                dict(prev_head=b"short")):
        with pytest.raises(InvalidTraining) as e:
            compute_entry_head(dataclasses.replace(entry, **bad))
        assert e.value.training_reason == TrainingReason.LEDGER_MALFORMED
    with pytest.raises(InvalidTraining):
        compute_genesis_head(b"x")


def test_values_are_hashed_as_float32_bits():
    entry = make_chain(1)[0]
    same = dataclasses.replace(entry, values=tuple(float(np.float32(v)) for v in entry.values))
    assert compute_entry_head(same) == compute_entry_head(entry)


def test_batch_root_is_the_openzeppelin_merkle_root_of_samples():
    ids, toks = [7, 8], [[1, 2, 3], [49151]]
    leaf0 = compute_leaf_hash((7).to_bytes(8, "big") + (3).to_bytes(4, "big") + b"".join(
        x.to_bytes(4, "big") for x in (1, 2, 3)))
    leaf1 = compute_leaf_hash((8).to_bytes(8, "big") + (1).to_bytes(4, "big") + (49151).to_bytes(4, "big"))
    root = compute_batch_root(ids, toks)
    assert root == compute_merkle_root([leaf0, leaf1])
    verify_batch_root(root, ids, toks, 3)
    for bad_ids, bad_toks in (([7, 9], toks), (ids, [[1, 2, 4], [49151]])):
        with pytest.raises(InvalidTraining) as e:
            verify_batch_root(root, bad_ids, bad_toks, 3)
        assert e.value.training_reason == TrainingReason.BATCH_ROOT_MISMATCH
    with pytest.raises(InvalidTraining):
        compute_batch_root([1], [[-1]])


def test_audit_draw_is_keccak_of_packed_fields():
    r = b"\x11" * 32
    assert compute_audit_draw(r, RUN, 5) == keccak256(r + RUN + (5).to_bytes(32, "big"))


def test_training_reasons_share_the_code_space_of_reason():
    from node.protocol.errors import Reason
    from node.protocol.ledger import InvalidTraining, TrainingReason

    for r in TrainingReason:
        assert Reason(int(r)).name == r.name
    err = InvalidTraining("x", TrainingReason.NONCE_REPLAYED, step=3)
    assert err.reason is Reason.NONCE_REPLAYED and err.training_reason is TrainingReason.NONCE_REPLAYED


def test_window_index_matches_the_contracts_anchor_windows():
    from node.protocol.ledger import compute_window_index

    # the first anchor covers 0..m, each later one the next m steps
    assert [compute_window_index(t, 5) for t in range(0, 17)] == [0] * 6 + [1] * 5 + [2] * 5 + [3]
    assert [compute_window_index(t, 1) for t in range(4)] == [0, 0, 1, 2]
    with pytest.raises(InvalidTraining):
        compute_window_index(-1, 5)


def test_run_id_golden_vector_and_prover_binding():
    """compute_run_id is keccak256(abi.encode(address, bytes32)), Training.runIdOf (the anvil test compares them)."""
    spec = keccak256(b"spec")
    assert compute_run_id("0x000000000000000000000000000000000000dEaD", spec).hex() == (
        "fdc923ed0758916e0f4b7eef836af4a24953b9610fb9fda52f45dd7bafa3c8e9")
    assert compute_run_id("0x000000000000000000000000000000000000dead", spec) == compute_run_id(
        "0x000000000000000000000000000000000000dEaD", spec), "the checksum casing does not matter"
    assert compute_run_id("0x" + "11" * 20, spec) != compute_run_id("0x" + "22" * 20, spec)
    with pytest.raises(InvalidInput):
        compute_run_id("0x" + "11" * 19, spec)
    with pytest.raises(InvalidInput):
        compute_run_id("0x" + "11" * 20, spec[:31])

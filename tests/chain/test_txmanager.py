"""The transaction manager on a real anvil node: journal first, identical resend, bumps, nonce handling."""

from __future__ import annotations

from pathlib import Path

import pytest

from chain.devnet import Anvil, dev_account
from chain.txmanager import CONFIRMED, MemoryJournal, TxFailed, TxManager
from tests.chain.conftest import Net

STAKE = 10**18


def bond_call(net: Net):
    return net.hub.contract.functions.bond(2)  # Role.Validator (top-up for net.validators[0])


def manager(net: Net, journal) -> TxManager:
    return TxManager(net.w3, net.validators[0], journal)


def nonce_of(net: Net) -> int:
    return int(net.w3.eth.get_transaction_count(net.validators[0].address))


def test_send_and_confirm(anvil_net: Net) -> None:
    journal = MemoryJournal()
    tm = manager(anvil_net, journal)
    entry = tm.send(bond_call(anvil_net), value=STAKE, purpose="top-up")
    receipt = tm.confirm(entry["nonce"])
    assert receipt["status"] == 1
    assert journal.journal_get(entry["nonce"])["status"] == CONFIRMED


def test_a_crash_between_journal_and_send_resends_the_same_bytes(anvil_net: Net) -> None:
    journal = MemoryJournal()
    entry = manager(anvil_net, journal).prepare(bond_call(anvil_net), value=STAKE)  # then the process dies
    assert nonce_of(anvil_net) == entry["nonce"]  # nothing left the process
    restarted = manager(anvil_net, journal)
    assert [e["nonce"] for e in restarted.resume()] == [entry["nonce"]]
    receipt = restarted.confirm(entry["nonce"])
    assert receipt["transactionHash"].to_0x_hex() == entry["hashes"][0]


def test_a_crash_after_send_never_sends_a_second_transaction(anvil_net: Net) -> None:
    journal = MemoryJournal()
    entry = manager(anvil_net, journal).send(bond_call(anvil_net), value=STAKE)  # mined at once (automine)
    before = nonce_of(anvil_net)
    restarted = manager(anvil_net, journal)
    restarted.resume()  # "nonce too low": handed to the confirmer, not an error
    assert restarted.confirm(entry["nonce"])["status"] == 1
    assert nonce_of(anvil_net) == before
    assert anvil_net.hub.staker(anvil_net.validators[0].address).stake == 5 * STAKE + STAKE  # one top-up only


def test_a_stuck_transaction_is_replaced_at_the_same_nonce(anvil_net: Net) -> None:
    anvil_net.w3.provider.make_request("evm_setAutomine", [False])  # type: ignore[arg-type]
    tm = manager(anvil_net, MemoryJournal())
    entry = tm.send(bond_call(anvil_net), value=STAKE)
    bumped = tm.bump_fees(entry["nonce"])
    assert len(bumped["hashes"]) == 2 and bumped["nonce"] == entry["nonce"]
    anvil_net.mine(1)
    receipt = tm.confirm(entry["nonce"])
    assert receipt["transactionHash"].to_0x_hex() == bumped["hashes"][-1]  # the replacement won
    assert int(receipt["effectiveGasPrice"]) > 0


def test_bumps_stop_at_the_fee_cap(anvil_net: Net) -> None:
    anvil_net.w3.provider.make_request("evm_setAutomine", [False])  # type: ignore[arg-type]
    tm = manager(anvil_net, MemoryJournal())
    entry = tm.send(bond_call(anvil_net), value=STAKE)
    tm.max_fee_cap = int(entry["tx"]["maxFeePerGas"])
    with pytest.raises(TxFailed):
        tm.bump_fees(entry["nonce"])


def test_journaled_but_unsent_nonces_are_never_reused(anvil_net: Net) -> None:
    tm = manager(anvil_net, MemoryJournal())
    first = tm.prepare(bond_call(anvil_net), value=STAKE)
    second = tm.prepare(bond_call(anvil_net), value=STAKE)
    assert second["nonce"] == first["nonce"] + 1


def test_the_journal_lives_in_leveldb_across_restarts(anvil: Anvil, tmp_path: Path) -> None:
    from node.store.leveldb import Store
    from tests.chain.conftest import build_net

    net = build_net(anvil.web3(), [dev_account(i) for i in range(7)])
    with Store(tmp_path, 31337, net.hub.address) as store:
        entry = manager(net, store).prepare(bond_call(net), value=STAKE)
    with Store(tmp_path, 31337, net.hub.address) as store:  # restart
        tm = manager(net, store)
        tm.resume()
        assert tm.confirm(entry["nonce"])["transactionHash"].to_0x_hex() == entry["hashes"][0]
        assert store.journal_get(entry["nonce"])["status"] == CONFIRMED


def test_threads_sending_at_once_get_one_nonce_each(anvil_net: Net) -> None:
    import threading

    tm = manager(anvil_net, MemoryJournal())
    start = nonce_of(anvil_net)
    entries: list[dict] = []
    barrier = threading.Barrier(4)

    def send() -> None:
        barrier.wait()
        entries.append(tm.send(bond_call(anvil_net), value=STAKE, purpose="top-up"))

    threads = [threading.Thread(target=send) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(e["nonce"] for e in entries) == list(range(start, start + 4))
    assert all(tm.confirm(e["nonce"])["status"] == 1 for e in entries)

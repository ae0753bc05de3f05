"""Issue 15 #8 on a real anvil node: dropped, underpriced and failed broadcasts never stall later nonces.

Each test performs the failure (anvil drops the transaction, the base fee jumps past its max fee,
the RPC connection fails or the node refuses the bytes, the process restarts half way) and checks
that every later transaction still mines, that no nonce is taken twice or skipped, and that the
journal shows each attempt.
"""

from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import requests
from eth_account.signers.local import LocalAccount
from web3 import HTTPProvider, Web3

from chain.contracts import Role
from chain.devnet import Anvil
from chain.txmanager import MemoryJournal, TxFailed, TxJournal, TxManager
from tests.chain.conftest import MODEL_ID, Net
from tests.chain.flows import FEE, USER_SEED, honest_artifact

STAKE = 10**18
TIMEOUT = 8.0  # what a confirm may take here; HEAD's txmanager runs into it
FILLED = "filled"  # the journal status of a nonce a no-op took (as stored, so the format is pinned too)


def rpc(net: Net, method: str, *params: Any) -> Any:
    """Call one of anvil's control methods."""
    return net.w3.provider.make_request(method, list(params))  # type: ignore[arg-type]


def manager(net: Net, journal: TxJournal, account: LocalAccount | None = None, w3: Web3 | None = None,
            **settings: Any) -> TxManager:
    tm = TxManager(w3 or net.w3, account or net.validators[0], journal)
    for name, value in settings.items():  # set, not passed: HEAD's TxManager then fails on behaviour, not a TypeError
        setattr(tm, name, value)
    return tm


def bond_call(net: Net) -> Any:
    return net.hub.contract.functions.bond(int(Role.VALIDATOR))  # a top-up for net.validators[0]


def request_call(net: Net) -> Any:
    """A requestInference from net.requester to net.operator (it reverts once the operator unbonds)."""
    h = honest_artifact(int(net.hub.call("nextInferenceId")) + 1)[1].header
    return net.hub.contract.functions.requestInference(
        net.operator.address, MODEL_ID, b"\x33" * 32, USER_SEED,
        (h.temperature_bits, h.top_p_bits, h.top_k, h.max_tokens))


def nonce_of(net: Net, account: LocalAccount | None = None) -> int:
    return int(net.w3.eth.get_transaction_count((account or net.validators[0]).address))


def stake_of(net: Net, account: LocalAccount | None = None) -> int:
    return int(net.hub.staker((account or net.validators[0]).address).stake)


def kinds(entry: dict[str, Any]) -> list[str]:
    return [a["kind"] for a in entry["attempts"]]


def mined_hash(receipt: Any) -> str:
    return str(receipt["transactionHash"].to_0x_hex())


class FlakyProvider(HTTPProvider):
    """anvil behind a link whose first eth_sendRawTransaction calls fail (connection reset, or a refusal)."""

    def __init__(self, url: str, resets: int = 0, refusals: int = 0) -> None:
        super().__init__(url)
        self.resets, self.refusals = resets, refusals

    def make_request(self, method: Any, params: Any) -> Any:
        if method == "eth_sendRawTransaction" and self.resets > 0:
            self.resets -= 1
            raise requests.exceptions.ConnectionError("connection reset by peer")
        if method == "eth_sendRawTransaction" and self.refusals > 0:
            self.refusals -= 1
            return {"jsonrpc": "2.0", "id": 1,
                    "error": {"code": -32000, "message": "insufficient funds for gas * price + value"}}
        return super().make_request(method, params)


# ---- (a) dropped transactions: the gap is found and refilled --------------------------------------


def test_a_dropped_transaction_is_resent_and_the_ones_queued_behind_it_mine(anvil_net: Net) -> None:
    net = anvil_net
    rpc(net, "evm_setAutomine", False)
    journal = MemoryJournal()
    tm = manager(net, journal)
    start, stake = nonce_of(net), stake_of(net)
    first = tm.send(bond_call(net), value=STAKE)
    rpc(net, "anvil_dropAllTransactions")  # the node's mempool lost it
    later = [tm.send(bond_call(net), value=STAKE) for _ in range(2)]
    assert [e["nonce"] for e in (first, *later)] == [start, start + 1, start + 2]
    net.mine(1)
    assert nonce_of(net) == start  # every later transaction waits behind the gap
    rpc(net, "evm_setAutomine", True)
    assert tm.confirm(later[-1]["nonce"], timeout=TIMEOUT)["status"] == 1
    for entry in (first, *later):  # the journaled bytes, not new transactions
        assert mined_hash(tm.confirm(entry["nonce"], timeout=TIMEOUT)) == entry["hashes"][0]
    assert nonce_of(net) == start + 3 and stake_of(net) == stake + 3 * STAKE
    assert journal.journal_get(start)["resent"] >= 1  # type: ignore[index]


def test_a_dropped_transaction_that_would_now_revert_is_replaced_by_a_noop(anvil_net: Net) -> None:
    net = anvil_net
    rpc(net, "evm_setAutomine", False)
    journal = MemoryJournal()
    tm = manager(net, journal, account=net.requester)
    start, requests_before = nonce_of(net, net.requester), int(net.hub.call("nextInferenceId"))
    stale = tm.send(request_call(net), value=FEE + net.hub.request_bond(), purpose="request")
    rpc(net, "anvil_dropAllTransactions")
    later = [tm.send(bond_call(net), value=5 * STAKE, purpose="bond") for _ in range(2)]
    rpc(net, "evm_setAutomine", True)
    net.hub.request_unbond(net.operator)  # the operator leaves: the dropped request would revert now
    assert tm.confirm(later[-1]["nonce"], timeout=TIMEOUT)["status"] == 1
    with pytest.raises(TxFailed, match="no-op"):
        tm.confirm(stale["nonce"], timeout=TIMEOUT)
    entry = journal.journal_get(start)
    assert entry is not None and entry["status"] == FILLED and kinds(entry) == ["original", "noop"]
    noop = net.w3.eth.get_transaction(entry["mined"])
    assert noop["to"] == net.requester.address and noop["value"] == 0
    assert int(noop["maxFeePerGas"]) >= int(stale["tx"]["maxFeePerGas"]) * 11 // 10  # replaces it anywhere
    assert int(net.hub.call("nextInferenceId")) == requests_before
    assert nonce_of(net, net.requester) == start + 3 and stake_of(net, net.requester) == 10 * STAKE


def test_a_gap_below_our_nonces_that_no_journal_entry_explains_is_filled(anvil_net: Net) -> None:
    net = anvil_net
    account = net.validators[0]
    rpc(net, "evm_setAutomine", False)
    start = nonce_of(net)
    base = int(net.w3.eth.get_block("latest")["baseFeePerGas"])  # type: ignore[arg-type]
    other = account.sign_transaction({"to": account.address, "value": 0, "gas": 21_000, "nonce": start,
                                      "chainId": 31337, "maxFeePerGas": 2 * base + 10**9,
                                      "maxPriorityFeePerGas": 10**9})
    net.w3.eth.send_raw_transaction(other.raw_transaction)  # another process holding the same key
    journal = MemoryJournal()
    tm = manager(net, journal)
    entry = tm.send(bond_call(net), value=STAKE)
    assert entry["nonce"] == start + 1
    rpc(net, "anvil_dropTransaction", Web3.to_hex(other.hash))  # ... whose transaction the node then drops
    rpc(net, "evm_setAutomine", True)
    assert mined_hash(tm.confirm(entry["nonce"], timeout=TIMEOUT)) == entry["hashes"][0]
    tm.process_pending()  # settles the filler nobody waits for
    filler = journal.journal_get(start)
    assert filler is not None and filler["status"] == FILLED and kinds(filler) == ["noop"]
    assert nonce_of(net) == start + 2


# ---- (b) stuck and underpriced transactions are re-priced -----------------------------------------


def test_an_underpriced_transaction_is_bumped_until_it_mines(anvil_net: Net) -> None:
    net = anvil_net
    rpc(net, "evm_setAutomine", False)
    journal = MemoryJournal()
    tm = manager(net, journal, stuck_blocks=3, stuck_seconds=3600)
    entry = tm.send(bond_call(net), value=STAKE)
    original_fee = int(entry["tx"]["maxFeePerGas"])
    rpc(net, "anvil_setNextBlockBaseFeePerGas", hex(20 * original_fee))
    net.mine(1)  # the base fee jumps past the transaction's max fee (anvil then drops it)
    assert nonce_of(net) == entry["nonce"]
    rpc(net, "evm_setIntervalMining", 1)  # blocks keep coming
    receipt = tm.confirm(entry["nonce"], timeout=TIMEOUT)
    done = journal.journal_get(entry["nonce"])
    assert done is not None and mined_hash(receipt) == done["hashes"][-1] and len(done["hashes"]) >= 2
    assert kinds(done)[0] == "original" and set(kinds(done)[1:]) == {"bump"}
    fees = [(int(a["max_fee"]), int(a["tip"])) for a in done["attempts"]]
    for (fee, tip), (next_fee, next_tip) in itertools.pairwise(fees):
        assert next_fee >= fee * 11 // 10 and next_tip >= tip * 11 // 10  # a replacement geth accepts
    assert int(receipt["effectiveGasPrice"]) > original_fee
    assert fees[-1][0] <= tm.max_fee_cap


def test_a_transaction_left_in_the_pool_is_bumped_after_stuck_seconds(anvil: Anvil, anvil_net: Net) -> None:
    net = anvil_net
    rpc(net, "evm_setAutomine", False)
    journal = MemoryJournal()
    tm = manager(net, journal, stuck_blocks=1000, stuck_seconds=0.5)
    entry = tm.send(bond_call(net), value=STAKE)
    miner = anvil.web3()

    def mine_after_a_bump() -> None:  # the block producer shows up only once the replacement is there
        deadline = time.monotonic() + TIMEOUT - 2
        while time.monotonic() < deadline and len(journal.journal_get(entry["nonce"])["hashes"]) < 2:  # type: ignore[index]
            time.sleep(0.05)
        miner.provider.make_request("evm_mine", [])  # type: ignore[arg-type]

    thread = threading.Thread(target=mine_after_a_bump)
    thread.start()
    receipt = tm.confirm(entry["nonce"], timeout=TIMEOUT)
    thread.join()
    done = journal.journal_get(entry["nonce"])
    assert done is not None and len(done["hashes"]) == 2 and kinds(done) == ["original", "bump"]
    assert mined_hash(receipt) == done["hashes"][-1]


def test_a_transaction_left_in_the_pool_is_bumped_after_stuck_blocks(anvil_net: Net) -> None:
    net = anvil_net
    rpc(net, "evm_setAutomine", False)
    journal = MemoryJournal()
    tm = manager(net, journal, stuck_blocks=2, stuck_seconds=3600)
    entry = tm.send(bond_call(net), value=STAKE)
    rpc(net, "evm_setBlockGasLimit", hex(int(entry["tx"]["gas"]) - 1))  # blocks come, none can hold it
    net.mine(1)
    assert tm.process_pending() == []  # one block: not stuck yet
    net.mine(1)
    rpc(net, "evm_setBlockGasLimit", hex(30_000_000))
    assert [e["nonce"] for e in tm.process_pending()] == [entry["nonce"]]
    net.mine(1)
    done = journal.journal_get(entry["nonce"])
    assert done is not None and kinds(done) == ["original", "bump"]
    assert mined_hash(tm.confirm(entry["nonce"], timeout=TIMEOUT)) == done["hashes"][-1]


# ---- (c) failed broadcasts --------------------------------------------------------------------------


def test_a_broadcast_that_fails_is_kept_retried_and_its_nonce_never_reused(anvil: Anvil, anvil_net: Net) -> None:
    net = anvil_net
    journal = MemoryJournal()
    tm = manager(net, journal, w3=Web3(FlakyProvider(anvil.url, resets=1)))
    start, stake = nonce_of(net), stake_of(net)
    first = tm.send(bond_call(net), value=STAKE)  # the connection resets: journaled, not lost, not raised
    assert nonce_of(net) == start and "ConnectionError" in journal.journal_get(start)["last_error"]  # type: ignore[index]
    second = tm.send(bond_call(net), value=STAKE)
    assert second["nonce"] == start + 1  # neither reused nor skipped
    assert tm.confirm(second["nonce"], timeout=TIMEOUT)["status"] == 1  # mines only once the first is resent
    assert mined_hash(tm.confirm(first["nonce"], timeout=TIMEOUT)) == first["hashes"][0]
    assert nonce_of(net) == start + 2 and stake_of(net) == stake + 2 * STAKE


def test_a_broadcast_the_node_refuses_fills_its_nonce_so_later_ones_mine(anvil: Anvil, anvil_net: Net) -> None:
    net = anvil_net
    journal = MemoryJournal()
    tm = manager(net, journal, w3=Web3(FlakyProvider(anvil.url, refusals=1)))
    start, stake = nonce_of(net), stake_of(net)
    with pytest.raises(TxFailed, match="no-op"):
        tm.send(bond_call(net), value=STAKE)
    second = tm.send(bond_call(net), value=STAKE)
    assert second["nonce"] == start + 1
    assert tm.confirm(second["nonce"], timeout=TIMEOUT)["status"] == 1
    with pytest.raises(TxFailed, match="no-op"):
        tm.confirm(start, timeout=TIMEOUT)
    assert kinds(journal.journal_get(start)) == ["original", "noop"]  # type: ignore[arg-type]
    assert nonce_of(net) == start + 2 and stake_of(net) == stake + STAKE  # the refused call never ran


# ---- (d) a restart half way -------------------------------------------------------------------------


def test_a_restart_while_a_transaction_is_underpriced_reprices_it(anvil_net: Net, tmp_path: Path) -> None:
    from node.store.leveldb import Store

    net = anvil_net
    rpc(net, "evm_setAutomine", False)
    with Store(tmp_path, 31337, net.hub.address) as store:
        entry = manager(net, store).send(bond_call(net), value=STAKE)
        rpc(net, "anvil_setNextBlockBaseFeePerGas", hex(20 * int(entry["tx"]["maxFeePerGas"])))
        net.mine(1)  # priced out and dropped; then the process dies
    with Store(tmp_path, 31337, net.hub.address) as store:
        tm = manager(net, store, stuck_blocks=3, stuck_seconds=3600)
        tm.resume()  # the node refuses the journaled bytes as underpriced: re-priced, not a crash
        rpc(net, "evm_setIntervalMining", 1)
        receipt = tm.confirm(entry["nonce"], timeout=TIMEOUT)
        done = store.journal_get(entry["nonce"])
        assert done is not None and done["hashes"][0] == entry["hashes"][0] and kinds(done)[:2] == ["original", "bump"]
        assert mined_hash(receipt) == done["hashes"][-1]


def test_a_restart_after_a_drop_fills_the_nonce_of_a_transaction_that_would_revert(anvil_net: Net,
                                                                                   tmp_path: Path) -> None:
    from node.store.leveldb import Store

    net = anvil_net
    rpc(net, "evm_setAutomine", False)
    start = nonce_of(net, net.requester)
    with Store(tmp_path, 31337, net.hub.address) as store:
        tm = manager(net, store, account=net.requester)
        tm.send(request_call(net), value=FEE + net.hub.request_bond(), purpose="request")
        rpc(net, "anvil_dropAllTransactions")
        later = [tm.send(bond_call(net), value=5 * STAKE, purpose="bond") for _ in range(2)]
    # the process dies; meanwhile the operator leaves
    rpc(net, "evm_setAutomine", True)
    net.hub.request_unbond(net.operator)
    with Store(tmp_path, 31337, net.hub.address) as store:
        tm = manager(net, store, account=net.requester)
        tm.resume()
        assert tm.confirm(later[-1]["nonce"], timeout=TIMEOUT)["status"] == 1
        with pytest.raises(TxFailed):
            tm.confirm(start, timeout=TIMEOUT)
        entry = store.journal_get(start)
        assert entry is not None and entry["status"] == FILLED and kinds(entry) == ["original", "noop"]
    assert nonce_of(net, net.requester) == start + 3

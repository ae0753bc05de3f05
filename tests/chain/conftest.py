"""Chain fixtures: an in-process EVM (eth-tester) for fast tests and a real anvil node."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount
from web3 import Web3
from web3.providers.eth_tester import EthereumTesterProvider

from chain.contracts import Hub, HubConfig, ModelState, Role
from chain.deploy import deploy
from chain.devnet import Anvil, dev_account

MODEL_ID = b"\x11" * 32
K = 5
VOCAB = 1024
STOP_TOKENS = (2,)
MIN_FEE = 10**15
ALPHA = 10**16
BETA = 0


@dataclass
class Net:
    """A deployed hub with a punitive model, one operator, validators, a requester."""

    w3: Web3
    hub: Hub
    admin: LocalAccount
    operator: LocalAccount
    validators: list[LocalAccount]
    requester: LocalAccount
    treasury: LocalAccount

    def mine(self, blocks: int) -> None:
        """Advance the chain by `blocks` blocks."""
        for _ in range(blocks):
            self.w3.provider.make_request("evm_mine", [])  # type: ignore[attr-defined]


def build_net(w3: Web3, accounts: list[LocalAccount], validators: int = 3, min_check_rate: int = 10**18) -> Net:
    """Deploy the hub, register the test model as punitive, bond an operator and validators."""
    admin, operator, requester, treasury, *vals = accounts
    hub, _ = deploy(w3, admin, HubConfig(treasury=treasury.address))
    hub.register_model(admin, MODEL_ID, K, VOCAB, ALPHA, BETA, min_check_rate, b"\x22" * 32, STOP_TOKENS, MIN_FEE)
    hub.advance_model_to(admin, MODEL_ID, ModelState.PUNITIVE)
    hub.bond(operator, Role.OPERATOR, 10 * 10**18)
    for v in vals[:validators]:
        hub.bond(v, Role.VALIDATOR, 5 * 10**18)
    net = Net(w3, hub, admin, operator, vals[:validators], requester, treasury)
    net.mine(1)
    return net


def funded_tester_accounts(w3: Web3, n: int) -> list[LocalAccount]:
    """Return n fresh local accounts funded from eth-tester's coinbase."""
    out = []
    for i in range(n):
        acct: LocalAccount = Account.from_key((0xA000 + i).to_bytes(32, "big"))
        w3.eth.send_transaction({"from": w3.eth.accounts[0], "to": acct.address, "value": 100 * 10**18})
        out.append(acct)
    return out


@pytest.fixture
def tester_net() -> Net:
    """A fresh in-process chain with the hub deployed (fast; unit tests only)."""
    w3 = Web3(EthereumTesterProvider())
    return build_net(w3, funded_tester_accounts(w3, 7))


@pytest.fixture
def anvil() -> Iterator[Anvil]:
    """A real anvil node on a free loopback port."""
    with Anvil() as node:
        yield node


@pytest.fixture
def anvil_net(anvil: Anvil) -> Net:
    """The hub deployed on anvil."""
    return build_net(anvil.web3(), [dev_account(i) for i in range(7)])

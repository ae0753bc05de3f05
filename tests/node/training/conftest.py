"""Training chain fixtures: a real anvil with the hub, three bonded validators and the Training contract."""

import pytest

from chain.contracts import WEIGHT_DELAY, HubConfig, Role
from chain.deploy import deploy
from chain.devnet import Anvil, dev_account
from chain.training import TrainingContract, TrainingDeployConfig


@pytest.fixture(scope="module")
def net():
    """Yield (anvil, w3, training, validators, prover, treasury): one node per test module."""
    with Anvil() as node:
        w3 = node.web3()
        admin, treasury, prover = dev_account(0), dev_account(1), dev_account(3)
        validators = [dev_account(i) for i in (2, 5, 6)]
        hub, _ = deploy(w3, admin, HubConfig(treasury=treasury.address))
        for v in validators:
            hub.bond(v, Role.VALIDATOR, 5 * 10**18)
        training, _ = TrainingContract.deploy(w3, admin, TrainingDeployConfig(hub=hub.address,
                                                                             treasury=treasury.address))
        for _ in range(WEIGHT_DELAY):  # the validators' stake settles before any anchor (StakeQuorum.weightDelay)
            w3.provider.make_request("evm_mine", [])
        yield node, w3, training, validators, prover, treasury

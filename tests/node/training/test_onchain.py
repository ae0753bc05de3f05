"""The Training contract on a real anvil through chain.training: parity of draws and digests, slashing, replay."""

import pytest

from chain.contracts import HubConfig, Role
from chain.deploy import deploy
from chain.devnet import Anvil, dev_account
from chain.errors import ContractReverted
from chain.training import TrainingContract, TrainingDeployConfig, compute_verdict_digest
from node.protocol.hashing import keccak256
from node.protocol.ledger import TrainingReason, compute_audit_draw
from node.protocol.lsh import is_audited
from node.training.onchain import get_audited_steps, submit_audit_verdict

RATE = 5 * 10**17


@pytest.fixture(scope="module")
def net():
    with Anvil() as node:
        w3 = node.web3()
        admin, treasury, validator, prover = (dev_account(i) for i in range(4))
        hub, _ = deploy(w3, admin, HubConfig(treasury=treasury.address))
        hub.bond(validator, Role.VALIDATOR, 5 * 10**18)
        training, _ = TrainingContract.deploy(w3, admin, TrainingDeployConfig(hub=hub.address,
                                                                             treasury=treasury.address))
        yield w3, training, validator, prover, treasury


def mine(w3, n):
    for _ in range(n):
        w3.provider.make_request("evm_mine", [])


def test_anchor_draw_verdict_and_slash(net):
    w3, training, validator, prover, treasury = net
    run, nonce = keccak256(b"run-a"), keccak256(b"nonce-a")
    training.register_run(prover, run, nonce, b"\x01" * 32, b"\x02" * 32, 0, RATE, 5, 2 * 10**18)
    with pytest.raises(ContractReverted) as e:
        training.register_run(prover, keccak256(b"run-b"), nonce, b"\x01" * 32, b"\x02" * 32, 0, RATE, 5, 2 * 10**18)
    assert e.value.error == "NonceReplayed"
    head = keccak256(b"head-5")
    receipt = training.anchor(prover, run, 5, head)
    assert receipt["gasUsed"] < 150_000
    with pytest.raises(ContractReverted) as e:
        training.audit_seed(run, 0)
    assert e.value.error == "DrawNotReady"
    mine(w3, 2)
    seed = training.audit_seed(run, 0)
    assert seed == bytes(w3.eth.get_block(receipt["blockNumber"] + 1)["hash"])
    steps = get_audited_steps(training, run, 0)
    assert steps == [t for t in range(6) if is_audited(compute_audit_draw(seed, run, t), RATE)]
    step = steps[0] if steps else None
    if step is None:
        pytest.skip("no step drawn at p = 0.5 in this block (probability 1/64)")
    digest = compute_verdict_digest(int(w3.eth.chain_id), training.address, run, step, head, False, 709)
    assert digest == training.verdict_digest(run, step, head, False, 709)
    assert submit_audit_verdict(training, validator, run, 0, step, False, int(TrainingReason.RECOMPUTE_MISMATCH))
    assert not submit_audit_verdict(training, validator, run, 0, step, True, 0)  # already settled: skipped
    rec = training.get_run(run)
    assert rec.slashed and rec.bond == 0
    assert training.audit_result(run, step) == 2
    assert training.credits(treasury.address) == 2 * 10**18
    with pytest.raises(ContractReverted) as e:
        training.anchor(prover, run, 10, keccak256(b"head-10"))
    assert e.value.error == "NotRunning"

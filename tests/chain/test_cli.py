"""The operator commands against a real anvil node: deploy, stake, register the calibrated SmolLM2."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from chain.contracts import Hub, ModelState, Role
from chain.deploy import read_deployment
from chain.devnet import Anvil, dev_account
from node.cli import app

runner = CliRunner()


def test_deploy_stake_and_register_a_model(anvil: Anvil, tmp_path: Path) -> None:
    admin, operator = dev_account(0), dev_account(1)
    env = {"VERINFER_RPC": anvil.url, "ADMIN_KEY": admin.key.hex(), "OP_KEY": operator.key.hex()}
    out = tmp_path / "deployment.json"
    r = runner.invoke(app, ["chain", "deploy", "--key-env", "ADMIN_KEY", "--out", str(out)], env=env)
    assert r.exit_code == 0, r.output
    d = read_deployment(out)
    assert d.chain_id == 31337 and d.deployer == admin.address
    r = runner.invoke(app, ["stake", "bond", "--role", "operator", "--amount-eth", "2", "--deployment", str(out),
                            "--key-env", "OP_KEY"], env=env)
    assert r.exit_code == 0, r.output
    hub = Hub(anvil.web3(), d.address)
    assert hub.staker(operator.address).role is Role.OPERATOR and hub.staker(operator.address).stake == 2 * 10**18
    r = runner.invoke(app, ["models", "register", "smollm2-135m-instruct", "--state", "punitive", "--deployment",
                            str(out), "--key-env", "ADMIN_KEY"], env=env)
    assert r.exit_code == 0, r.output
    model_id = bytes.fromhex(r.output.split("as 0x")[1][:64])
    alpha, beta, rate, vocab, k, state, _, min_fee = hub.call("models", model_id)
    assert (k, vocab, state) == (5, 49_152, ModelState.PUNITIVE)
    assert hub.stop_tokens(model_id) == frozenset({2}) and min_fee == 10**15  # the default --min-fee-eth 0.001
    assert 0 < alpha < 10**17 and 0 <= beta < 10**18 and rate == 5 * 10**16
    # a non-governor cannot register; the error is typed, not a traceback
    r = runner.invoke(app, ["models", "register", "smollm2-135m-instruct", "--deployment", str(out),
                            "--key-env", "OP_KEY"], env=env)
    assert r.exit_code == 1 and "AccessControlUnauthorizedAccount" in r.output


def test_refuses_a_deployment_on_another_chain(anvil: Anvil, tmp_path: Path) -> None:
    record = tmp_path / "d.json"
    record.write_text('{"chain_id": 1, "address": "0x5FbDB2315678afecb367f032d93F642f64180aa3", "block": 1, '
                      '"deployer": "0x0000000000000000000000000000000000000001", '
                      '"config": {"treasury": "0x0000000000000000000000000000000000000001"}}')
    r = runner.invoke(app, ["stake", "show", dev_account(0).address, "--deployment", str(record),
                            "--rpc", anvil.url])
    assert r.exit_code != 0 and "chain 31337" in r.output

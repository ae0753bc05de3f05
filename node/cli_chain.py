"""`verinfer chain|stake|models …`: deploy the contract and drive stake and the model registry.

Keys come from an environment variable holding a hex private key (`--key-env`, default
VERINFER_PRIVATE_KEY); the encrypted keystore arrives with the validator daemon.
"""

from __future__ import annotations

import math
import os
import tomllib
from pathlib import Path
from typing import Any

import typer
from eth_account import Account
from eth_account.signers.local import LocalAccount
from rich.console import Console
from web3 import Web3

from chain.contracts import Hub, HubConfig, ModelState, Role
from chain.deploy import deploy, read_deployment, write_deployment
from chain.errors import ChainError
from node.profiles import UncalibratedProfile, model_registration

console = Console(soft_wrap=True)  # hashes and addresses must stay on one line
chain_app = typer.Typer(help="Deploy and inspect the Verinfer contract.", no_args_is_help=True)
stake_app = typer.Typer(help="Operator and validator stake.", no_args_is_help=True)
models_app = typer.Typer(help="The on-chain model registry.", no_args_is_help=True)
WAD = 10**18

RPC = typer.Option("http://127.0.0.1:8545", envvar="VERINFER_RPC", help="JSON-RPC endpoint.")
CONTRACT = typer.Option("", envvar="VERINFER_CONTRACT", help="Contract address (or use --deployment).")
DEPLOYMENT = typer.Option(None, help="Deployment JSON written by `verinfer chain deploy`.")
KEY_ENV = typer.Option("VERINFER_PRIVATE_KEY", help="Environment variable holding the hex private key.")


def load_account(key_env: str) -> LocalAccount:
    """Return the account whose key is in the named environment variable (never printed)."""
    key = os.environ.get(key_env, "")
    if not key:
        raise typer.BadParameter(f"set {key_env} to the account's hex private key")
    account: LocalAccount = Account.from_key(key)
    return account


def connect(rpc: str, contract: str, deployment: Path | None) -> Hub:
    """Return a client for the contract at --contract or in --deployment, checking the chain id."""
    w3 = Web3(Web3.HTTPProvider(rpc))
    if deployment is not None:
        d = read_deployment(deployment)
        if int(w3.eth.chain_id) != d.chain_id:
            raise typer.BadParameter(f"{rpc} is chain {w3.eth.chain_id}, the deployment is on chain {d.chain_id}")
        contract = d.address
    if not contract:
        raise typer.BadParameter("give --contract or --deployment")
    if not w3.eth.get_code(Web3.to_checksum_address(contract)):
        raise typer.BadParameter(f"no contract at {contract} on {rpc}")
    return Hub(w3, contract)


def _run(action: Any) -> Any:
    try:
        return action()
    except ChainError as exc:
        console.print(f"[red]{type(exc).__name__}: {exc}[/red]")
        raise typer.Exit(1) from exc


@chain_app.command("deploy")
def chain_deploy(
    rpc: str = RPC,
    key_env: str = KEY_ENV,
    treasury: str = typer.Option("", help="Treasury address (default: the deployer)."),
    config: Path = typer.Option(None, help="TOML with HubConfig fields (defaults suit a devnet)."),
    out: Path = typer.Option(Path("deployment.json"), help="Where to write the deployment record."),
) -> None:
    """Deploy the contract; the deployer becomes admin and governor."""
    account = load_account(key_env)
    fields: dict[str, Any] = tomllib.loads(config.read_text()) if config else {}
    fields.setdefault("treasury", treasury or account.address)
    w3 = Web3(Web3.HTTPProvider(rpc))
    _, d = _run(lambda: deploy(w3, account, HubConfig(**fields)))
    write_deployment(d, out)
    console.print(f"deployed at {d.address} on chain {d.chain_id} (block {d.block}); record: {out}")


@stake_app.command("bond")
def stake_bond(role: str = typer.Option(..., help="operator or validator"),
               amount_eth: float = typer.Option(..., help="ETH to bond or add."),
               rpc: str = RPC, contract: str = CONTRACT, deployment: Path = DEPLOYMENT, key_env: str = KEY_ENV) -> None:
    """Bond stake as an operator or a validator (or top it up)."""
    if role.upper() not in ("OPERATOR", "VALIDATOR"):
        raise typer.BadParameter("--role must be operator or validator")
    hub, account = connect(rpc, contract, deployment), load_account(key_env)
    _run(lambda: hub.bond(account, Role[role.upper()], Web3.to_wei(amount_eth, "ether")))
    _show(hub, account.address)


def _register_account_action(name: str, method: str, doc: str) -> None:
    """Add `verinfer stake <name>`: one account-signed call without arguments, then the record."""

    def command(rpc: str = RPC, contract: str = CONTRACT, deployment: Path = DEPLOYMENT,
                key_env: str = KEY_ENV) -> None:
        hub, account = connect(rpc, contract, deployment), load_account(key_env)
        _run(lambda: getattr(hub, method)(account))
        _show(hub, account.address)

    command.__doc__ = doc
    stake_app.command(name)(command)


_register_account_action("unbond", "request_unbond", "Start unbonding (stake stays slashable until withdrawn).")
_register_account_action("withdraw", "withdraw", "Withdraw the stake after the unbonding delay.")
_register_account_action("claim", "claim", "Withdraw credited fees, rewards and refunds.")


@stake_app.command("show")
def stake_show(address: str = typer.Argument(..., help="Staker address."), rpc: str = RPC, contract: str = CONTRACT,
               deployment: Path = DEPLOYMENT) -> None:
    """Print a staker's record."""
    _show(connect(rpc, contract, deployment), address)


def _show(hub: Hub, address: str) -> None:
    s = _run(lambda: hub.staker(address))
    console.print(f"{address}: role {s.role.name.lower()}, stake {Web3.from_wei(s.stake, 'ether')} ETH, "
                  f"P {s.spoof_p / WAD:.6g}, jailed {s.jailed}, unbonding since block {s.unbond_block or '-'}, "
                  f"credits {Web3.from_wei(hub.credits(address), 'ether')} ETH")


@models_app.command("register")
def models_register(
    name: str = typer.Argument(..., help="Model name in config/models.toml."),
    min_check_rate: float = typer.Option(0.05, min=0.0, max=1.0, help="Least probability an inference is checked."),
    state: str = typer.Option("verifying", help="Phase to move it to: registered|measuring|verifying|punitive."),
    min_fee_eth: float = typer.Option(0.001, min=0.0, help="Least fee a request pays (besides the bond)."),
    rpc: str = RPC, contract: str = CONTRACT, deployment: Path = DEPLOYMENT, key_env: str = KEY_ENV,
) -> None:
    """Register a model with its calibrated α, β, K, profile hash, stop tokens and minimum fee (governor only)."""
    hub, account = connect(rpc, contract, deployment), load_account(key_env)
    try:
        r = model_registration(name)
    except UncalibratedProfile as e:
        raise typer.BadParameter(str(e)) from e
    _run(lambda: r.register(hub, account, math.ceil(min_check_rate * WAD), Web3.to_wei(min_fee_eth, "ether")))
    _run(lambda: hub.advance_model_to(account, r.model_id, ModelState[state.upper()]))
    console.print(f"registered {name} as 0x{r.model_id.hex()}: K {r.k}, vocab {r.vocab_size}, "
                  f"alpha {r.alpha / WAD:.4g}, beta {r.beta / WAD:.4g}, stop tokens {list(r.stop_tokens)}, "
                  f"state {state}")

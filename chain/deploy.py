"""Deploy the Verinfer contract and record where it lives."""

from __future__ import annotations

import json
from pathlib import Path

from eth_account.signers.local import LocalAccount
from pydantic import BaseModel, ConfigDict
from web3 import Web3

from chain.contracts import Hub, HubConfig


class Deployment(BaseModel):
    """Where a deployment lives: what a node's config points at."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    chain_id: int
    address: str
    block: int
    deployer: str
    config: HubConfig


def deploy(w3: Web3, account: LocalAccount, config: HubConfig) -> tuple[Hub, Deployment]:
    """Deploy the contract; the deployer becomes admin and governor."""
    hub, receipt = Hub.deploy(w3, account, config)
    return hub, Deployment(chain_id=int(w3.eth.chain_id), address=hub.address, block=int(receipt["blockNumber"]),
                           deployer=account.address, config=config)


def write_deployment(deployment: Deployment, path: Path) -> None:
    """Write a deployment record as JSON."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(deployment.model_dump(), indent=2) + "\n")


def read_deployment(path: Path) -> Deployment:
    """Read a deployment record."""
    return Deployment.model_validate_json(path.read_text())

"""Spot checks on a local chain: anvil, the hub and SpotCheck; bonded operators open runs, verifiers vote.

One operator per device (each device's answers are signed by its own operator key, and a failed window
slashes exactly that operator), three validators bonded with equal stake (the module needs ≥ 3 eligible
validators, 2/3 of the weight and ≥ 2 signers). Each validator decides every window from the record on its
own, records the decision in its own slashing-protection store, signs and submits its vote from its own
account; a window settles on chain when the second agreeing vote lands. Success: every cheater's operator
lost stake and is jailed, no honest operator lost anything.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from eth_account.signers.local import LocalAccount
from web3 import Web3
from web3.types import RPCEndpoint

from chain.contracts import WEIGHT_DELAY, Hub, HubConfig, Role
from chain.deploy import deploy
from chain.devnet import Anvil, dev_account
from chain.errors import ContractReverted
from chain.spotcheck import SpotCheckClient, WindowResult, deploy_spotcheck
from node.spotcheck.onchain import compute_run_key, process_sign_window, to_window_decision
from node.spotcheck.verify import SpotcheckPolicy, WindowMeasurement, WindowVerdict
from node.store.leveldb import Store

log = logging.getLogger(__name__)
OPERATOR_STAKE = 2 * 10**18
VALIDATOR_STAKE = 5 * 10**18
N_VALIDATORS = 3
FIRST_OPERATOR = 2 + N_VALIDATORS  # dev accounts: 0 admin, 1 treasury, 2..4 validators, then one per device


@dataclass(frozen=True)
class SpotDevnet:
    """A running devnet: the hub, the SpotCheck module, the validators and one operator per device."""

    w3: Web3
    hub: Hub
    spotcheck: SpotCheckClient
    validators: tuple[LocalAccount, ...]
    operators: dict[str, LocalAccount]


@dataclass(frozen=True)
class DeviceVotes:
    """One verifier's decisions on one device: its windows' measurements and verdicts."""

    device_id: str
    measurements: tuple[WindowMeasurement, ...]
    verdicts: tuple[WindowVerdict, ...]


@dataclass(frozen=True)
class OperatorOutcome:
    """What the chain says about one device's operator after the votes."""

    device_id: str
    operator: str
    stake_before: int
    stake_after: int
    jailed: bool
    windows: tuple[int, ...]  # WindowResult per window: 0 open, 1 passed, 2 failed

    @property
    def slashed(self) -> bool:
        """Check whether the operator lost stake."""
        return self.stake_after < self.stake_before


@contextmanager
def open_devnet(device_ids: Sequence[str], log_path: Path | None = None) -> Iterator[SpotDevnet]:
    """Start anvil, deploy the hub and SpotCheck, bond the validators and one operator per device; stop at exit."""
    with Anvil(accounts=FIRST_OPERATOR + len(device_ids), log_path=log_path) as anvil:
        w3 = anvil.web3()
        admin, treasury = dev_account(0), dev_account(1)
        hub, _ = deploy(w3, admin, HubConfig(treasury=treasury.address))
        validators = tuple(dev_account(2 + i) for i in range(N_VALIDATORS))
        for v in validators:
            hub.bond(v, Role.VALIDATOR, VALIDATOR_STAKE)
        operators = {d: dev_account(FIRST_OPERATOR + i) for i, d in enumerate(device_ids)}
        for op in operators.values():
            hub.bond(op, Role.OPERATOR, OPERATOR_STAKE)
        spotcheck = deploy_spotcheck(w3, admin, hub)
        for _ in range(WEIGHT_DELAY):  # the validators' stake settles before any run opens (StakeQuorum)
            w3.provider.make_request(RPCEndpoint("evm_mine"), [])
        yield SpotDevnet(w3, hub, spotcheck, validators, operators)


def process_open_runs(devnet: SpotDevnet, run_id: str) -> dict[str, int]:
    """Open the run for every operator (validators are bonded before: the weight block precedes the opening).

    Return each device operator's hub stake at the opening.
    """
    key = compute_run_key(run_id)
    for op in devnet.operators.values():
        devnet.spotcheck.open_run(key, op)
    devnet.w3.provider.make_request(RPCEndpoint("evm_mine"), [])  # votes come in blocks after the opening
    return {d: int(devnet.hub.call("stakers", op.address)[0]) for d, op in devnet.operators.items()}


def process_votes(devnet: SpotDevnet, validator: LocalAccount, decisions: Sequence[DeviceVotes],
                  policy: SpotcheckPolicy, run_id: str, store_path: Path) -> int:
    """Record, sign and submit one validator's votes on every window it decided; return the votes sent."""
    sc, chain_id = devnet.spotcheck, devnet.hub.chain_id()
    sent = 0
    with Store(store_path, chain_id, sc.address) as store:
        for device in decisions:
            operator = devnet.operators[device.device_id].address
            for m, v in zip(device.measurements, device.verdicts, strict=True):
                decision = to_window_decision(v, m, policy, run_id)
                vote = process_sign_window(store, validator, chain_id, sc.address, operator, decision)
                if sc.window_result(operator, decision.run_key, decision.window_key) is not WindowResult.OPEN:
                    continue  # settled by the others' votes: nothing left to count
                try:
                    sc.submit_votes(operator, decision.run_key, decision.window_key, [vote], validator)
                    sent += 1
                except ContractReverted as exc:
                    if exc.error != "AlreadySettled":  # a race with another relayer is fine; anything else is not
                        raise
    return sent


def get_outcomes(devnet: SpotDevnet, run_id: str, stakes_before: dict[str, int],
                 windows: dict[str, Sequence[WindowVerdict]]) -> tuple[OperatorOutcome, ...]:
    """Return each device operator's stake, jail flag and window results as the chain has them."""
    from node.spotcheck.onchain import compute_window_id

    key = compute_run_key(run_id)
    out = []
    for device_id, op in devnet.operators.items():
        staker = devnet.hub.call("stakers", op.address)
        results = tuple(int(devnet.spotcheck.window_result(
            op.address, key, compute_window_id(run_id, device_id, v.window).to_bytes(32, "big")))
            for v in windows.get(device_id, ()))
        out.append(OperatorOutcome(device_id, op.address, stakes_before[device_id], int(staker[0]), bool(staker[6]),
                                   results))
    return tuple(out)


def is_chain_ok(outcomes: Sequence[OperatorOutcome], cheats: dict[str, bool]) -> bool:
    """Check that exactly the cheaters' operators were slashed and jailed, and no honest window failed."""
    return all((o.slashed and o.jailed) == cheats[o.device_id] and (cheats[o.device_id] or (
        o.windows and all(w == WindowResult.PASSED for w in o.windows))) for o in outcomes)

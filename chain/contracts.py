"""Typed client for the deployed Verinfer contract (web3.py 8, locally signed transactions).

Reverts come back as ``ContractReverted`` naming the contract's custom error, whichever node or
provider produced them (anvil answers with JSON-RPC error data, eth-tester raises with raw bytes).
"""

from __future__ import annotations

import ast
import contextlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from functools import cache
from pathlib import Path
from typing import Any, Self

from eth_abi.abi import decode as abi_decode
from eth_account.signers.local import LocalAccount
from eth_utils.crypto import keccak
from pydantic import BaseModel, ConfigDict, Field, model_validator
from web3 import Web3
from web3.exceptions import ContractCustomError, ContractLogicError, TransactionNotFound, Web3Exception
from web3.types import TxReceipt

from chain.errors import ChainError, ChainUnavailable, ContractReverted

ARTIFACT = Path(__file__).resolve().parent / "artifacts" / "Verinfer.json"
VIEWS_ARTIFACT = ARTIFACT.with_name("ProtocolViews.json")


class Role(IntEnum):
    """Staking roles (Staking.Role)."""

    NONE = 0
    OPERATOR = 1
    VALIDATOR = 2


class ModelState(IntEnum):
    """Phased rollout of a model (ModelRegistry.ModelState)."""

    NONE = 0
    REGISTERED = 1
    MEASURING = 2
    VERIFYING = 3
    PUNITIVE = 4


class Status(IntEnum):
    """An inference's life (Verinfer.Status)."""

    NONE = 0
    REQUESTED = 1
    COMMITTED = 2
    VALID = 3
    INVALID = 4
    UNCHECKED = 5
    EXPIRED = 6
    FRAUD = 7
    UNCHECKABLE = 8  # fewer than minCommittee validators eligible at the commit: fee and bond refunded


class HubConfig(BaseModel):
    """Constructor parameters of the contract (Verinfer.Config); defaults suit a devnet."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_operator_stake: int = Field(10**18, ge=0)
    min_validator_stake: int = Field(10**18, ge=0)
    unbonding_delay: int = Field(600, gt=0, description="blocks")
    treasury: str
    commit_window: int = Field(20, gt=0, description="blocks after the request")
    check_window: int = Field(100, gt=0, lt=255, description="blocks after the commit")
    fraud_window: int = Field(300, gt=0, description="blocks after the commit")
    committee_size: int = Field(3, ge=1, le=16)
    slash_threshold: int = Field(99 * 10**16, ge=0, le=10**18)
    slash_bps: int = Field(5000, ge=0, le=10_000)
    slash_validator_share_bps: int = Field(2000, ge=0, le=10_000)
    fraud_slash_bps: int = Field(10_000, ge=0, le=10_000)
    prover_reward_bps: int = Field(1000, ge=0, le=10_000)
    validator_fee_bps: int = Field(1000, ge=0, le=10_000)
    timeout_slash_bps: int = Field(100, ge=0, le=10_000)
    request_bond: int = Field(10**16, ge=0, lt=2**96, description="wei locked per request besides the fee")
    min_committee: int = Field(3, ge=1, le=16, description="fewer eligible validators: not checkable")

    @model_validator(mode="after")
    def _committee_fits(self) -> HubConfig:
        if self.min_committee > self.committee_size:
            raise ValueError(f"min_committee {self.min_committee} > committee_size {self.committee_size}")
        return self

    def as_tuple(self) -> tuple[Any, ...]:
        """Return the ABI tuple in Verinfer.Config's field order."""
        return tuple(getattr(self, name) for name in type(self).model_fields)


@dataclass(frozen=True)
class Params:
    """Declared sampling parameters as committed on chain (float32 bit patterns)."""

    temperature_bits: int
    top_p_bits: int
    top_k: int
    max_tokens: int


def params_from_event(value: Any) -> Params:
    """Return Params from a decoded event or call value (web3 gives a struct as a mapping, sometimes a tuple)."""
    if hasattr(value, "keys"):
        return Params(int(value["temperatureBits"]), int(value["topPBits"]), int(value["topK"]),
                      int(value["maxTokens"]))
    t, p, k, m = value
    return Params(int(t), int(p), int(k), int(m))


@dataclass(frozen=True)
class Commitment:
    """What an operator commits for an inference."""

    output_hash: bytes
    artifact_root: bytes
    fingerprint_hash: bytes

    def as_tuple(self) -> tuple[bytes, bytes, bytes]:
        """Return the ABI tuple."""
        return (self.output_hash, self.artifact_root, self.fingerprint_hash)


@dataclass(frozen=True)
class Vote:
    """One signed verdict as submitted (Verinfer.Vote)."""

    valid: bool
    reason: int
    scores_digest: bytes
    deadline: int
    signature: bytes

    def as_tuple(self) -> tuple[Any, ...]:
        """Return the ABI tuple."""
        return (self.valid, self.reason, self.scores_digest, self.deadline, self.signature)


@dataclass(frozen=True)
class Inference:
    """An inference's stored record (Verinfer.Inference)."""

    requester: str
    user_seed: int
    commit_deadline: int
    operator: str
    fee: int
    model_id: bytes
    commitment: bytes
    commit_block: int
    status: Status
    valid_votes: int
    invalid_votes: int
    voted: int
    voted_invalid: int
    bond: int
    check_rate: int
    max_tokens: int
    accepted: bool


@dataclass(frozen=True)
class Staker:
    """A staker's record (Staking.Staker)."""

    stake: int
    spoof_p: int
    bond_block: int
    unbond_block: int
    open: int
    role: Role
    jailed: bool


@cache
def load_artifact(path: Path = ARTIFACT) -> dict[str, Any]:
    """Return the committed ABI + bytecode."""
    artifact: dict[str, Any] = json.loads(path.read_text())
    return artifact


@cache
def _error_table(path: Path = ARTIFACT) -> dict[bytes, tuple[str, list[str]]]:
    table = {keccak(text="Error(string)")[:4]: ("Error", ["string"]),
             keccak(text="Panic(uint256)")[:4]: ("Panic", ["uint256"])}
    for item in load_artifact(path)["abi"]:
        if item["type"] == "error":
            types = [abi_type(i) for i in item["inputs"]]
            table[keccak(text=f"{item['name']}({','.join(types)})")[:4]] = (item["name"], types)
    return table


def abi_type(item: dict[str, Any]) -> str:
    """Return the canonical ABI type of a parameter (tuples spelled out)."""
    if item["type"].startswith("tuple"):
        return "(" + ",".join(abi_type(c) for c in item["components"]) + ")" + str(item["type"])[5:]
    return str(item["type"])


def decode_revert(data: bytes, path: Path = ARTIFACT) -> ContractReverted:
    """Return the typed error for revert data (selector + ABI-encoded arguments) of the contract at `path`."""
    name, types = _error_table(path).get(data[:4], ("", []))
    if not name:
        return ContractReverted("UnknownError", (), "0x" + data.hex())
    try:
        args = tuple(Web3.to_checksum_address(v) if t == "address" else v
                     for t, v in zip(types, abi_decode(types, data[4:]), strict=True))
    except Exception:  # malformed revert data is still a revert
        args = ()
    return ContractReverted(name, args, "0x" + data.hex())


_HEX = re.compile(r"0x[0-9a-fA-F]{8,}")
_BYTES_LITERAL = re.compile(r"b'(?:[^'\\]|\\.)*'|b\"(?:[^\"\\]|\\.)*\"")


def revert_from_exception(exc: BaseException) -> ContractReverted | None:
    """Return the typed revert carried by a web3 or eth-tester exception, or None if it is not a revert."""
    data: Any = getattr(exc, "data", None)
    if isinstance(exc, (ContractCustomError, ContractLogicError)) and isinstance(data, str) and data.startswith("0x"):
        return decode_revert(bytes.fromhex(data[2:]))
    if type(exc).__name__ == "TransactionFailed":  # eth-tester: the raw revert bytes are its argument
        raw = exc.args[0] if exc.args else b""
        if isinstance(raw, bytes):
            return decode_revert(raw)
        text = str(raw)
        literal = _BYTES_LITERAL.search(text)
        if literal:
            with contextlib.suppress(ValueError, SyntaxError):
                return decode_revert(ast.literal_eval(literal.group(0)))
        match = _HEX.search(text)
        return decode_revert(bytes.fromhex(match.group(0)[2:])) if match else ContractReverted(text)
    if isinstance(exc, ContractLogicError):
        return ContractReverted("Reverted", (), str(exc))
    return None


class Hub:
    """The Verinfer contract at one address, driven by locally held keys."""

    def __init__(self, w3: Web3, address: str) -> None:
        self.w3 = w3
        self.address = Web3.to_checksum_address(address)
        self.contract = w3.eth.contract(address=self.address, abi=load_artifact()["abi"])
        self._views: Any = None

    # ---- plumbing ----------------------------------------------------------------------------

    @classmethod
    def deploy(cls, w3: Web3, account: LocalAccount, config: HubConfig) -> tuple[Hub, TxReceipt]:
        """Deploy a new contract and return its client and the receipt."""
        art = load_artifact()
        factory = w3.eth.contract(abi=art["abi"], bytecode=art["bytecode"])
        receipt = send(w3, account, factory.constructor(config.as_tuple()))
        return cls(w3, str(receipt["contractAddress"])), receipt

    def call(self, name: str, *args: Any) -> Any:
        """Call a view function; reverts raise ContractReverted."""
        try:
            return getattr(self.contract.functions, name)(*args).call()
        except Exception as exc:  # translated below
            raise translate_error(exc) from exc

    def call_views(self, name: str, *args: Any) -> Any:
        """Call one of the protocol views (ProtocolViews, deployed by the hub's constructor)."""
        if self._views is None:
            address = self.call("protocolViews")
            self._views = self.w3.eth.contract(address=address, abi=load_artifact(VIEWS_ARTIFACT)["abi"])
        try:
            return getattr(self._views.functions, name)(*args).call()
        except Exception as exc:  # translated below
            raise translate_error(exc) from exc

    def transact(self, account: LocalAccount, name: str, *args: Any, value: int = 0) -> TxReceipt:
        """Sign and send a transaction to a contract function and wait for its receipt."""
        return send(self.w3, account, getattr(self.contract.functions, name)(*args), value=value)

    def chain_id(self) -> int:
        """Return the connected chain's id."""
        return int(self.w3.eth.chain_id)

    # ---- operator and validator stake ----------------------------------------------------------

    def bond(self, account: LocalAccount, role: Role, amount: int) -> TxReceipt:
        """Bond or top up stake."""
        return self.transact(account, "bond", int(role), value=amount)

    def request_unbond(self, account: LocalAccount) -> TxReceipt:
        """Start unbonding."""
        return self.transact(account, "requestUnbond")

    def withdraw(self, account: LocalAccount) -> TxReceipt:
        """Withdraw stake after the unbonding delay."""
        return self.transact(account, "withdraw")

    def claim(self, account: LocalAccount) -> TxReceipt:
        """Withdraw credited fees, rewards and refunds."""
        return self.transact(account, "claim")

    def staker(self, address: str) -> Staker:
        """Return a staker's record."""
        s = self.call("stakers", Web3.to_checksum_address(address))
        return Staker(s[0], s[1], s[2], s[3], s[4], Role(s[5]), s[6])

    def credits(self, address: str) -> int:
        """Return an address's withdrawable credits."""
        return int(self.call("credits", Web3.to_checksum_address(address)))

    # ---- models ----------------------------------------------------------------------------

    def register_model(self, account: LocalAccount, model_id: bytes, k: int, vocab_size: int, alpha: int, beta: int,
                       min_check_rate: int, profile_hash: bytes, stop_tokens: Sequence[int],
                       min_fee: int = 0) -> TxReceipt:
        """Register a model with its calibrated parameters, stop tokens and minimum fee."""
        return self.transact(account, "registerModel", model_id, k, vocab_size, alpha, beta, min_check_rate,
                             profile_hash, min_fee, [int(t) for t in stop_tokens])

    def stop_tokens(self, model_id: bytes) -> frozenset[int]:
        """Return a registered model's stop tokens."""
        return frozenset(int(t) for t in self.call("stopTokensOf", model_id))

    def min_fee(self, model_id: bytes) -> int:
        """Return the least fee a request for this model pays (besides the bond)."""
        return int(self.call("models", model_id)[7])

    def request_bond(self) -> int:
        """Return the bond a requester locks per request."""
        return int(self.call("requestBond"))

    def set_model_state(self, account: LocalAccount, model_id: bytes, state: ModelState) -> TxReceipt:
        """Move a model one phase."""
        return self.transact(account, "setModelState", model_id, int(state))

    def advance_model_to(self, account: LocalAccount, model_id: bytes, state: ModelState) -> None:
        """Step a model's phase forward until it reaches `state`."""
        current = ModelState(self.call("models", model_id)[5])
        for step in range(current + 1, state + 1):
            self.set_model_state(account, model_id, ModelState(step))

    # ---- inferences --------------------------------------------------------------------------

    def request_inference(self, account: LocalAccount, operator: str, model_id: bytes, prompt_hash: bytes,
                          user_seed: int, params: Params, fee: int) -> int:
        """Request an inference paying `fee` plus the contract's request bond, and return its id."""
        receipt = self.transact(account, "requestInference", Web3.to_checksum_address(operator), model_id,
                                prompt_hash, user_seed, (params.temperature_bits, params.top_p_bits, params.top_k,
                                                         params.max_tokens), value=fee + self.request_bond())
        events = self.contract.events.InferenceRequested().process_receipt(receipt)
        return int(events[0]["args"]["inferenceId"])

    def accept_inference(self, account: LocalAccount, inference_id: int) -> TxReceipt:
        """Acknowledge (as its operator) that the prompt arrived: a missed deadline is penalised from now on."""
        return self.transact(account, "acceptInference", inference_id)

    def has_voted(self, inference_id: int, validator: str) -> bool:
        """Return whether a validator's vote on an inference is recorded."""
        return bool(self.call("hasVoted", inference_id, Web3.to_checksum_address(validator)))

    def commit_inference(self, account: LocalAccount, inference_id: int, c: Commitment) -> TxReceipt:
        """Commit an inference's output hash, artifact root and fingerprint hash."""
        return self.transact(account, "commitInference", inference_id, *c.as_tuple())

    def get_inference(self, inference_id: int) -> Inference:
        """Return an inference's stored record."""
        r = self.call("getInference", inference_id)
        return Inference(r[0], r[1], r[2], r[3], r[4], bytes(r[5]), bytes(r[6]), r[7], Status(r[8]), r[9], r[10],
                         r[11], r[12], r[13], r[14], r[15], bool(r[16]))

    def selection_of(self, inference_id: int) -> tuple[bool, list[str]]:
        """Return whether an inference is checked and its committee."""
        checked, committee = self.call("selectionOf", inference_id)
        return bool(checked), [Web3.to_checksum_address(a) for a in committee]

    def submit_verdicts(self, account: LocalAccount, inference_id: int, c: Commitment,
                        votes: Sequence[Vote]) -> TxReceipt:
        """Submit signed verdicts (any account may)."""
        return self.transact(account, "submitVerdicts", inference_id, c.as_tuple(), [v.as_tuple() for v in votes])

    def finalize(self, account: LocalAccount, inference_id: int) -> TxReceipt:
        """Settle an inference whose check window ended."""
        return self.transact(account, "finalize", inference_id)

    def expire(self, account: LocalAccount, inference_id: int) -> TxReceipt:
        """Expire an inference whose operator never committed."""
        return self.transact(account, "expire", inference_id)

    def prove_fraud(self, account: LocalAccount, inference_id: int, c: Commitment, header_hash: bytes, leaf: bytes,
                    proof: Sequence[bytes]) -> TxReceipt:
        """Prove a stage-1 forgery from one artifact leaf and its Merkle proof."""
        return self.transact(account, "proveFraud", inference_id, c.as_tuple(), header_hash, leaf, list(proof))

    def prove_termination(self, account: LocalAccount, inference_id: int, c: Commitment, header: bytes,
                          positions_root: bytes, leaf: bytes, proof: Sequence[bytes]) -> TxReceipt:
        """Prove a termination-rule breach from the header (and one leaf with its Merkle proof, if any)."""
        return self.transact(account, "proveTermination", inference_id, c.as_tuple(), header, positions_root, leaf,
                             list(proof))

    def verdict_digest(self, inference_id: int, artifact_root: bytes, valid: bool, reason: int, scores_digest: bytes,
                       deadline: int) -> bytes:
        """Return the contract's EIP-712 digest of a verdict."""
        return bytes(self.call("verdictDigest", inference_id, artifact_root, valid, reason, scores_digest, deadline))


def send(w3: Web3, account: LocalAccount, fn: Any, value: int = 0, timeout: float = 60.0) -> TxReceipt:
    """Build, sign and send one transaction, wait for its receipt; raise typed errors."""
    try:
        tx = fn.build_transaction({"from": account.address, "value": value,
                                   "nonce": w3.eth.get_transaction_count(account.address, "pending")})
        # the estimate runs in the latest block's context: a call that appends a checkpoint of a shared history
        # (the hub's eligible count) pays a fresh slot in the next block that it did not pay in the estimate
        tx["gas"] = int(int(tx["gas"]) * SEND_GAS_MARGIN) + 30_000
        tx_hash = w3.eth.send_raw_transaction(account.sign_transaction(tx).raw_transaction)
        receipt = w3.eth.wait_for_transaction_receipt(tx_hash, timeout=timeout)
    except Exception as exc:  # translated below
        raise translate_error(exc) from exc
    if receipt["status"] != 1:
        raise ContractReverted("Reverted", (), receipt["transactionHash"].hex())
    return receipt


MODULE_ROLE = keccak(text="MODULE_ROLE")  # the hub's role for modules that may slash (slashForModule)
# StakeQuorum.weightDelay of the modules a devnet or test deploys: blocks a validator's stake must stand before a
# quorum's reference block to count (a real network sets hours of blocks; docs/security.md, issue 30 finding 5)
WEIGHT_DELAY = 4
SEND_GAS_MARGIN = 1.25  # `send`'s estimate × this + 30k (TxManager keeps its own margin)


class ModuleClient:
    """A module beside the hub (its artifact at `ARTIFACT`) at one address, driven by locally held keys."""

    ARTIFACT: Path

    def __init__(self, w3: Web3, address: str) -> None:
        self.w3 = w3
        self.address = Web3.to_checksum_address(address)
        self.contract = w3.eth.contract(address=self.address, abi=load_artifact(self.ARTIFACT)["abi"])

    def call(self, name: str, *args: Any) -> Any:
        """Call a view; reverts raise ContractReverted with the module's error name."""
        try:
            return getattr(self.contract.functions, name)(*args).call()
        except Exception as exc:  # translated below
            raise translate_module_error(exc, self.ARTIFACT) from exc

    def transact(self, account: LocalAccount, name: str, *args: Any) -> TxReceipt:
        """Sign and send a transaction and wait for its receipt."""
        try:
            return send(self.w3, account, getattr(self.contract.functions, name)(*args))
        except Exception as exc:  # translated below
            raise translate_module_error(exc, self.ARTIFACT) from exc

    def get_events(self, name: str, from_block: int, to_block: int | str = "latest",
                   argument_filters: dict[str, Any] | None = None) -> list[Any]:
        """Return decoded logs of one event in a block range."""
        try:
            event = getattr(self.contract.events, name)()
            return list(event.get_logs(from_block=from_block, to_block=to_block, argument_filters=argument_filters))
        except Exception as exc:  # translated below
            raise translate_module_error(exc, self.ARTIFACT) from exc

    @classmethod
    def deploy_beside(cls, w3: Web3, account: LocalAccount, hub: Hub, *constructor_args: Any) -> Self:
        """Deploy the module beside `hub` and grant it MODULE_ROLE (`account` must be the hub's admin)."""
        art = load_artifact(cls.ARTIFACT)
        factory = w3.eth.contract(abi=art["abi"], bytecode=art["bytecode"])
        try:
            receipt = send(w3, account, factory.constructor(hub.address, *constructor_args))
        except Exception as exc:  # translated below
            raise translate_module_error(exc, cls.ARTIFACT) from exc
        client = cls(w3, str(receipt["contractAddress"]))
        hub.transact(account, "grantRole", MODULE_ROLE, client.address)
        return client


def translate_module_error(exc: BaseException, path: Path) -> ChainError:
    """Return translate_error's error, with a revert the hub's table does not know named from `path`'s ABI."""
    err = translate_error(exc)
    if isinstance(err, ContractReverted) and err.error == "UnknownError" and err.data.startswith("0x"):
        return decode_revert(bytes.fromhex(err.data[2:]), path)
    return err


def translate_error(exc: BaseException) -> ChainError:
    """Return the chain error a web3 or provider exception stands for."""
    if isinstance(exc, ChainError):
        return exc
    revert = revert_from_exception(exc)
    if revert is not None:
        return revert
    if isinstance(exc, (ConnectionError, OSError, TimeoutError, TransactionNotFound)):
        return ChainUnavailable(str(exc))
    if isinstance(exc, Web3Exception):
        return ChainUnavailable(f"{type(exc).__name__}: {exc}")
    return ChainError(f"{type(exc).__name__}: {exc}")

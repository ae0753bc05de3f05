"""Executer mode on a chain: serve only inferences requested from this operator, commit each on chain.

Before generating, the request must match what the chain recorded for its inference id (operator,
model, user seed, prompt hash, sampling params), and the operator accepts it on chain: that is its
acknowledgement that the prompt arrived, and only an accepted request that then misses its commit
deadline costs the operator stake (an unaccepted one just refunds the requester). After generating,
the commitment is sent through the transaction manager (journaled first) and confirmed before the
response leaves. The payload is on disk (synced) before the commitment is journaled, so a restart at any
point finds every commitment it may re-send with the payload validators will ask for; `resume_commits`
refuses to re-send one whose payload is missing (a journal from an older version, a lost disk).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol

from chain.contracts import Hub, Params, Status, params_from_event
from chain.errors import ChainError
from chain.txmanager import PENDING, TxManager
from node.errors import InvalidInput, Reason, RecoverableError
from node.protocol.sampler import SamplingParams

log = logging.getLogger(__name__)


COMMIT_PURPOSE = "commit "


class PayloadReader(Protocol):
    """What `resume_commits` reads of the executer's durable store."""

    def get_served(self, inference_id: int) -> bytes | None:
        """Return a stored payload."""


class Served(Protocol):
    """What the gate needs of a served inference."""

    @property
    def inference_id(self) -> int:
        """Return the inference id."""

    @property
    def output_hash(self) -> bytes:
        """Return outputHash."""

    @property
    def fingerprint_hash(self) -> bytes:
        """Return fingerprintHash."""


@dataclass
class ChainGate:
    """Checks requests against the chain and commits results for one operator and model."""

    hub: Hub
    txm: TxManager
    model_id: bytes

    def authorize(self, inference_id: int | None, prompt_hash: bytes, user_seed: int | None,
                  params: SamplingParams) -> bytes:
        """Raise InvalidInput unless the chain holds exactly this request for this operator, still open.

        Return the hash of the block after the request's block: the projection seed's chain randomness
        (protocol v2; it exists once the request is accepted, which is mined in a later block).
        """
        if inference_id is None or user_seed is None:
            raise InvalidInput("on-chain mode needs inference_id and seed", Reason.SEED_MISMATCH)
        try:
            inf = self.hub.get_inference(inference_id)
            logs = self.hub.contract.events.InferenceRequested().get_logs(
                from_block=0, argument_filters={"inferenceId": inference_id})
        except ChainError as exc:
            raise RecoverableError(f"chain unavailable: {exc}", Reason.CHAIN_UNAVAILABLE) from exc
        if inf.status is not Status.REQUESTED or not logs:
            raise InvalidInput(f"inference {inference_id} is {inf.status.name.lower()}", Reason.SEED_MISMATCH)
        args = logs[0]["args"]
        checks = (
            (inf.operator == self.txm.account.address, Reason.SEED_MISMATCH, "another operator's inference"),
            (bytes(inf.model_id) == self.model_id, Reason.MODEL_MISMATCH, "another model"),
            (inf.user_seed == user_seed, Reason.SEED_MISMATCH, "another user seed"),
            (bytes(args["promptHash"]) == prompt_hash, Reason.PROMPT_MISMATCH, "another prompt"),
            (params_from_event(args["params"]) == Params(params.temperature_bits, params.top_p_bits, params.top_k,
                                                         params.max_tokens),
             Reason.PARAMS_MISMATCH, "other sampling params"),
        )
        for ok, reason, what in checks:
            if not ok:
                raise InvalidInput(f"inference {inference_id} was requested with {what}", reason)
        if not inf.accepted:
            self.accept(inference_id)
        return self.get_block_hash_after(int(logs[0]["blockNumber"]))

    def get_block_hash_after(self, block: int) -> bytes:
        """Return the hash of block + 1, or raise RecoverableError while it is not mined."""
        try:
            return bytes(self.hub.w3.eth.get_block(block + 1)["hash"])
        except Exception as exc:  # web3 raises BlockNotFound or a transport error: both mean "not yet"
            raise RecoverableError(f"block {block + 1} not available: {exc}", Reason.CHAIN_UNAVAILABLE) from exc

    def accept(self, inference_id: int) -> None:
        """Acknowledge on chain that this request's prompt arrived (journaled, then confirmed)."""
        fn = self.hub.contract.functions.acceptInference(inference_id)
        try:
            entry = self.txm.send(fn, purpose=f"accept {inference_id}")
            self.txm.confirm(entry["nonce"])
        except ChainError as exc:
            raise RecoverableError(f"accept of {inference_id} failed: {exc}", Reason.TX_FAILED) from exc

    def commit(self, served: Served, artifact_root: bytes) -> None:
        """Commit output hash, artifact root and fingerprint hash, and wait until mined."""
        fn = self.hub.contract.functions.commitInference(served.inference_id, served.output_hash, artifact_root,
                                                         served.fingerprint_hash)
        try:
            entry = self.txm.send(fn, purpose=f"commit {served.inference_id}")
            self.txm.confirm(entry["nonce"])
        except ChainError as exc:
            raise RecoverableError(f"commit of {served.inference_id} failed: {exc}", Reason.TX_FAILED) from exc
        log.info("inference committed", extra={"inference_id": served.inference_id})


def resume_commits(txm: TxManager, payloads: PayloadReader) -> list[int]:
    """After a restart: re-send the journaled transactions; a commit whose payload is not on disk is never re-sent.

    Such a commit's nonce is filled with a no-op instead (later nonces still mine): the validators could not
    fetch its payload, so sending it would only get an honest operator's inference judged unavailable. Return
    the inference ids of the commits dropped so.
    """
    dropped = []
    for entry in txm.journal.journal_entries():
        purpose = str(entry.get("purpose", ""))
        if entry["status"] != PENDING or not purpose.startswith(COMMIT_PURPOSE) or entry.get("filled"):
            continue
        inference_id = int(purpose.removeprefix(COMMIT_PURPOSE))
        if payloads.get_served(inference_id) is not None:
            continue
        try:
            txm.cancel(int(entry["nonce"]))  # the manager's own no-op fill (as for a transaction that would now revert)
        except Exception as exc:
            raise RecoverableError(f"chain unavailable: {exc}", Reason.CHAIN_UNAVAILABLE) from exc
        log.error("journaled commit without its payload on disk: not re-sent, its nonce filled with a no-op",
                  extra={"inference_id": inference_id, "nonce": entry["nonce"]})
        dropped.append(inference_id)
    txm.resume()  # the rest (and the no-ops) go out again, byte for byte
    return dropped

"""The hub committee's dense check of an MoE inference: stage 1 and stage 2 on the served tokens (issue 30).

The per-expert duties judge the trace the executer records in a teacher-forced pass after decoding; nothing
in them binds the served tokens and the artifact's candidates and logprobs to that pass. So a hub committee
member also checks the served inference as a dense one: the operator's payload (`GET /v1/payloads/{id}`) must
be the committed one — its artifact root and output hash the hub's, its fingerprint proofs' hash with the
opened moeRoot bound in (`compute_moe_fingerprint_hash`) the committed fingerprint hash, its request the
requested prompt — then stage 1 (the canonical sampler's rule at every position) and stage 2 (one prefill of
prompt + output on the claimed MoE model, the dense profile's thresholds) decide. A failure makes the hub
verdict invalid whatever the duties say (node.validator.moe.MoeDutyService.vote_one).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass, replace
from typing import Any

import aiohttp
from web3 import Web3

from chain.contracts import Hub, params_from_event
from node.checks.decision import Stage2Thresholds
from node.engines.base import Engine
from node.engines.models import ModelFiles
from node.engines.tokenizer import ModelTokenizer
from node.errors import InvalidInput, Reason, RecoverableError
from node.executer.api import InferencePayload, decode_inference_payload
from node.protocol.fingerprint import compute_fingerprint_hash, decode_fingerprint_base64
from node.protocol.hashing import keccak256
from node.protocol.moe import MoeReason, compute_moe_fingerprint_hash
from node.protocol.projection import KIND_PROJECTION
from node.validator.httpread import read_capped
from node.validator.verify import NO_BLOCK_HASH, ChainFacts, VerificationReport, find_payload_mismatch, verify_payload

log = logging.getLogger(__name__)
MAX_PAYLOAD = 32 * 2**20


@dataclass(frozen=True)
class MoeDenseVerdict:
    """The dense check's outcome for one MoE inference."""

    valid: bool
    reason: int  # a Reason (stage 1, stage 2, payload) or MoeReason.DUTY_DATA_UNAVAILABLE
    scores_digest: bytes


def find_moe_payload_mismatch(payload: InferencePayload, facts: ChainFacts,
                              moe_root: bytes) -> tuple[Reason, ChainFacts]:
    """Return why an MoE payload is not the committed one (or OK) and the facts with its dense fingerprint hash.

    The chain holds keccak256(fingerprintHash ‖ moeRoot); the payload's proofs give fingerprintHash.
    """
    try:
        dense = compute_fingerprint_hash(decode_fingerprint_base64(payload.verification_proofs))
    except InvalidInput as exc:
        return exc.reason, facts
    if compute_moe_fingerprint_hash(dense, moe_root) != facts.fingerprint_hash:
        return Reason.FINGERPRINT_MALFORMED, facts
    unbound = replace(facts, fingerprint_hash=dense)
    return find_payload_mismatch(payload, unbound), unbound


def verify_moe_payload(payload: InferencePayload, facts: ChainFacts, moe_root: bytes, files: ModelFiles,
                       tokenizer: ModelTokenizer, engine: Engine, thresholds: Stage2Thresholds) -> VerificationReport:
    """Return the dense verification report of an MoE inference's payload (stage 1, one prefill, stage 2)."""
    reason, unbound = find_moe_payload_mismatch(payload, facts, moe_root)
    if reason is not Reason.OK:
        return VerificationReport(reason, None, None, None)
    return verify_payload(payload, files, tokenizer, engine, thresholds, unbound, decision_only=True)


def read_chain_facts(hub: Hub, inference_id: int, projection: bool = False) -> ChainFacts:
    """Return what the chain recorded for an inference: its request event (at its block) and its commitment."""
    inf = hub.get_inference(inference_id)
    block = inf.commit_deadline - int(hub.call("commitWindow"))  # the request's block (commitDeadline's origin)
    logs = hub.contract.events.InferenceRequested().get_logs(from_block=block, to_block=block,
                                                             argument_filters={"inferenceId": inference_id})
    committed = hub.contract.events.InferenceCommitted().get_logs(
        from_block=inf.commit_block, to_block=inf.commit_block, argument_filters={"inferenceId": inference_id})
    if not logs or not committed:
        raise RecoverableError(f"inference {inference_id}: request or commit event not found", Reason.CHAIN_UNAVAILABLE)
    req, com = logs[0]["args"], committed[0]["args"]
    p = params_from_event(req["params"])
    block_hash = bytes(hub.w3.eth.get_block(block + 1)["hash"]) if projection else NO_BLOCK_HASH
    return ChainFacts(inference_id, int(req["userSeed"]), bytes(req["modelId"]), p.temperature_bits, p.top_p_bits,
                      p.top_k, p.max_tokens, bytes(req["promptHash"]), bytes(com["outputHash"]),
                      bytes(com["artifactRoot"]), bytes(com["fingerprintHash"]), block_hash)


class MoeDenseCheck:
    """A hub committee member's dense check of the MoE model's inferences (whole model loaded, one prefill each)."""

    def __init__(self, hub: Hub, files: ModelFiles, tokenizer: ModelTokenizer, engine: Engine,
                 thresholds: Stage2Thresholds, executers: dict[str, str], lock: threading.Lock | None = None,
                 fetch_timeout: float = 10.0, fetch_retries: int = 3) -> None:
        """`executers`: operator address → executer URL; `lock`: held around the engine (shared with others)."""
        self.hub = hub
        self.files = files
        self.tokenizer = tokenizer
        self.engine = engine
        self.thresholds = thresholds
        self.executers = {Web3.to_checksum_address(k): v.rstrip("/") for k, v in executers.items()}
        self.lock = lock or threading.Lock()
        self.fetch_timeout = fetch_timeout
        self.fetch_retries = fetch_retries

    async def __call__(self, inference_id: int, moe_root: bytes) -> MoeDenseVerdict:
        """Return the dense verdict on one opened MoE inference (raises RecoverableError when it cannot tell yet)."""
        projection = KIND_PROJECTION in self.files.spec.fingerprint_kinds
        facts = await asyncio.to_thread(read_chain_facts, self.hub, inference_id, projection)
        inf = await asyncio.to_thread(self.hub.get_inference, inference_id)
        url = self.executers.get(Web3.to_checksum_address(inf.operator))
        if url is None:  # our configuration's gap, never evidence against the operator
            raise RecoverableError(f"no executer URL for operator {inf.operator}", Reason.CHAIN_UNAVAILABLE)
        payload = await self._fetch(f"{url}/v1/payloads/{inference_id}")
        if payload is None:  # withholding the payload is no way out of the check
            return MoeDenseVerdict(False, int(MoeReason.DUTY_DATA_UNAVAILABLE), keccak256(b"payload-unavailable"))
        report = await asyncio.to_thread(self._verify_locked, payload, facts, moe_root)
        digest = report.decision.scores_digest if report.decision else keccak256(report.reason.name.encode())
        log.info("MoE dense check", extra={"inference_id": inference_id, "reason": report.reason.name})
        return MoeDenseVerdict(report.valid, int(report.reason), digest)

    def _verify_locked(self, payload: InferencePayload, facts: ChainFacts, moe_root: bytes) -> VerificationReport:
        with self.lock:
            return verify_moe_payload(payload, facts, moe_root, self.files, self.tokenizer, self.engine,
                                      self.thresholds)

    async def _fetch(self, url: str) -> InferencePayload | None:
        """Return the operator's payload, or None after the retries."""
        timeout = aiohttp.ClientTimeout(total=self.fetch_timeout)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            for attempt in range(self.fetch_retries):
                try:
                    async with session.get(url) as response:
                        if response.status != 200:
                            raise ValueError(f"http {response.status}")
                        raw = await read_capped(response, MAX_PAYLOAD)
                    return decode_inference_payload(bytes(raw))
                except (InvalidInput, aiohttp.ClientError, TimeoutError, ValueError) as exc:
                    log.info("MoE payload not served: %s", exc, extra={"url": url})
                    await asyncio.sleep(min(0.2 * 2**attempt, 5.0))
        return None


def has_dense_profile(model: str) -> bool:
    """Check whether a registered MoE model has its dense stage-2 profile (then its hub verdicts need the check)."""
    from node.engines.models import REPO_ROOT, get_model_spec

    return (REPO_ROOT / get_model_spec(model).profile).exists()


def dense_check_of(slot: Any, hub: Hub, executers: dict[str, str], fetch_timeout: float,
                   fetch_retries: int) -> MoeDenseCheck:
    """Return the dense check over a daemon's model slot (node.validator.daemon.ModelSlot) of the MoE model."""
    return MoeDenseCheck(hub, slot.files, slot.tokenizer, slot.engine, slot.thresholds, executers, slot.lock,
                         fetch_timeout, fetch_retries)


__all__ = ["MoeDenseCheck", "MoeDenseVerdict", "dense_check_of", "find_moe_payload_mismatch", "has_dense_profile",
           "read_chain_facts", "verify_moe_payload"]

"""Verify one inference payload end to end: decode, stage 1, one prefill, stage 2, decision.

Without a chain (``verinfer verify --payload``) the commitments are the payload's own artifact and
the declared params stand in for the on-chain request; the daemon passes the chain's values.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any

from node.checks.decision import Stage2Decision, Stage2Thresholds, decide_stage2, is_weight_error_only
from node.checks.projection import (
    ProjectionThresholds,
    decide_projection,
    require_registered_kind,
    select_projection_rows,
)
from node.checks.stage1 import OnchainInference, SequenceCheckResult, sequence_check
from node.checks.stage2 import Stage2Measurements, measure_stage2, measure_stage2_decision
from node.engines.base import Engine, Prefill
from node.engines.models import ModelFiles
from node.engines.tokenizer import ModelTokenizer
from node.errors import FatalError, InvalidArtifact, InvalidInput, Reason
from node.executer.api import InferencePayload
from node.protocol.artifact import Artifact, compute_output_hash, decode_artifact_wire
from node.protocol.fingerprint import (
    ChunkMeasurement,
    compute_fingerprint_hash,
    decode_fingerprint_base64,
    verify_fingerprint,
)
from node.protocol.projection import (
    KIND_PROJECTION,
    ProjectionMeasurement,
    compute_projection_seed,
    split_toploc_blob,
    verify_projection_blob,
)
from node.protocol.prompt import compute_prompt_hash, normalise_messages

# Off chain there is no block after the request: the projection seed's block hash is 32 zero bytes (docs/protocol.md).
NO_BLOCK_HASH = bytes(32)


@dataclass(frozen=True)
class VerificationReport:
    """Everything a validator concluded about one inference."""

    reason: Reason
    stage1: SequenceCheckResult | None
    measurements: Stage2Measurements | None
    decision: Stage2Decision | None
    projection: ProjectionMeasurement | None = None

    @property
    def valid(self) -> bool:
        """Check whether the inference passed every check."""
        return self.reason is Reason.OK


def tokenise_request(tokenizer: ModelTokenizer, request: dict[str, object]) -> tuple[int, ...]:
    """Return the validator's own prompt ids for a request (chat messages or completion text)."""
    if "messages" in request:
        messages = request["messages"]
        if not isinstance(messages, list):
            raise InvalidInput("request messages must be a list", Reason.PROMPT_MISMATCH)
        return tokenizer.encode_chat(normalise_messages(messages))
    prompt = request.get("prompt")
    if not isinstance(prompt, str):
        raise InvalidInput("request has neither messages nor prompt", Reason.PROMPT_MISMATCH)
    return tokenizer.encode_text(prompt)


def decode_payload_artifact(payload: InferencePayload) -> Artifact:
    """Return the payload's artifact, or raise InvalidArtifact."""
    try:
        wire = base64.b64decode(payload.artifact, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidArtifact(f"artifact is not base64: {exc}", Reason.WIRE_MALFORMED) from exc
    return decode_artifact_wire(wire)


@dataclass(frozen=True)
class ChainFacts:
    """What the chain recorded for an inference (the daemon's view; `verinfer verify` has none)."""

    inference_id: int
    user_seed: int
    model_id: bytes
    temperature_bits: int
    top_p_bits: int
    top_k: int
    max_tokens: int
    prompt_hash: bytes
    output_hash: bytes
    artifact_root: bytes
    fingerprint_hash: bytes
    # hash of the block after the request's block (the InferenceRequested event's): seeds kind-1 projections
    projection_block_hash: bytes = NO_BLOCK_HASH


def compute_request_prompt_hash(model_id: bytes, request: dict[str, Any]) -> bytes:
    """Return the prompt hash of a payload's request (chat messages or completion text)."""
    messages = request.get("messages")
    if messages is not None:
        return compute_prompt_hash(model_id, messages=messages)
    return compute_prompt_hash(model_id, prompt=str(request.get("prompt")))


def find_payload_mismatch(payload: InferencePayload, facts: ChainFacts) -> Reason:
    """Return why a fetched payload is not the committed one (it must not be cached), or Reason.OK."""
    try:
        art = decode_payload_artifact(payload)
        proofs = decode_fingerprint_base64(payload.verification_proofs)
        prompt_hash = compute_request_prompt_hash(facts.model_id, payload.request)
    except (InvalidInput, TypeError, ValueError) as exc:
        return exc.reason if isinstance(exc, InvalidInput) else Reason.WIRE_MALFORMED
    if int(payload.inference_id) != facts.inference_id:
        return Reason.SEED_MISMATCH
    if art.root != facts.artifact_root:
        return Reason.ARTIFACT_ROOT_MISMATCH
    if compute_output_hash(art.positions.chosen) != facts.output_hash:
        return Reason.OUTPUT_HASH_MISMATCH
    if compute_fingerprint_hash(proofs) != facts.fingerprint_hash:
        return Reason.FINGERPRINT_MALFORMED
    if prompt_hash != facts.prompt_hash:
        return Reason.PROMPT_MISMATCH
    return Reason.OK


@dataclass(frozen=True)
class PreparedCheck:
    """A payload that passed decoding, stage 1 and the fingerprint-kind check: what its prefill and stage 2 need."""

    artifact: Artifact
    blob: bytes  # the fingerprint blob (its first byte names the kind)
    kind: int
    prompt_ids: list[int]
    output_ids: list[int]
    stage1: SequenceCheckResult
    projection_seed: bytes  # kind 1: the projection's seed (run seed and the block after the request)


def prepare_verification(payload: InferencePayload, files: ModelFiles, tokenizer: ModelTokenizer,
                         facts: ChainFacts | None = None) -> VerificationReport | PreparedCheck:
    """Return the final report of a payload that fails before its prefill, else what the prefill needs."""
    try:
        art = decode_payload_artifact(payload)
        prompt_ids = tokenise_request(tokenizer, payload.request)
        proofs = decode_fingerprint_base64(payload.verification_proofs)
    except InvalidInput as exc:
        return VerificationReport(exc.reason, None, None, None)
    h = art.header
    if facts is None:  # no chain: the payload's own declarations stand in for the request and commitments
        onchain = OnchainInference(int(payload.inference_id), int(payload.user_seed), files.model_id,
                                   h.temperature_bits, h.top_p_bits, h.top_k, h.max_tokens, files.spec.k,
                                   files.spec.vocab_size, compute_output_hash(art.positions.chosen), art.root,
                                   frozenset(files.spec.stop_token_ids), prompt_ids)
    else:
        onchain = OnchainInference(facts.inference_id, facts.user_seed, facts.model_id, facts.temperature_bits,
                                   facts.top_p_bits, facts.top_k, facts.max_tokens, files.spec.k,
                                   files.spec.vocab_size, facts.output_hash, facts.artifact_root,
                                   frozenset(files.spec.stop_token_ids), prompt_ids)
    stage1 = sequence_check(h, art.positions, onchain)
    if not stage1.valid:
        return VerificationReport(stage1.reason, stage1, None, None)
    blob = b"".join(proofs)
    try:
        kind = require_registered_kind(blob, files.spec.fingerprint_kinds, files.spec.name)
    except InvalidInput as exc:
        return VerificationReport(exc.reason, stage1, None, None)
    seed = compute_projection_seed(h.run_seed, NO_BLOCK_HASH if facts is None else facts.projection_block_hash)
    return PreparedCheck(art, blob, kind, list(prompt_ids), [int(t) for t in art.positions.chosen], stage1, seed)


def finish_verification(check: PreparedCheck, prefill: Prefill, thresholds: Stage2Thresholds, files: ModelFiles,
                        engine: Engine, decision_only: bool = False, projection: ProjectionThresholds | None = None,
                        projection_engine: Engine | None = None) -> VerificationReport:
    """Return the report of a prepared payload from its prefill: fingerprints, stage 2, decision.

    A kind-1 fingerprint is compared with `projection_engine`'s prefill where given (the model at its
    registered dtype, recording the projection's decoder layers: calibration measured bf16 honest noise
    against a bf16 validator far below that against fp32), else with the main prefill.
    """
    projected: ProjectionMeasurement | None = None
    try:
        if check.kind == KIND_PROJECTION:
            own, own_engine = (prefill, engine) if projection_engine is None else \
                (projection_engine.prefill(check.prompt_ids, check.output_ids), projection_engine)
            projected = measure_projection(check.blob, files, own_engine, own, len(check.prompt_ids),
                                           check.projection_seed)
            fingerprint: tuple[ChunkMeasurement, ...] = ()
        else:
            chunks = split_toploc_blob(check.blob)
            fingerprint = tuple(verify_fingerprint(prefill.hidden, len(check.prompt_ids), chunks))
    except InvalidInput as exc:
        return VerificationReport(exc.reason, check.stage1, None, None)
    measure = measure_stage2_decision if decision_only and is_weight_error_only(thresholds) else measure_stage2
    measurements = measure(check.artifact.header, check.artifact.positions, prefill.logits, fingerprint)
    decision = decide_stage2(measurements, thresholds)
    if decision.valid and projected is not None:
        reason = decide_projection(projected, require_projection_thresholds(projection, files), len(check.output_ids))
        return VerificationReport(reason, check.stage1, measurements, decision, projected)
    return VerificationReport(decision.reason, check.stage1, measurements, decision, projected)


def verify_payload(payload: InferencePayload, files: ModelFiles, tokenizer: ModelTokenizer, engine: Engine,
                   thresholds: Stage2Thresholds, facts: ChainFacts | None = None,
                   decision_only: bool = False, projection: ProjectionThresholds | None = None,
                   projection_engine: Engine | None = None) -> VerificationReport:
    """Return the verification report of one payload on the claimed model (against the chain's facts if given).

    With `decision_only` (the daemon) and a profile that decides on the weight error alone, only the
    decided signals are measured; `verinfer verify` measures everything.
    """
    check = prepare_verification(payload, files, tokenizer, facts)
    if isinstance(check, VerificationReport):
        return check
    return finish_verification(check, engine.prefill(check.prompt_ids, check.output_ids), thresholds, files, engine,
                               decision_only, projection, projection_engine)


def require_projection_thresholds(t: ProjectionThresholds | None, files: ModelFiles) -> ProjectionThresholds:
    """Return the projection thresholds, or raise: a model registered for kind 1 needs a calibrated [projection]."""
    if t is None:
        raise FatalError(f"{files.spec.name} accepts kind-1 fingerprints but its profile has no [projection] section",
                         Reason.UNKNOWN_MODEL)
    return t


def measure_projection(blob: bytes, files: ModelFiles, engine: Engine, prefill: Prefill, prompt_rows: int,
                       seed: bytes) -> ProjectionMeasurement:
    """Return the distance of the validator's own prefill from a kind-1 fingerprint."""
    config = files.spec.projection
    if config is None:  # unreachable: the registry ties kind 1 to a [projection] section
        raise FatalError(f"{files.spec.name} has no projection config", Reason.UNKNOWN_MODEL)
    recorded = getattr(getattr(engine, "options", None), "record_layers", ())
    rows = select_projection_rows(prefill.hidden, prefill.layers, tuple(recorded), config.spec(), prompt_rows)
    return verify_projection_blob(blob, config.spec(), seed, rows)

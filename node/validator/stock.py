"""Verify one stock-sampler inference (a model registered with sampler = "vllm-seeded", docs/protocol.md §13).

What a validator has for a stock-vLLM operator: the prompt, the served tokens, the declared params
and the run seed. No leaves and no fingerprint, so no stage 1: the served length and token ids are
checked, then one prefill of prompt + output on the claimed model and node.checks.stock's signals
under the profile's [stock] thresholds. The daemon fetches a StockPayload (the request and the
tokens) and checks it against the stock commitment on chain (docs/protocol.md §13.1) first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from node.checks.decision import Stage2Decision
from node.checks.stock import StockMeasurements, measure_stock_sampler
from node.checks.stock_decision import StockThresholds, decide_stock
from node.engines.base import Engine
from node.engines.models import ModelFiles
from node.engines.tokenizer import ModelTokenizer
from node.errors import InvalidInput, Reason
from node.executer.api import StockPayload
from node.protocol.artifact import compute_output_hash
from node.protocol.sampler import SamplingParams
from node.protocol.seed import run_seed
from node.protocol.stock import is_stock_commitment
from node.protocol.vllm_sampler import SAMPLER_NAME, require_known_sampler, vllm_request_seed
from node.validator.verify import ChainFacts, VerificationReport, compute_request_prompt_hash, tokenise_request


@dataclass(frozen=True)
class StockReport:
    """Everything a validator concluded about one stock-sampler inference."""

    reason: Reason
    measurements: StockMeasurements | None
    decision: Stage2Decision | None

    @property
    def valid(self) -> bool:
        """Check whether the inference passed."""
        return self.reason is Reason.OK


def verify_stock_output(files: ModelFiles, engine: Engine, prompt_ids: Sequence[int], output_ids: Sequence[int],
                        params: SamplingParams, run_seed: bytes, thresholds: StockThresholds) -> StockReport:
    """Return the stock-sampler verdict of served tokens on the claimed model (one prefill)."""
    try:
        if require_known_sampler(files.spec.sampler) != SAMPLER_NAME:
            raise InvalidInput(f"{files.spec.name} is not registered for the stock sampler", Reason.UNKNOWN_SAMPLER)
        if not output_ids or len(output_ids) > params.max_tokens:
            raise InvalidInput(f"{len(output_ids)} output tokens for max_tokens {params.max_tokens}",
                               Reason.OUTPUT_TOO_LONG if output_ids else Reason.OUTPUT_LENGTH_MISMATCH)
        stops = set(files.spec.stop_token_ids)
        if len(output_ids) < params.max_tokens and output_ids[-1] not in stops:
            raise InvalidInput("a response shorter than max_tokens must end on a stop token", Reason.NOT_TERMINATED)
        if any(t in stops for t in output_ids[:-1]):
            raise InvalidInput("tokens after a stop token", Reason.TOKENS_AFTER_STOP)
        prefill = engine.prefill(prompt_ids, output_ids)
        m = measure_stock_sampler(prefill.logits, list(output_ids), params, vllm_request_seed(run_seed))
    except InvalidInput as exc:
        return StockReport(exc.reason, None, None)
    decision = decide_stock(m, thresholds)
    return StockReport(decision.reason, m, decision)


def find_stock_payload_mismatch(payload: StockPayload, facts: ChainFacts) -> Reason:
    """Return why a fetched stock payload is not the committed one (it must not be cached), or Reason.OK."""
    if not is_stock_commitment(facts.artifact_root, facts.fingerprint_hash):
        return Reason.ARTIFACT_ROOT_MISMATCH  # a stock model's commitment names no artifact and no fingerprint
    try:
        prompt_hash = compute_request_prompt_hash(facts.model_id, payload.request)
    except (InvalidInput, TypeError, ValueError) as exc:
        return exc.reason if isinstance(exc, InvalidInput) else Reason.WIRE_MALFORMED
    if int(payload.inference_id) != facts.inference_id or int(payload.user_seed) != facts.user_seed:
        return Reason.SEED_MISMATCH
    if "0x" + facts.model_id.hex() != payload.model_id.lower():
        return Reason.UNKNOWN_MODEL
    if compute_output_hash(payload.output_ids) != facts.output_hash:
        return Reason.OUTPUT_HASH_MISMATCH
    if prompt_hash != facts.prompt_hash:
        return Reason.PROMPT_MISMATCH
    return Reason.OK


def verify_stock_payload(payload: StockPayload, files: ModelFiles, tokenizer: ModelTokenizer, engine: Engine,
                         thresholds: StockThresholds, facts: ChainFacts) -> VerificationReport:
    """Return the verdict on a stock-sampler payload against the chain's facts (one prefill when it gets that far)."""
    mismatch = find_stock_payload_mismatch(payload, facts)
    if mismatch is not Reason.OK:
        return VerificationReport(mismatch, None, None, None)
    try:
        prompt_ids = tokenise_request(tokenizer, payload.request)
        params = SamplingParams.from_bits(facts.temperature_bits, facts.top_p_bits, facts.top_k, facts.max_tokens)
    except InvalidInput as exc:
        return VerificationReport(exc.reason, None, None, None)
    report = verify_stock_output(files, engine, prompt_ids, payload.output_ids, params,
                                 run_seed(facts.user_seed, facts.inference_id), thresholds)
    return VerificationReport(report.reason, None, None, report.decision)

"""Verify one stock-sampler inference (a model registered with sampler = "vllm-seeded", docs/protocol.md §13).

What a validator has for a stock-vLLM operator: the prompt, the served tokens, the declared params
and the run seed. No leaves and no fingerprint, so no stage 1: the served length and token ids are
checked, then one prefill of prompt + output on the claimed model and node.checks.stock's signals
under the profile's [stock] thresholds. Not wired into the daemon (a stock operator's payload and
on-chain commitment carry no artifact; that format is not defined yet).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from node.checks.decision import Stage2Decision
from node.checks.stock import StockMeasurements, measure_stock_sampler
from node.checks.stock_decision import StockThresholds, decide_stock
from node.engines.base import Engine
from node.engines.models import ModelFiles
from node.errors import InvalidInput, Reason
from node.protocol.sampler import SamplingParams
from node.protocol.vllm_sampler import SAMPLER_NAME, require_known_sampler, vllm_request_seed


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

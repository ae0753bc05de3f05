"""verify_stock_output on the tiny model: honest vLLM-rule tokens pass, other noise or params fail, bad input."""

import pytest

from node.calibrate.stock import generate_with_vllm_rule
from node.checks.stock_decision import StockThresholds
from node.engines.models import ModelFiles
from node.protocol.errors import Reason
from node.protocol.sampler import SamplingParams
from node.protocol.seed import run_seed
from node.protocol.vllm_sampler import vllm_request_seed
from node.validator.stock import verify_stock_output

PROMPT = (1, 9690, 198, 2683, 359, 253, 5356, 28, 1780, 314)
PARAMS = SamplingParams(0.8, 0.95, 0, 24)
SEED = run_seed(4, 5)
THRESHOLDS = StockThresholds(max_difr_mean=0.01, max_difr_max=0.01, max_surprisal_z_abs=8.0)


@pytest.fixture(scope="module")
def stock(tiny):
    files = ModelFiles(tiny.files.spec.model_copy(update={"sampler": "vllm-seeded"}), tiny.files.path,
                       tiny.files.weights_sha256)
    honest = generate_with_vllm_rule(tiny.engine, PROMPT, PARAMS, vllm_request_seed(SEED))
    assert not set(honest) & set(files.spec.stop_token_ids)
    return files, tiny.engine, honest


def test_honest_tokens_pass(stock):
    files, engine, honest = stock
    report = verify_stock_output(files, engine, PROMPT, honest, PARAMS, SEED, THRESHOLDS)
    assert report.valid and report.measurements is not None and report.measurements.difr_max < 1e-4


def test_tokens_from_another_seed_or_temperature_fail(stock):
    files, engine, _ = stock
    other = generate_with_vllm_rule(engine, PROMPT, PARAMS, vllm_request_seed(run_seed(4, 6)))
    assert verify_stock_output(files, engine, PROMPT, other, PARAMS, SEED, THRESHOLDS).reason is Reason.TOKEN_DIFR_MAX
    hot = generate_with_vllm_rule(engine, PROMPT, SamplingParams(1.5, 0.95, 0, 24), vllm_request_seed(SEED))
    assert not verify_stock_output(files, engine, PROMPT, hot, PARAMS, SEED, THRESHOLDS).valid


def test_bad_input_is_a_typed_reason(stock):
    files, engine, honest = stock
    canonical = ModelFiles(files.spec.model_copy(update={"sampler": "canonical"}), files.path, files.weights_sha256)
    cases = [(canonical, honest, Reason.UNKNOWN_SAMPLER), (files, (), Reason.OUTPUT_LENGTH_MISMATCH),
             (files, (*honest, 5), Reason.OUTPUT_TOO_LONG), (files, honest[:10], Reason.NOT_TERMINATED),
             (files, (*honest[:3], 2, *honest[4:]), Reason.TOKENS_AFTER_STOP),
             (files, (*honest[:-1], 10**6), Reason.OUT_OF_RANGE)]
    for model, tokens, reason in cases:
        report = verify_stock_output(model, engine, PROMPT, tokens, PARAMS, SEED, THRESHOLDS)
        assert report.reason is reason and report.measurements is None

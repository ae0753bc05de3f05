"""The devnet's cheating engines on the tiny model: each claims the real model and stage 2 or stage 1 sees it."""

from node.calibrate.cheaters import TemperatureLieEngine
from node.checks.stage1 import check_positions
from node.checks.stage2 import measure_stage2
from node.engines.base import GenerationRequest
from node.protocol.artifact import ArtifactHeader
from node.protocol.sampler import SamplingParams
from node.protocol.seed import run_seed

PROMPT = (1, 9690, 198, 2683, 359, 253, 5356, 28, 1780, 314)
N = 16


def _measure(tiny, engine, declared: SamplingParams):
    request = GenerationRequest(PROMPT, declared, run_seed(5, 6), 5)
    gen = engine.generate([request])[0]
    header = ArtifactHeader(tiny.files.model_id, declared.temperature_bits, declared.top_p_bits, declared.top_k, N,
                            5, request.run_seed, PROMPT, len(gen.output_ids))
    logits = tiny.engine.prefill(PROMPT, gen.output_ids).logits
    return gen, check_positions(request.run_seed, gen.positions(5), tiny.files.spec.vocab_size), \
        measure_stage2(header, gen.positions(5), logits)


def test_a_temperature_liar_passes_stage_1_and_shows_in_the_weights(tiny):
    declared = SamplingParams(0.7, 1.0, 0, N)
    _, honest_s1, honest = _measure(tiny, tiny.engine, declared)
    gen, lie_s1, lie = _measure(tiny, TemperatureLieEngine(tiny.engine, delta=0.3), declared)
    actual = tiny.engine.generate([GenerationRequest(PROMPT, SamplingParams(1.0, 1.0, 0, N), run_seed(5, 6), 5)])[0]
    assert gen.output_ids == actual.output_ids  # it really sampled at 1.0
    assert honest_s1.valid and lie_s1.valid  # the leaves are consistent with v_i: only the weights tell
    # the tiny random model is nearly uniform (weights ~2e-5), so compare with the honest run, not a constant
    assert lie.weight_error_max > 100 * max(honest.weight_error_max, 1e-9)

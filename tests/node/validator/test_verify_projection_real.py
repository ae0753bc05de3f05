"""Kind-1 projection fingerprints on the real SmolLM2 (bf16 registry entry), with the calibrated [projection].

A bf16 executer records the registered sources (decoder layers 0 and 28, 1 dim × 16 bits each) and commits
the projection; the validator runs stage 2 in float32 and recomputes the projection in bf16. An honest run
passes; the same text and leaves with rows from a model with 0.1 % weight noise (the issue's goal; the
calibration caught 7 of 7 held-out such runs at 64 tokens, layer 0's distance 2.3 times its threshold on
average) fail on the projection alone, by the layer-0 source.
"""

import base64
import copy

import pytest

from node.calibrate.models import load_engine, make_noisy_engine
from node.checks.projection import select_projection_rows
from node.engines.base import GenerationRequest
from node.engines.models import get_model_spec, materialise_model
from node.errors import Reason
from node.executer.api import InferencePayload
from node.profiles import load_profile
from node.protocol.artifact import Artifact, ArtifactHeader, encode_artifact_wire
from node.protocol.fingerprint import encode_fingerprint_base64
from node.protocol.projection import build_projection_blob, compute_projection_seed, split_pieces
from node.protocol.sampler import SamplingParams
from node.protocol.seed import run_seed
from node.validator.verify import NO_BLOCK_HASH, verify_payload

pytestmark = pytest.mark.e2e  # two 64-token bf16 generations on the real model

MESSAGES = [{"role": "user", "content": "Write a short story about a lighthouse keeper and a storm."}]
N = 64
NAME = "smollm2-135m-instruct-bf16"
SEED = (5, 6)


@pytest.fixture(scope="module")
def setup(smol):
    files = materialise_model(get_model_spec(NAME))
    _, profile = load_profile(files.spec)
    assert files.spec.projection is not None and profile.projection_thresholds() is not None
    engine = load_engine(smol.files.path, NAME, dtype="bfloat16", record_layers=files.spec.projection.decoder_layers())
    return files, profile, engine


def payload(smol, files, engine, rows_engine):
    """Return a payload whose text and leaves come from `engine` and whose projection rows from `rows_engine`."""
    ids = smol.tokenizer.encode_chat(MESSAGES)
    params = SamplingParams(0.7, 1.0, 0, N)
    gen = engine.generate([GenerationRequest(ids, params, run_seed(*SEED), 5)])[0]
    source = rows_engine.prefill(ids, gen.output_ids) if rows_engine is not engine else gen
    spec = files.spec.projection.spec()
    rows = select_projection_rows(source.hidden, source.layers, files.spec.projection.decoder_layers(), spec, len(ids))
    header = ArtifactHeader(files.model_id, params.temperature_bits, params.top_p_bits, 0, N, 5, run_seed(*SEED), ids,
                            len(gen.output_ids))
    art = Artifact(header, gen.positions(5))
    seed = compute_projection_seed(run_seed(*SEED), NO_BLOCK_HASH)
    blob = build_projection_blob(rows, spec, seed)
    return InferencePayload(model=NAME, model_id="0x" + files.model_id.hex(), inference_id=str(SEED[1]),
                            user_seed=str(SEED[0]), request={"messages": MESSAGES},
                            artifact=base64.b64encode(encode_artifact_wire(art)).decode(),
                            verification_proofs=encode_fingerprint_base64(split_pieces(blob)))


def test_honest_bf16_projection_passes_and_noisy_rows_fail(smol, setup):
    files, profile, engine = setup
    thresholds, projection = profile.stage2_thresholds(), profile.projection_thresholds()
    honest = verify_payload(payload(smol, files, engine, engine), files, smol.tokenizer, smol.engine, thresholds,
                            projection=projection, projection_engine=engine)
    assert honest.valid, honest
    m = honest.projection
    assert m is not None and m.layers == files.spec.projection.spec().layers
    assert all(0 < d < projection.for_source(layer).at(N) for layer, d in zip(m.layers, m.source_distances,
                                                                                 strict=True))
    noisy = make_noisy_engine(copy.copy(engine), 0.001, seed=7)
    cheat = verify_payload(payload(smol, files, engine, noisy), files, smol.tokenizer, smol.engine, thresholds,
                           projection=projection, projection_engine=engine)
    assert cheat.decision is not None and cheat.decision.valid  # the leaves are honest: only the projection sees it
    assert cheat.reason is Reason.FINGERPRINT_PROJECTION_DISTANCE, cheat.projection
    assert cheat.projection is not None and cheat.projection.source_distances[0] > projection.for_source(0).at(N)

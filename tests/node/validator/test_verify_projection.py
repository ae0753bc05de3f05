"""Kind-1 (projection, protocol v2) fingerprints end to end on the tiny model: executer → payload → validator."""

import base64
import copy
from collections.abc import Sequence
from dataclasses import dataclass, replace

import pytest

from node.calibrate.models import make_noisy_engine
from node.checks.decision import Stage2Thresholds
from node.checks.fingerprint import FingerprintThresholds
from node.checks.projection import ProjectionThresholds
from node.engines.base import Engine, Generation, GenerationRequest, Prefill
from node.engines.models import ProjectionConfig
from node.engines.transformers_engine import TransformersOptions
from node.errors import FatalError, Reason
from node.executer.api import InferencePayload
from node.executer.service import ExecuterService
from node.protocol.fingerprint import encode_fingerprint_base64
from node.protocol.hashing import keccak256
from node.protocol.projection import (
    KIND_PROJECTION,
    build_projection_blob,
    compute_fingerprint_kind,
    compute_projection_seed,
    split_pieces,
)
from node.protocol.prompt import compute_prompt_hash
from node.protocol.sampler import SamplingParams
from node.protocol.seed import run_seed
from node.validator.verify import NO_BLOCK_HASH, ChainFacts, decode_payload_artifact, verify_payload

MESSAGES = [{"role": "user", "content": "Name a colour."}]
T = Stage2Thresholds(1e-4, 1e-4, 0.01, 0.0, 6.0, 0.05, FingerprintThresholds(2, 1.0, 1.0, 0))
# Plumbing threshold, not a calibrated one: the tiny model verified by its own engine measures 0.
P = ProjectionThresholds(1e-3)
LAST = ProjectionConfig(layers=("last",), k=16, bits=2)


def registered(tiny, config=LAST, kinds=(1, 0)):
    spec = tiny.files.spec.model_copy(update={"fingerprint_kinds": kinds, "projection": config})
    return replace(tiny.files, spec=spec)


@dataclass
class HiddenFrom:
    """Honest tokens and leaves, hidden rows (what the fingerprint is built from) from another engine."""

    honest: Engine
    other: Engine

    @property
    def info(self):
        return self.honest.info

    @property
    def vocab_size(self):
        return self.honest.vocab_size

    @property
    def options(self):
        return self.honest.options

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        out = []
        for r, g in zip(requests, self.honest.generate(requests), strict=True):
            pre = self.other.prefill(r.prompt_ids, g.output_ids)
            out.append(Generation(g.output_ids, g.samples, pre.hidden, g.finish_reason, pre.layers))
        return out

    def prefill(self, prompt_ids, output_ids) -> Prefill:
        return self.honest.prefill(prompt_ids, output_ids)


def payload(files, tiny, engine=None, seed=5):
    service = ExecuterService(files, tiny.tokenizer, engine or tiny.engine, T.fingerprint)
    ids = tiny.tokenizer.encode_chat(MESSAGES)
    served = service.infer(ids, compute_prompt_hash(files.model_id, messages=MESSAGES), SamplingParams(1.0, 1.0, 0, 12),
                           seed, 77, {"messages": MESSAGES})
    return InferencePayload(model=files.spec.name, model_id="0x" + files.model_id.hex(), inference_id="77",
                            user_seed=str(seed), request={"messages": MESSAGES},
                            artifact=base64.b64encode(served.wire).decode(),
                            verification_proofs=encode_fingerprint_base64(served.fingerprint)), served


def test_executer_emits_kind_1_and_the_honest_payload_passes(tiny):
    files = registered(tiny)
    p, served = payload(files, tiny)
    assert compute_fingerprint_kind(b"".join(served.fingerprint)) == KIND_PROJECTION
    assert served.fingerprint_hash == keccak256(b"".join(served.fingerprint))
    report = verify_payload(p, files, tiny.tokenizer, tiny.engine, T, projection=P)
    assert report.valid, report
    assert report.projection is not None and report.projection.distance == 0.0
    assert report.projection.rows == len(decode_payload_artifact(p).positions.chosen)


def test_a_model_registered_for_v1_only_refuses_kind_1(tiny):
    p, _ = payload(registered(tiny), tiny)
    report = verify_payload(p, tiny.files, tiny.tokenizer, tiny.engine, T, projection=P)
    assert report.reason is Reason.FINGERPRINT_KIND_NOT_REGISTERED and report.measurements is None


def test_the_first_registered_kind_is_the_one_committed(tiny):
    _, served = payload(registered(tiny, kinds=(0, 1)), tiny)
    assert compute_fingerprint_kind(b"".join(served.fingerprint)) == 0


@dataclass
class OnBackend:
    """The tiny engine reporting another backend (what the executer reads to pick its kind)."""

    inner: Engine
    backend: str

    def __getattr__(self, name):
        return getattr(self.inner, name)

    @property
    def info(self):
        return replace(self.inner.info, backend=self.backend)


def test_kind_1_is_committed_only_on_a_backend_its_thresholds_were_calibrated_for(tiny):
    transformers_only = LAST.model_copy(update={"backends": ("transformers",)})
    files = registered(tiny, transformers_only, kinds=(1, 0))
    _, served = payload(files, tiny, engine=OnBackend(tiny.engine, "vllm"))
    assert compute_fingerprint_kind(b"".join(served.fingerprint)) == 0  # the next kind listed: TOPLOC
    _, served = payload(files, tiny, engine=OnBackend(tiny.engine, "transformers"))
    assert compute_fingerprint_kind(b"".join(served.fingerprint)) == KIND_PROJECTION
    with pytest.raises(FatalError, match="no fingerprint kind"):
        payload(registered(tiny, transformers_only, kinds=(1,)), tiny, engine=OnBackend(tiny.engine, "vllm"))


def test_a_model_registered_for_v2_only_refuses_toploc(tiny):
    p, _ = payload(tiny.files, tiny)  # the v1-only executer commits TOPLOC
    report = verify_payload(p, registered(tiny, kinds=(1,)), tiny.tokenizer, tiny.engine, T, projection=P)
    assert report.reason is Reason.FINGERPRINT_KIND_NOT_REGISTERED


def test_a_projection_under_another_seed_is_typed(tiny):
    files = registered(tiny)
    p, served = payload(files, tiny)
    art = decode_payload_artifact(p)
    ids = tiny.tokenizer.encode_chat(MESSAGES)
    rows = [served.generation.hidden[len(ids) - 1:]]
    other = compute_projection_seed(run_seed(5, 77), keccak256(b"a block the executer chose"))
    forged = p.model_copy(update={"verification_proofs": encode_fingerprint_base64(
        split_pieces(build_projection_blob(rows, LAST.spec(), other)))})
    assert verify_payload(forged, files, tiny.tokenizer, tiny.engine, T, projection=P).reason \
        is Reason.FINGERPRINT_SEED_MISMATCH
    # on a chain, the validator's seed uses the block after the request: the zero hash is then wrong
    facts = ChainFacts(77, 5, files.model_id, art.header.temperature_bits, art.header.top_p_bits, 0, 12,
                       compute_prompt_hash(files.model_id, messages=MESSAGES), keccak256(b""), art.root,
                       served.fingerprint_hash, projection_block_hash=keccak256(b"block"))
    assert facts.projection_block_hash != NO_BLOCK_HASH
    report = verify_payload(p, files, tiny.tokenizer, tiny.engine, T, facts=facts, projection=P)
    assert report.reason in (Reason.FINGERPRINT_SEED_MISMATCH, Reason.OUTPUT_HASH_MISMATCH)


@pytest.mark.parametrize("cut", [1, 9])
def test_a_truncated_projection_is_typed(tiny, cut):
    files = registered(tiny)
    p, served = payload(files, tiny)
    blob = b"".join(served.fingerprint)[:-cut]
    cut_payload = p.model_copy(update={"verification_proofs": encode_fingerprint_base64(split_pieces(blob))})
    assert verify_payload(cut_payload, files, tiny.tokenizer, tiny.engine, T, projection=P).reason in \
        (Reason.FINGERPRINT_LENGTH_MISMATCH, Reason.FINGERPRINT_MALFORMED)


def test_hidden_states_of_a_noisy_model_fail_on_the_projection_alone(tiny):
    files = registered(tiny)
    noisy = make_noisy_engine(tiny.engine, 0.05, seed=3)
    p, _ = payload(files, tiny, engine=HiddenFrom(tiny.engine, noisy))
    report = verify_payload(p, files, tiny.tokenizer, tiny.engine, T, projection=P)
    assert report.decision is not None and report.decision.valid  # stage 2 sees honest leaves
    assert report.reason is Reason.FINGERPRINT_PROJECTION_DISTANCE
    assert report.projection is not None and report.projection.distance > P.max_distance


def test_decoder_layer_sources_need_an_engine_that_records_them(tiny):
    config = ProjectionConfig(layers=(1, "last"), k=8, bits=4)
    files = registered(tiny, config)
    recording = copy.copy(tiny.engine)
    recording.options = TransformersOptions(record_layers=(1,))
    p, _ = payload(files, tiny, engine=recording)
    report = verify_payload(p, files, tiny.tokenizer, recording, T, projection=P)
    assert report.valid, report
    assert report.projection is not None and len(report.projection.source_distances) == 2
    with pytest.raises(FatalError):
        verify_payload(p, files, tiny.tokenizer, tiny.engine, T, projection=P)


def test_kind_1_without_calibrated_thresholds_is_fatal(tiny):
    files = registered(tiny)
    p, _ = payload(files, tiny)
    with pytest.raises(FatalError):
        verify_payload(p, files, tiny.tokenizer, tiny.engine, T)


def test_a_separate_projection_engine_supplies_the_layers(tiny):
    config = ProjectionConfig(layers=(1,), k=4, bits=8)
    files = registered(tiny, config)
    recording = copy.copy(tiny.engine)
    recording.options = TransformersOptions(record_layers=(1,))
    p, _ = payload(files, tiny, engine=recording)
    report = verify_payload(p, files, tiny.tokenizer, tiny.engine, T, projection=P, projection_engine=recording)
    assert report.valid, report
    noisy = make_noisy_engine(recording, 0.05, seed=3)
    p, _ = payload(files, tiny, engine=HiddenFrom(recording, noisy))
    report = verify_payload(p, files, tiny.tokenizer, tiny.engine, T, projection=P, projection_engine=recording)
    assert report.reason is Reason.FINGERPRINT_PROJECTION_DISTANCE

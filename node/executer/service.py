"""Executer mode without HTTP: seeded generation that records the artifact and fingerprints.

One ``ExecuterService`` owns one engine. It derives run_seed from the user seed and inference id,
generates with the canonical sampler, builds the artifact, its Merkle root and the activation
fingerprint, and keeps the payload for validators to fetch: on disk (the node's LevelDB, synced) before
its commit is sent, so that a restart between commit and fetch loses nothing, with the newest N also in
memory. Verification-instance mode runs one prefill instead.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from node.checks.fingerprint import FingerprintDecision, FingerprintThresholds, decide_fingerprint
from node.checks.projection import select_projection_rows
from node.engines.base import Engine, EngineInfo, Generation, GenerationRequest
from node.engines.compiled_fingerprint import compute_interpolation_compiled
from node.engines.models import ModelFiles
from node.engines.tokenizer import ModelTokenizer
from node.errors import FatalError, InvalidInput, Reason
from node.protocol.artifact import Artifact, ArtifactHeader, compute_output_hash, encode_artifact_wire
from node.protocol.fingerprint import (
    ChunkMeasurement,
    build_fingerprint,
    compute_fingerprint_hash,
    encode_fingerprint_base64,
    verify_fingerprint,
)
from node.protocol.projection import (
    KIND_PROJECTION,
    build_projection_blob,
    compute_projection_seed,
    split_pieces,
)
from node.protocol.sampler import SamplingParams
from node.protocol.seed import run_seed

if TYPE_CHECKING:
    from node.executer.chain_mode import ChainGate
    from node.executer.moe import MoeRecorder

log = logging.getLogger(__name__)

NO_BLOCK_HASH = bytes(32)  # off chain: no block after the request (docs/protocol.md, projection seed)


@dataclass(frozen=True, eq=False)
class ServedInference:
    """One generated inference with everything the executer commits to and serves."""

    inference_id: int
    user_seed: int
    prompt_hash: bytes
    request: dict[str, Any]
    generation: Generation
    artifact: Artifact
    wire: bytes
    fingerprint: list[bytes]
    moe_fingerprint_hash: bytes | None = None  # an MoE model's: the proofs' hash with moeRoot bound in

    @property
    def output_hash(self) -> bytes:
        """Return outputHash of the generated ids."""
        return compute_output_hash(self.generation.output_ids)

    @property
    def fingerprint_hash(self) -> bytes:
        """Return the committed fingerprintHash: of the proof chunks (an MoE model's binds moeRoot in)."""
        if self.moe_fingerprint_hash is not None:
            return self.moe_fingerprint_hash
        return compute_fingerprint_hash(self.fingerprint)


@dataclass(frozen=True)
class FingerprintReport:
    """Verification-instance mode: measurements per chunk and the profile's decision."""

    measurements: list[ChunkMeasurement]
    decision: FingerprintDecision


class PayloadStore(Protocol):
    """Where an executer keeps what it serves, durably (node.store.leveldb.Store)."""

    def put_served(self, inference_id: int, payload: bytes, root: bytes | None = None,
                   wire: bytes | None = None) -> None:
        """Persist (synced) an inference's payload and its artifact wire bytes by root."""

    def get_served(self, inference_id: int) -> bytes | None:
        """Return a stored payload."""

    def get_served_wire(self, root: bytes) -> bytes | None:
        """Return stored artifact wire bytes by artifact root."""


class InferenceRecorder(Protocol):
    """Optional hook that records each served inference (node.workload.recorder implements it)."""

    def on_served(self, served: ServedInference, started_ns: int, ended_ns: int) -> str:
        """Record one served inference; return its record id."""
        ...


def derive_inference_id(prompt_hash: bytes, user_seed: int, params: SamplingParams) -> int:
    """Return an off-chain inference id, a function of the request: the same request and seed, the same id.

    So a repeated request with the same seed reproduces its output (OpenAI's `seed` promise); a
    request without a seed gets a fresh random seed and so a fresh id. On-chain ids come from the chain.
    """
    digest = hashlib.sha256(b"verinfer-offchain-id" + prompt_hash + user_seed.to_bytes(8, "big")
                            + params.temperature_bits.to_bytes(4, "big") + params.top_p_bits.to_bytes(4, "big")
                            + params.top_k.to_bytes(4, "big") + params.max_tokens.to_bytes(4, "big"))
    return int.from_bytes(digest.digest(), "big")


class ExecuterService:
    """Generates verifiable inferences with one engine and keeps their payloads."""

    def __init__(self, files: ModelFiles, tokenizer: ModelTokenizer, engine: Engine,
                 thresholds: FingerprintThresholds | None, keep: int = 10_000, gate: ChainGate | None = None,
                 recorder: InferenceRecorder | None = None, moe: MoeRecorder | None = None,
                 store: PayloadStore | None = None) -> None:
        self.files = files
        self.store = store  # on a chain: every payload written here (synced) before its commit is sent
        self.moe = moe  # an MoE model: per-expert commitments bound into the fingerprint hash, duty slices kept
        self.recorder = recorder  # off by default: the workload record of every served inference
        self.gate = gate  # on a chain: requests checked against it, results committed to it
        self.tokenizer = tokenizer
        self.engine = engine
        self.thresholds = thresholds
        self.keep = keep
        self._served: OrderedDict[int, ServedInference] = OrderedDict()
        self._by_root: dict[bytes, int] = {}

    @property
    def info(self) -> EngineInfo:
        """Return the engine's backend, model, dtype and device."""
        return self.engine.info

    @property
    def k(self) -> int:
        """Return K, the candidates per position, from the model spec."""
        return self.files.spec.k

    def infer(self, prompt_ids: Sequence[int], prompt_hash: bytes, params: SamplingParams,
              user_seed: int | None, inference_id: int | None, request: dict[str, Any]) -> ServedInference:
        """Generate one inference and record its artifact and fingerprint."""
        block_hash = NO_BLOCK_HASH if self.gate is None else \
            self.gate.authorize(inference_id, prompt_hash, user_seed, params)
        seed = secrets.randbits(64) if user_seed is None else user_seed
        iid = derive_inference_id(prompt_hash, seed, params) if inference_id is None else inference_id
        rs = run_seed(seed, iid)
        started_ns = time.time_ns()
        gen = self.engine.generate([GenerationRequest(tuple(prompt_ids), params, rs, self.k,
                                                      frozenset(self.files.spec.stop_token_ids))])[0]
        header = ArtifactHeader(self.files.model_id, params.temperature_bits, params.top_p_bits, params.top_k,
                                params.max_tokens, self.k, rs, tuple(prompt_ids), len(gen.output_ids))
        artifact = Artifact(header, gen.positions(self.k))
        proofs = self.build_fingerprint(gen, len(prompt_ids), compute_projection_seed(rs, block_hash))
        bound = None if self.moe is None else self.moe.record(iid, prompt_ids, gen.output_ids, artifact.root,
                                                              compute_fingerprint_hash(proofs))
        served = ServedInference(iid, seed, prompt_hash, request, gen, artifact, encode_artifact_wire(artifact),
                                 proofs, bound)
        if self.store is not None:  # durable first: a commit is never sent for a payload a restart would lose
            self.store.put_served(iid, self._encode_payload(served), artifact.root, served.wire)
        if self.gate is not None:
            self.gate.commit(served, artifact.root)
        self._remember(served)
        if self.recorder is not None:
            self.recorder.on_served(served, started_ns, time.time_ns())
        log.info("inference served", extra={"inference_id": hex(iid), "tokens": len(gen.output_ids),
                                            "artifact_root": artifact.root.hex()})
        return served

    @property
    def fingerprint_kind(self) -> int:
        """Return the kind this executer commits: the model's first registered kind (in preference order) that its
        backend may commit — kind 1 only on a backend the projection's thresholds were calibrated for."""
        backend = self.engine.info.backend
        projection = self.files.spec.projection
        for kind in self.files.spec.fingerprint_kinds:
            if kind != KIND_PROJECTION or (projection is not None and backend in projection.backends):
                return kind
        raise FatalError(f"{self.files.spec.name} registers no fingerprint kind a {backend} executer may commit",
                         Reason.FINGERPRINT_KIND_NOT_REGISTERED)

    def build_fingerprint(self, gen: Generation, prompt_rows: int, projection_seed: bytes) -> list[bytes]:
        """Return the fingerprint pieces of a generation in this executer's kind (their concatenation is the blob)."""
        config = self.files.spec.projection
        if self.fingerprint_kind != KIND_PROJECTION or config is None:
            return build_fingerprint(gen.hidden, prompt_rows, compute_interpolation_compiled)
        recorded = getattr(getattr(self.engine, "options", None), "record_layers", ())
        rows = select_projection_rows(gen.hidden, gen.layers, tuple(recorded), config.spec(), prompt_rows)
        return split_pieces(build_projection_blob(rows, config.spec(), projection_seed))

    def check_fingerprint(self, prompt_ids: Sequence[int], output_ids: Sequence[int],
                          proofs: Sequence[bytes]) -> FingerprintReport:
        """Prefill prompt + output once and measure the proofs against it (no generation)."""
        if self.thresholds is None:
            raise InvalidInput(f"{self.files.spec.name} has no calibrated profile: no verification instance",
                               Reason.UNKNOWN_MODEL)
        prefill = self.engine.prefill(prompt_ids, output_ids)
        measurements = verify_fingerprint(prefill.hidden, len(prompt_ids), proofs)
        return FingerprintReport(measurements, decide_fingerprint(measurements, self.thresholds))

    def _remember(self, served: ServedInference) -> None:
        old = self._served.pop(served.inference_id, None)
        if old is not None:
            self._by_root.pop(old.artifact.root, None)
        self._served[served.inference_id] = served
        self._by_root[served.artifact.root] = served.inference_id
        while len(self._served) > self.keep:
            _, evicted = self._served.popitem(last=False)
            self._by_root.pop(evicted.artifact.root, None)

    def get_served(self, inference_id: int) -> ServedInference | None:
        """Return a served inference by id, if still kept."""
        return self._served.get(inference_id)

    def payload_json(self, inference_id: int) -> bytes | None:
        """Return the payload validators fetch (HTTP and libp2p serve the same bytes): from memory, else from disk."""
        served = self._served.get(inference_id)
        if served is not None:
            return self._encode_payload(served)
        return None if self.store is None else self.store.get_served(inference_id)

    def _encode_payload(self, served: ServedInference) -> bytes:
        from node.executer.api import InferencePayload

        return InferencePayload(
            model=self.files.spec.name, model_id="0x" + self.files.model_id.hex(),
            inference_id=str(served.inference_id), user_seed=str(served.user_seed), request=served.request,
            artifact=base64.b64encode(served.wire).decode("ascii"),
            verification_proofs=encode_fingerprint_base64(served.fingerprint),
        ).model_dump_json().encode()

    def get_by_root(self, root: bytes) -> ServedInference | None:
        """Return a served inference by artifact root, if still kept in memory."""
        iid = self._by_root.get(root)
        return None if iid is None else self._served.get(iid)

    def artifact_wire(self, root: bytes) -> bytes | None:
        """Return an artifact's wire bytes by its root: from memory, else from disk."""
        served = self.get_by_root(root)
        if served is not None:
            return served.wire
        return None if self.store is None else self.store.get_served_wire(root)

"""Stage 2 from the workload record: the recorded inference replayed on the verifier's toolchain (IREE).

The prover's record holds the inference (prompt and output ids, the artifact it committed) and a
link to the teacher-forced verification graph of its decode. A ``RecordReplayer`` (an adapter: see
``node.workload.stage2_replay``; this module does no I/O) loads the inference from a record folder or
its HTTP read API, binds the verification graph to the recorded ids and the *verifier's own* weights
and replays it with IREE. Here, pure:

* ``verify_recorded_inference`` — the record is self-consistent: its artifact decodes, names the
  recorded prompt and output, and has the root the verifier expects (the one committed on chain);
* ``measure_stage2_record`` — frozen numbers: top-K agreement and raw log-probability error at the
  artifact's positions, plus stage 2's own ``Stage2Measurements`` computed on the replayed logits
  (so a profile's thresholds apply unchanged);
* ``decide_stage2_record`` — a decision against a ``Stage2RecordTolerance`` calibrated on honest
  recorded inferences (IREE vs the executer's torch numerics), optionally also the profile's.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Protocol

import numpy as np

from node.checks.decision import Stage2Decision, Stage2Thresholds, find_stage2_violation
from node.checks.stage2 import Stage2Measurements, measure_stage2
from node.errors import InvalidInput, Reason
from node.protocol.artifact import Artifact, decode_artifact_wire
from node.protocol.hashing import keccak256
from node.protocol.prompt import canonical_json
from node.protocol.sampler import compute_raw_logprobs


@dataclass(frozen=True, eq=False)
class RecordedInference:
    """One inference as the prover's record holds it."""

    trace_id: str
    graph_id: str  # the verification graph the record links the inference to
    prompt_ids: np.ndarray  # int64 (P,)
    output_ids: np.ndarray  # int64 (N,)
    artifact_wire: bytes


@dataclass(frozen=True, eq=False)
class ReplayedLogits:
    """The verifier's replay of a recorded inference: logits of every generated position."""

    graph_id: str  # the graph that ran (the verifier's own export when it compared one)
    logits: np.ndarray  # float32 (N, V): row i predicts output token i
    graph_is_own_export: bool | None  # the record's graph id equals the verifier's own export (None: not compared)
    cached: bool
    compile_s: float
    run_s: float


class RecordReplayer(Protocol):
    """Loads recorded inferences and replays them (IREE over a record folder or the HTTP read API)."""

    def load_inference(self, trace_id: str) -> RecordedInference:
        """Return a recorded inference (its verification graph resolved)."""
        ...

    def replay_logits(self, inference: RecordedInference) -> ReplayedLogits:
        """Replay the inference's verification graph on its ids and the verifier's weights."""
        ...


@dataclass(frozen=True)
class Stage2RecordMeasurement:
    """Numbers of one replay from the record, comparable to stage 2's."""

    trace_id: str
    graph_id: str
    positions: int
    top_k_equal: int  # positions whose committed K candidates are the replay's K most probable ids
    top_k_agreement: float  # top_k_equal / positions
    logprob_error_max: float  # max |committed − replayed| raw log-probability over the K candidates
    logprob_error_mean: float
    graph_is_own_export: bool | None
    stage2: Stage2Measurements  # stage 2's signals on the replayed logits (no fingerprint: chunks are not replayed)

    def as_dict(self) -> dict[str, float | int | str | None]:
        """Return the scalar numbers (stage 2's prefixed with ``stage2.``)."""
        out: dict[str, float | int | str | None] = {k: v for k, v in asdict(self).items() if k != "stage2"}
        out.update({f"stage2.{k}": v for k, v in self.stage2.as_dict().items()})
        return out


@dataclass(frozen=True)
class Stage2RecordTolerance:
    """Bounds for a replay from the record (calibrated: see docs/workload.md and scripts/bench_workload.py)."""

    max_logprob_error: float
    min_top_k_agreement: float
    require_own_graph: bool = True  # a record graph that differs from the verifier's own export is refused


def verify_recorded_inference(inference: RecordedInference, expected_root: bytes | None = None) -> Artifact:
    """Return the recorded artifact, or raise InvalidInput if the record contradicts itself or the expected root."""
    artifact = decode_artifact_wire(inference.artifact_wire)
    if expected_root is not None and artifact.root != expected_root:
        raise InvalidInput(f"{inference.trace_id}: recorded artifact root {artifact.root.hex()} is not the committed "
                           f"{expected_root.hex()}", Reason.ARTIFACT_ROOT_MISMATCH)
    if list(artifact.header.prompt_token_ids) != inference.prompt_ids.tolist():
        raise InvalidInput(f"{inference.trace_id}: recorded prompt ids differ from the artifact's",
                           Reason.PROMPT_MISMATCH)
    if artifact.positions.chosen.tolist() != inference.output_ids.tolist():
        raise InvalidInput(f"{inference.trace_id}: recorded output ids differ from the artifact's chosen tokens",
                           Reason.OUTPUT_HASH_MISMATCH)
    return artifact


def measure_stage2_record(inference: RecordedInference, artifact: Artifact,
                          replayed: ReplayedLogits) -> Stage2RecordMeasurement:
    """Return the replay's agreement with the committed candidates and stage 2's signals on its logits."""
    positions = artifact.positions
    n, k = positions.token_ids.shape
    if replayed.logits.shape[0] != n:
        raise InvalidInput(f"{inference.trace_id}: {replayed.logits.shape[0]} replayed rows for {n} positions",
                           Reason.OUTPUT_LENGTH_MISMATCH)
    ids = positions.token_ids.astype(np.int64)
    errors = np.zeros((n, k))
    top_equal = 0
    for i in range(n):
        raw = compute_raw_logprobs(replayed.logits[i]).astype(np.float64)
        errors[i] = np.abs(raw[ids[i]] - positions.raw_logprobs[i].astype(np.float64))
        top = np.argpartition(-raw, k)[:k] if k < raw.size else np.arange(raw.size)
        top_equal += int(set(top.tolist()) == set(ids[i].tolist()))
    stage2 = measure_stage2(artifact.header, positions, replayed.logits)
    return Stage2RecordMeasurement(
        inference.trace_id, replayed.graph_id, n, top_equal, top_equal / n if n else 1.0,
        float(errors.max(initial=0.0)), float(errors.mean()) if errors.size else 0.0,
        replayed.graph_is_own_export, stage2)


def compute_record_scores_digest(m: Stage2RecordMeasurement) -> bytes:
    """Return keccak256 of the canonical JSON of the measurement's scalars (non-finite values as strings)."""
    scores = {k: (v if not isinstance(v, float) or math.isfinite(v) else repr(v)) for k, v in m.as_dict().items()}
    return keccak256(canonical_json(scores))


def find_stage2_record_violation(m: Stage2RecordMeasurement, tolerance: Stage2RecordTolerance,
                                 profile: Stage2Thresholds | None = None) -> Reason:
    """Return the first bound a replay breaks (graph, candidates, log-probabilities, the profile), or OK."""
    if tolerance.require_own_graph and m.graph_is_own_export is not True:
        return Reason.MODEL_MISMATCH  # not compared, or the record's graph is not what the claimed model exports
    if m.top_k_agreement < tolerance.min_top_k_agreement:
        return Reason.CANDIDATE_MISMATCH
    if not m.logprob_error_max <= tolerance.max_logprob_error:
        return Reason.LOGPROB_DISTANCE
    if profile is not None:
        return find_stage2_violation(m.stage2, profile)
    return Reason.OK


def decide_stage2_record(m: Stage2RecordMeasurement, tolerance: Stage2RecordTolerance,
                         profile: Stage2Thresholds | None = None) -> Stage2Decision:
    """Return the decision on a replay from the record (and on the profile's stage-2 thresholds, if given)."""
    return Stage2Decision(find_stage2_record_violation(m, tolerance, profile), compute_record_scores_digest(m))


def check_recorded_inference(replayer: RecordReplayer, trace_id: str, tolerance: Stage2RecordTolerance,
                             expected_root: bytes | None = None,
                             profile: Stage2Thresholds | None = None) -> tuple[Stage2RecordMeasurement, Stage2Decision]:
    """Load, verify, replay, measure and decide one recorded inference."""
    inference = replayer.load_inference(trace_id)
    artifact = verify_recorded_inference(inference, expected_root)
    measurement = measure_stage2_record(inference, artifact, replayer.replay_logits(inference))
    return measurement, decide_stage2_record(measurement, tolerance, profile)


def calibrate_record_tolerance(honest: list[Stage2RecordMeasurement], factor: float = 10.0,
                               floor: float = 1e-5) -> Stage2RecordTolerance:
    """Return a tolerance from honest replays: factor × the largest honest log-prob error (at least floor).

    Candidates must agree everywhere (the smallest honest agreement, never below it); the factor covers
    the tail a few honest runs do not show (the measured spread is float32 rounding, ~1e-6 .. 1e-5).
    """
    if not honest:
        raise InvalidInput("calibrating needs at least one honest replay", Reason.OUT_OF_RANGE)
    worst = max(m.logprob_error_max for m in honest)
    return Stage2RecordTolerance(max(worst * factor, floor), min(m.top_k_agreement for m in honest))

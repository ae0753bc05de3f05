"""The auditor: fetch an audited step's response, check it against the ledger, re-execute, measure, decide.

Exact checks (chain, signatures, named positions, batch roots, declared data, shapes) raise
InvalidTraining; the numeric comparison of the re-executed step is a frozen measurement, and
`decide_audit` applies the calibrated tolerance (node/training/tolerance.json, written by
`verinfer training calibrate`). A failed audit is a verdict, not a crash: `process_audit` turns every
typed rejection into an invalid verdict with its reason.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from node.protocol.ledger import (
    InvalidTraining,
    LedgerEntry,
    TrainingReason,
    compute_batch_root,
    compute_genesis_head,
    compute_window_index,
    verify_chain,
)
from node.protocol.lsh import (
    compute_named_positions,
    compute_quantisation,
    compute_sketch,
    compute_sketch_distance,
)
from node.protocol.training_state import compute_data_cursor, compute_state_root
from node.training.corpus import Corpus, get_batch_ids
from node.training.initcheck import (
    compute_init_measurement,
    compute_moment_measurement,
    is_init_accepted,
    is_moment_accepted,
)
from node.training.ledger_store import decode_entry, recover_head_signer
from node.training.model import (
    TrainState,
    get_declared_schedule,
    get_named_values,
    get_run_param_count,
    state_from_vector,
)
from node.training.replay import compute_replay, get_replay_model
from node.training.spec import RunSpec
from node.training.trajectory import verify_declared_schedule

log = logging.getLogger(__name__)
TOLERANCE_FILE = Path(__file__).with_name("tolerance.json")


@dataclass(frozen=True)
class AuditTolerance:
    """Calibrated thresholds of the step comparison (from the honest spread) and the KS level."""

    rel_update_error: float  # on max(rel_param_error, rel_momentum_error)
    named_rel_error: float
    lsh_rel_error: float
    init_alpha: float


def load_tolerance(path: Path = TOLERANCE_FILE, shape: str | None = None) -> AuditTolerance:
    """Return the calibrated tolerance: the named shape's own (its `per_shape` entry) when it has one, else the
    file's top-level one (calibrated on the tiny llama)."""
    d = json.loads(path.read_text())
    if shape is not None and shape in d.get("per_shape", {}):
        d = d["per_shape"][shape]
    return AuditTolerance(**{k: float(d["tolerance"][k]) for k in AuditTolerance.__dataclass_fields__})


def load_shape_tolerances(path: Path = TOLERANCE_FILE) -> dict[str, AuditTolerance]:
    """Return the per-shape tolerances of a tolerance file (shape name → tolerance; empty when it has none)."""
    return {shape: load_tolerance(path, shape) for shape in json.loads(path.read_text()).get("per_shape", {})}


@dataclass(frozen=True)
class AuditResponse:
    """What the prover served for one audit, and when the auditor saw it complete."""

    step: int
    state_prev: np.ndarray | None
    state: np.ndarray
    batches: tuple[tuple[tuple[int, ...], tuple[tuple[int, ...], ...]], ...]
    arrived_at: float


@dataclass(frozen=True)
class AuditMeasurement:
    """Numbers of one re-executed step (no thresholds)."""

    step: int
    rel_param_error: float  # ‖θ′(t) − θ(t)‖ / ‖θ′(t) − θ(t−1)‖ (re-executed vs served parameters)
    rel_momentum_error: float  # the same for the momentum buffer
    named_rel_error: float  # ‖Z′[I(t)] − ledger values‖ / ‖Z′[I(t)] − Z(t−1)[I(t)]‖
    lsh_rel_error: float  # sketch of the all-reduced gradient vs the ledger's
    replica_lsh_rel_error: float  # the worst single mini-batch sketch vs the ledger's replica sketch
    recompute_s: float


@dataclass(frozen=True)
class AuditVerdict:
    """The auditor's decision on one step."""

    step: int
    valid: bool
    reason: TrainingReason
    detail: str
    measurement: AuditMeasurement | None = None


def read_published_ledger(path: Path, run_id: bytes, prover: str | None) -> list[LedgerEntry]:
    """Return the prover's published entries after checking the chain from genesis and each head's signature."""
    entries: list[LedgerEntry] = []
    data = path.read_bytes()
    for line in data[:data.rfind(b"\n") + 1].splitlines():  # a last line still being written is not published yet
        entry, signature = decode_entry(line)
        if prover is not None and recover_head_signer(run_id, entry.step, entry.head, signature) != prover:
            raise InvalidTraining("ledger head not signed by the run's prover", TrainingReason.LEDGER_NOT_CHAINED,
                                  entry.step)
        entries.append(entry)
    verify_chain(entries, compute_genesis_head(run_id), 0)
    return entries


def get_response_files(folder: Path, step: int) -> list[Path]:
    """Return the files a complete response of a step has (step 0: the initial state alone)."""
    return [folder / "state.npy"] + ([folder / "state_prev.npy", folder / "batch.json"] if step > 0 else [])


def is_response_complete(folder: Path, step: int) -> bool:
    """Check whether every file of a step's response was served (each is written atomically)."""
    return all(p.exists() for p in get_response_files(folder, step))


def load_response(folder: Path, step: int) -> AuditResponse | None:
    """Return a complete served response from its folder, or None while it is incomplete."""
    state = folder / "state.npy"
    needed = get_response_files(folder, step)
    if not all(p.exists() for p in needed):
        return None
    try:
        prev = np.load(folder / "state_prev.npy", allow_pickle=False) if step > 0 else None
        cur = np.load(state, allow_pickle=False)
        raw = json.loads((folder / "batch.json").read_text()) if step > 0 else []
        batches = tuple((tuple(int(i) for i in b["ids"]), tuple(tuple(int(x) for x in t) for t in b["tokens"]))
                        for b in raw)
    except (ValueError, KeyError, TypeError, OSError) as e:
        raise InvalidTraining(f"response of step {step} is malformed: {e}", TrainingReason.LEDGER_MALFORMED,
                              step) from e
    arrived = max(p.stat().st_mtime for p in needed)  # local audits only: the service stamps arrival itself
    return AuditResponse(step=step, state_prev=prev, state=cur, batches=batches, arrived_at=arrived)


def verify_named_values(z: np.ndarray, entry: LedgerEntry, beacon: bytes, count: int) -> None:
    """Raise unless the served state equals the ledger bit for bit at the positions the verifier named."""
    positions = compute_named_positions(beacon, entry.step, z.size, count)
    if tuple(positions.tolist()) != entry.positions:
        raise InvalidTraining("ledger names other positions than the verifier's", TrainingReason.CHECKPOINT_POSITIONS,
                              entry.step)
    if z[positions].astype(">f4").tobytes() != np.asarray(entry.values, dtype=">f4").tobytes():
        raise InvalidTraining("served state differs from the ledger at the named positions",
                              TrainingReason.CHECKPOINT_POSITIONS, entry.step)


def verify_state_root(z: np.ndarray, entry: LedgerEntry, spec: RunSpec) -> None:
    """Raise STATE_ROOT_MISMATCH unless the served Z is the whole state the ledger's entry binds (step, cursor)."""
    n = z.size // 2
    root = compute_state_root(z[:n], z[n:], entry.step, compute_data_cursor(entry.step, spec.global_batch))
    if root != entry.state_root:
        raise InvalidTraining(f"served state of step {entry.step} is not the one its ledger entry binds",
                              TrainingReason.STATE_ROOT_MISMATCH, entry.step)


def verify_batches(spec: RunSpec, corpus: Corpus, entry: LedgerEntry, response: AuditResponse) -> list[np.ndarray]:
    """Return the replicas' windows after checking ids, tokens and roots against the declared data and ledger."""
    if len(response.batches) != spec.workers or len(entry.batch_roots) != spec.workers:
        raise InvalidTraining("served batches do not match the worker count", TrainingReason.BATCH_ROOT_MISMATCH,
                              entry.step)
    windows = []
    for rank, (ids, tokens) in enumerate(response.batches):
        if compute_batch_root(ids, tokens) != entry.batch_roots[rank]:
            raise InvalidTraining(f"batch of rank {rank} does not match its root", TrainingReason.BATCH_ROOT_MISMATCH,
                                  entry.step)
        declared = get_batch_ids(spec, len(corpus.samples), entry.step, rank)
        if list(ids) != declared or not np.array_equal(np.asarray(tokens), corpus.samples[declared]):
            raise InvalidTraining(f"rank {rank} committed samples outside the declared order",
                                  TrainingReason.DATA_UNDECLARED, entry.step)
        windows.append(corpus.samples[declared])
    return windows


CHUNK = 1 << 20  # elements per float64 block of the norms (8 MB): no float64 copy of a whole Z


def compute_relative_error(mine: np.ndarray, claimed: np.ndarray, before: np.ndarray) -> float:
    """Return ‖mine − claimed‖ / ‖mine − before‖: the gap relative to the step's own update (0 if both vanish).

    The differences and squares are taken in float64, block by block, so a 135 M-parameter state needs 3 × 8 MB
    of float64, not three float64 copies of Z."""
    gap_sq = update_sq = 0.0
    for i in range(0, mine.size, CHUNK):
        m = mine[i:i + CHUNK].astype(np.float64)
        gap_sq += float(np.dot(d := m - claimed[i:i + CHUNK].astype(np.float64), d))
        update_sq += float(np.dot(d := m - before[i:i + CHUNK].astype(np.float64), d))
    gap, update = gap_sq ** 0.5, update_sq ** 0.5
    return 0.0 if gap == 0.0 else gap / max(update, 1e-30)


def compute_audit_measurement(spec: RunSpec, prev: TrainState, windows: list[np.ndarray], entry: LedgerEntry,
                              served: np.ndarray) -> AuditMeasurement:
    """Re-execute step t from Z(t−1) and return how far the result is from the served state and the ledger."""
    started = time.perf_counter()
    seed = spec.lsh_seed()
    sketches: list[np.ndarray] = []  # each replica's gradient is sketched as it comes and not kept
    replay = compute_replay(spec, prev, windows, entry.step,
                            on_grad=lambda g: sketches.append(compute_sketch(spec.lsh_kind, g.numpy(), seed,
                                                                             spec.lsh_dim)))
    n = prev.params.numel()
    positions = np.asarray(entry.positions, dtype=np.int64)
    named = compute_relative_error(get_named_values(replay.state, positions).astype(np.float64),
                                   np.asarray(entry.values, dtype=np.float64),
                                   get_named_values(prev, positions).astype(np.float64))
    worst_replica = 0.0
    for sketch, claimed in zip(sketches, entry.replica_lsh, strict=True):
        mine = compute_quantisation(sketch, spec.lsh_scale)
        worst_replica = max(worst_replica, compute_sketch_distance(np.asarray(claimed), mine).relative_l2)
    # the all-reduced gradient's sketch is the mean of the replicas' (the projection is linear)
    lsh = compute_quantisation(np.mean(sketches, axis=0), spec.lsh_scale)
    new, before = replay.state, prev
    return AuditMeasurement(
        step=entry.step,
        rel_param_error=compute_relative_error(new.params.numpy(), served[:n], before.params.numpy()),
        rel_momentum_error=compute_relative_error(new.momentum.numpy(), served[n:], before.momentum.numpy()),
        named_rel_error=named,
        lsh_rel_error=compute_sketch_distance(np.asarray(entry.lsh), lsh).relative_l2,
        replica_lsh_rel_error=worst_replica,
        recompute_s=time.perf_counter() - started)


def decide_audit(m: AuditMeasurement, tol: AuditTolerance) -> AuditVerdict:
    """Return the verdict of a measurement under the calibrated tolerance."""
    worst = max(m.rel_param_error, m.rel_momentum_error)
    if m.named_rel_error > tol.named_rel_error or worst > tol.rel_update_error:
        return AuditVerdict(m.step, False, TrainingReason.RECOMPUTE_MISMATCH,
                            f"update error {worst:.3g}, named {m.named_rel_error:.3g}", m)
    if m.lsh_rel_error > tol.lsh_rel_error or m.replica_lsh_rel_error > tol.lsh_rel_error:
        return AuditVerdict(m.step, False, TrainingReason.LSH_MISMATCH,
                            f"lsh {m.lsh_rel_error:.3g}, replica {m.replica_lsh_rel_error:.3g}", m)
    return AuditVerdict(m.step, True, TrainingReason.OK, "within tolerance", m)


@dataclass(frozen=True)
class AuditContext:
    """What an auditor holds for one run: the declaration, the data, its beacon and the published ledger."""

    spec: RunSpec
    corpus: Corpus
    beacons: tuple[bytes, ...]  # per anchor window: the chain's beacon that named the window's positions
    entries: tuple[LedgerEntry, ...]
    tolerance: AuditTolerance

    def get_step_beacon(self, step: int) -> bytes:
        """Return the beacon of the window holding a step (CHECKPOINT_POSITIONS if the auditor lacks it)."""
        index = compute_window_index(step, self.spec.anchor_every)
        if index >= len(self.beacons):
            raise InvalidTraining(f"no beacon for window {index}", TrainingReason.CHECKPOINT_POSITIONS, step)
        return self.beacons[index]


def verify_step(ctx: AuditContext, response: AuditResponse, announced_at: float) -> AuditVerdict:
    """Return the verdict of one audited step (exact checks raise InvalidTraining; process_audit maps them)."""
    spec, step = ctx.spec, response.step
    if response.arrived_at - announced_at > spec.response_deadline_s:
        raise InvalidTraining(f"answered {response.arrived_at - announced_at:.1f} s after the announcement",
                              TrainingReason.LATE_RESPONSE, step)
    if step >= len(ctx.entries):
        raise InvalidTraining("audited step not in the ledger", TrainingReason.LEDGER_STEP_GAP, step)
    n_params = get_run_param_count(spec)
    served = state_from_vector(step, response.state, n_params, copy=False)  # views: checked, never written
    verify_named_values(response.state, ctx.entries[step], ctx.get_step_beacon(step), spec.named_positions)
    verify_state_root(response.state, ctx.entries[step], spec)  # before any recomputation: the bound state only
    if step == 0:
        m = compute_init_measurement(spec, served.params.numpy(), sample=200_000,
                                     seed=int.from_bytes(ctx.get_step_beacon(0)[:8]))
        moments = compute_moment_measurement(spec, served.params.numpy())
        if not is_init_accepted(m, ctx.tolerance.init_alpha) or bool(torch.any(served.momentum != 0)):
            raise InvalidTraining(f"initialisation fails the declared strategy (min p {m.min_p_value:.3g} in "
                                  f"{m.worst_tensor})", TrainingReason.INIT_DISTRIBUTION, 0)
        if not is_moment_accepted(moments, ctx.tolerance.init_alpha):
            raise InvalidTraining(f"initialisation fails the declared strategy's moments (min p "
                                  f"{moments.min_p_value:.3g} in {moments.worst})", TrainingReason.INIT_DISTRIBUTION, 0)
        return AuditVerdict(0, True, TrainingReason.OK,
                            f"init KS min p {m.min_p_value:.3g}, moments min p {moments.min_p_value:.3g}")
    if response.state_prev is None:
        raise InvalidTraining("no Z(t−1) served", TrainingReason.CHECKPOINT_MISSING, step)
    prev = state_from_vector(step - 1, response.state_prev, n_params, copy=False)
    verify_named_values(response.state_prev, ctx.entries[step - 1], ctx.get_step_beacon(step - 1),
                        spec.named_positions)
    verify_state_root(response.state_prev, ctx.entries[step - 1], spec)  # Z(t−1) served here = Z(t−1) served "after"
    verify_declared_schedule([ctx.entries[step]], get_declared_schedule(spec))
    windows = verify_batches(spec, ctx.corpus, ctx.entries[step], response)
    return decide_audit(compute_audit_measurement(spec, prev, windows, ctx.entries[step], response.state),
                        ctx.tolerance)


def process_served_audit(ctx: AuditContext, folder: Path, step: int, arrived_at: float, announced_at: float,
                         lock: Path | None = None) -> AuditVerdict:
    """Load a served response from `folder` and audit it (in the auditor's child process, so the parent never
    holds the checkpoints); with `lock`, loading and re-execution hold the machine's recompute lock."""
    from node.training.scheduler import hold_recompute_lock

    with hold_recompute_lock(lock):
        try:
            response = load_response(folder, step)
        except InvalidTraining as e:
            return AuditVerdict(step, False, e.training_reason, str(e))
        if response is None:
            return AuditVerdict(step, False, TrainingReason.CHECKPOINT_MISSING, "served response disappeared")
        verdict = process_audit(ctx, dataclasses.replace(response, arrived_at=arrived_at), announced_at)
        del response
        get_replay_model.cache_clear()  # its parameters are views of this response's Z(t−1): let both go
        gc.collect()
    return verdict


def process_audit(ctx: AuditContext, response: AuditResponse | None, announced_at: float) -> AuditVerdict:
    """Return the verdict of an audit; a missing response or any typed rejection is an invalid verdict."""
    if response is None:
        return AuditVerdict(-1, False, TrainingReason.LATE_RESPONSE, "no response before the deadline")
    try:
        return verify_step(ctx, response, announced_at)
    except InvalidTraining as e:
        log.info("audit of step %d rejected: %s", response.step, e)
        return AuditVerdict(response.step, False, e.training_reason, str(e))

"""The prover: a torch.distributed (gloo) data-parallel job of N workers plus one shadow rank.

Ranks 0..N−1 are workers, rank N is the shadow. Each step every worker computes its mini-batch
gradient, sketches it (the replica LSH) and all-reduces it with SUM over all N+1 ranks; the shadow
contributes zeros, and everyone divides by N, so the workers' average is exactly what it would be
without the shadow, and the shadow receives the same bits. Rank 0 writes the signed ledger entry.
Every m steps rank 0 anchors the head (AuditSource.on_anchor) and learns which steps were drawn, and which
steps of the previous window validators requested on chain (requestAudit; a requested step unserved is voted
LATE_RESPONSE like a drawn one, so the prover cannot ignore it); it then serves the batches of those steps and
the shadow serves Z(s−1), Z(s) from its last K = 2m states.

`Cheat`s make the prover dishonest in precise ways at given steps; with none the prover is honest.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from eth_account import Account

from node.protocol.hashing import keccak256
from node.protocol.ledger import (
    LedgerEntry,
    compute_batch_root,
    compute_genesis_head,
    compute_window_index,
    seal_entry,
)
from node.protocol.lsh import (
    compute_named_positions,
    compute_quantisation,
    compute_sketch_plan,
    compute_sketch_with_plan,
    is_audited,
)
from node.protocol.training_state import (
    compute_data_cursor,
    compute_root_from_shards,
    compute_shard_digests,
    compute_state_root,
)
from node.training.corpus import get_batch_ids, load_corpus
from node.training.ledger_store import LedgerStore, encode_entry, sign_head
from node.training.model import (
    TrainState,
    build_model,
    compute_local_gradient,
    compute_lr,
    compute_update,
    get_named_values,
    get_params_vector,
    set_params_vector,
)
from node.training.shadow import ShadowState
from node.training.spec import RunSpec

log = logging.getLogger(__name__)
UPDATE_CHEATS = ("skip-step", "wrong-lr", "wrong-lr-logged")
LR_CHEATS = ("wrong-lr", "wrong-lr-logged")
DATA_CHEATS = ("undeclared-sample", "undeclared-batch", "repeat-step", "doctor", "doctor-patched", "forge-shadow",
               "swap")
# issue 30's hidden-state cheats: the prover continues from a cheated Z(s) (undeclared data, or stolen weights)
# whose named positions it restored to the honest update's values, logs the declared batch's sketches and loss,
# serves the honest Z(s) to an audit of s and the cheated Z(s) as "before s+1"
SWAP_CHEATS = ("swap", "swap-stolen")
SERVE_CHEATS = ("doctor", "doctor-patched", "forge-shadow", "late", *SWAP_CHEATS)


class AuditSource(Protocol):
    """The verifier's randomness as the prover sees it: a window's beacon, then after each anchor its draws."""

    def get_beacon(self, index: int) -> bytes:
        """Return the beacon of anchor window `index` (fixed only after window index − 1 was anchored)."""
        ...

    def on_anchor(self, first_step: int, last_step: int, head: bytes) -> list[int]:
        """Anchor head (covering steps first..last) and return the steps to serve now: the audited steps among
        them, and audits the verifier requested on the previous window (the chain's AuditRequested)."""
        ...


def compute_local_beacon(secret: bytes, index: int) -> bytes:
    """Return the beacon of window `index` of an in-process verifier: keccak256(secret ‖ "beacon" ‖ uint256 index)."""
    return keccak256(secret + b"beacon" + index.to_bytes(32, "big"))


@dataclass(frozen=True)
class LocalAudits:
    """Audits drawn in-process from keccak(secret ‖ head) at rate p (tests and calibration; p = 1 audits all)."""

    secret: bytes
    rate_wad: int

    def get_beacon(self, index: int) -> bytes:
        """Return the in-process verifier's beacon of a window."""
        return compute_local_beacon(self.secret, index)

    def on_anchor(self, first_step: int, last_step: int, head: bytes) -> list[int]:
        """Return the steps whose draw falls under the rate."""
        rnd = keccak256(self.secret + head)
        return [t for t in range(first_step, last_step + 1) if is_audited(keccak256(rnd + t.to_bytes(32, "big")),
                                                                            self.rate_wad)]


@dataclass(frozen=True)
class Cheat:
    """One way to be dishonest at one step (kind "none" is the honest prover)."""

    kind: str = "none"
    step: int = 0
    factor: float = 2.0
    delay_s: float = 0.0


@dataclass(frozen=True)
class JobPlan:
    """Everything the spawned ranks need (picklable)."""

    spec: RunSpec
    out_dir: Path
    prover_key: bytes
    audits: Any  # an AuditSource; Any so that pickling keeps the concrete class
    port: int
    threads: int = 1
    cheats: tuple[Cheat, ...] = ()
    init_vector: Path | None = None  # a stolen initialisation (npy of the params), for the attack


def get_cheat(plan: JobPlan, step: int) -> Cheat:
    """Return the cheat the prover commits at a step (kind "none" when it is honest there)."""
    return next((c for c in plan.cheats if c.step == step), Cheat())


def run_job(plan: JobPlan) -> None:
    """Run the whole job (N workers + shadow) to completion in child processes."""
    plan.out_dir.mkdir(parents=True, exist_ok=True)
    (plan.out_dir / "spec.json").write_text(plan.spec.model_dump_json(indent=1))
    spawn = mp.spawn  # type: ignore[attr-defined]
    spawn(_rank_main, args=(plan,), nprocs=plan.spec.workers + 1, join=True)  # type: ignore[no-untyped-call]


def _rank_main(rank: int, plan: JobPlan) -> None:
    torch.set_num_threads(plan.threads)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(plan.port)
    dist.init_process_group("gloo", rank=rank, world_size=plan.spec.workers + 1)
    try:
        if rank == plan.spec.workers:
            _shadow_loop(plan)
        else:
            _worker_loop(rank, plan)
    except Exception:
        log.exception("rank %d of the training job failed", rank)
        raise
    finally:
        dist.destroy_process_group()


def _initial_state(plan: JobPlan, model: torch.nn.Module) -> TrainState:
    params = get_params_vector(model)
    if plan.init_vector is not None and get_cheat(plan, 0).kind == "stolen-init":
        params = torch.from_numpy(np.load(plan.init_vector).astype(np.float32))
    dist.broadcast(params, src=0)  # every rank starts from rank 0's Z(0), the one the ledger names
    return TrainState(step=0, params=params, momentum=torch.zeros_like(params))


def _cheat_windows(plan: JobPlan, rank: int, step: int, ids: list[int], windows: np.ndarray) -> np.ndarray:
    """Return the windows the worker really trains on (the declared ones unless a data cheat is due)."""
    kind, spec = get_cheat(plan, step).kind, plan.spec
    if kind not in DATA_CHEATS:
        return windows
    corpus = load_corpus(spec.corpus_files, spec.seq_len)
    extra = load_corpus(spec.corpus_files + 8, spec.seq_len).samples[len(corpus.samples):]  # undeclared files
    out = windows.copy()
    if kind == "undeclared-sample" and rank == 0:
        out[0] = extra[0]
    elif kind in ("undeclared-batch", "doctor", "doctor-patched", "forge-shadow", "swap"):
        out[:] = extra[rank * len(out):(rank + 1) * len(out)]
    elif kind == "repeat-step":
        out = corpus.samples[get_batch_ids(spec, len(corpus.samples), step - 1, rank)]
    return out


def compute_step_lr(plan: JobPlan, step: int) -> float:
    """Return the learning rate the prover really uses (declared, unless a wrong-lr cheat is due)."""
    lr, cheat = compute_lr(plan.spec, step), get_cheat(plan, step)
    return lr * cheat.factor if cheat.kind in LR_CHEATS else lr


def get_logged_lr(plan: JobPlan, step: int) -> float:
    """Return the lr the ledger records: the declared one (a careful wrong-lr cheater logs it too), except for the
    cheater that logs the lr it really used (wrong-lr-logged)."""
    return compute_step_lr(plan, step) if get_cheat(plan, step).kind == "wrong-lr-logged" else compute_lr(plan.spec,
                                                                                                          step)


def compute_step_update(plan: JobPlan, state: TrainState, grad: torch.Tensor, step: int,
                        beacon: bytes | None = None) -> TrainState:
    """Return the prover's real update of step t (identical on workers and shadow; beacon: t's window's, which a
    hidden-state cheat needs to restore the named positions)."""
    kind = get_cheat(plan, step).kind
    if kind == "skip-step":
        return TrainState(step=step, params=state.params, momentum=state.momentum)
    if kind in SWAP_CHEATS:
        from node.training import attacks  # the dishonest provers' state; honest runs never call into it

        if beacon is None:
            raise ValueError(f"the {kind} cheat at step {step} needs its window's beacon")
        return attacks.compute_swapped_update(plan, state, grad, step, beacon)
    return compute_update(state, grad, compute_step_lr(plan, step), plan.spec.momentum)


def _worker_loop(rank: int, plan: JobPlan) -> None:
    spec = plan.spec
    corpus = load_corpus(spec.corpus_files, spec.seq_len)
    model = build_model(spec)
    state = _initial_state(plan, model)
    set_params_vector(model, state.params)
    lsh_plan = compute_sketch_plan(spec.lsh_kind, spec.lsh_seed(), state.params.numel(), spec.lsh_dim)
    writer = _LedgerWriter(plan) if rank == 0 else None
    beacon = _share_beacon(plan, writer, 0)
    if writer is not None:
        writer.write(state, beacon, (), (), None, float("nan"), float("nan"), float("nan"))
    batches: deque[tuple[int, list[Any]]] = deque(maxlen=spec.keep_checkpoints)
    last_anchor = 0
    for step in range(1, spec.steps + 1):
        started_ns = time.time_ns()
        ids = get_batch_ids(spec, len(corpus.samples), step, rank)
        declared = corpus.samples[ids]
        swap = get_cheat(plan, step).kind in SWAP_CHEATS
        loss, grad = compute_local_gradient(model, _cheat_windows(plan, rank, step, ids, declared))
        if swap:  # the declared batch's gradient too: its sketch and loss are logged, its update restores I(t)
            loss, honest = compute_local_gradient(model, declared)
            grad = torch.cat([grad, honest])
        logged = grad[grad.numel() // 2:] if swap else grad
        sketch = compute_sketch_with_plan(lsh_plan, logged.numpy())  # one sketch per worker, in parallel
        replica_lsh = compute_quantisation(sketch, spec.lsh_scale)
        root = compute_batch_root(ids, declared.tolist())
        dist.all_reduce(grad, op=dist.ReduceOp.SUM)
        grad /= spec.workers
        state = compute_step_update(plan, state, grad, step, beacon)
        logged = grad[grad.numel() // 2:] if swap else grad
        set_params_vector(model, state.params)
        # every replica holds Z(t): each hashes its 1/N of the state root's chunks (issue 30: the binding's cost ÷ N)
        shard = compute_shard_digests(state.params.numpy(), state.momentum.numpy(), rank, spec.workers)
        gathered: list[Any] = [None] * (spec.workers + 1) if rank == 0 else []
        dist.gather_object((root, replica_lsh.tolist(), loss, ids, declared.tolist(), sketch, shard),
                           gathered if rank == 0 else None, dst=0)
        if writer is not None:
            parts = gathered[: spec.workers]
            batches.append((step, [(p[3], p[4]) for p in parts]))
            # the sketch is linear: the all-reduced gradient's is the mean of the replicas' (no second projection)
            mean_sketch = np.mean([p[5] for p in parts], axis=0)
            writer.write(state, beacon, tuple(p[0] for p in parts), tuple(tuple(p[1]) for p in parts), mean_sketch,
                         float(np.mean([p[2] for p in parts])), float(logged.norm()), get_logged_lr(plan, step),
                         shards=[p[6] for p in parts])
            with (plan.out_dir / "steps.jsonl").open("a") as f:  # timings for the workload record's trace
                f.write(json.dumps({"step": step, "start_ns": started_ns, "end_ns": time.time_ns()}) + "\n")
        del grad, logged  # the next step's backward must not find this one's gradient still alive
        if step % spec.anchor_every == 0 or step == spec.steps:
            drawn = _anchor(plan, writer, last_anchor + 1 if last_anchor else 0, step)
            last_anchor = step
            if drawn is None:
                break
            if writer is not None:
                _serve_batches(plan, drawn, dict(batches))
            if step < spec.steps:  # the next window's named positions exist only now that this one is anchored
                beacon = _share_beacon(plan, writer, compute_window_index(step + 1, spec.anchor_every))
    if writer is not None:
        writer.close()


def _share_beacon(plan: JobPlan, writer: _LedgerWriter | None, index: int) -> bytes:
    """Read window `index`'s beacon on rank 0 (waiting for the chain) and give it to every rank."""
    box: list[Any] = [plan.audits.get_beacon(index) if writer is not None else None]
    dist.broadcast_object_list(box, src=0)
    beacon: bytes = box[0]
    if writer is not None:
        with (plan.out_dir / "beacons.jsonl").open("a") as f:
            f.write(json.dumps({"index": index, "beacon": beacon.hex(), "at": time.time()}) + "\n")
    return beacon


class RunStopped(Exception):
    """The chain no longer accepts this run's anchors (it was slashed): every rank stops after this step."""


def _anchor(plan: JobPlan, writer: _LedgerWriter | None, first: int, last: int) -> list[int] | None:
    """Anchor on rank 0 and share the drawn steps with every rank; None when the run was stopped."""
    box: list[Any] = [None]
    if writer is not None:
        try:
            box[0] = plan.audits.on_anchor(first, last, writer.head)
        except RunStopped as e:
            log.warning("run stopped at step %d: %s", last, e)
        announce = plan.out_dir / "announced.jsonl"
        with announce.open("a") as f:
            for s in box[0] or []:
                f.write(json.dumps({"step": s, "at": time.time()}) + "\n")
        if box[0] is not None:  # off-chain requests (raised audit rate) are served with the drawn steps
            box[0] = sorted(set(box[0]) | set(take_requests(plan.out_dir, last)))
    dist.broadcast_object_list(box, src=0)
    return None if box[0] is None else list(box[0])


def compute_train_state_root(state: TrainState, global_batch: int,
                             shards: list[dict[tuple[int, int], bytes]] | None = None) -> bytes:
    """Return the state root of Z(t) (params ‖ momentum, step, data cursor): from the replicas' shard digests when
    given, else hashed here from the tensors (no Z built)."""
    cursor = compute_data_cursor(state.step, global_batch)
    if shards is not None:
        return compute_root_from_shards(state.step, cursor, (state.params.numel(), state.momentum.numel()), shards)
    return compute_state_root(state.params.numpy(), state.momentum.numpy(), state.step, cursor)


class _LedgerWriter:
    """Rank 0's ledger: builds, seals, signs and stores one entry per step, off the training's critical path.

    Entries are written in order by one background thread (the step's tensors are never changed in place, so
    the thread reads them safely); `flush` waits for them, and the anchor flushes before it reads the head.
    """

    def __init__(self, plan: JobPlan) -> None:
        self.plan = plan
        self.run_id = plan.spec.run_id()
        self.store = LedgerStore(plan.out_dir / "ledger", self.run_id)
        self.account = Account.from_key(plan.prover_key)
        self._head = compute_genesis_head(self.run_id)
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ledger")
        self.pending: list[Future[None]] = []

    @property
    def head(self) -> bytes:
        """Return the newest head after every queued entry was written."""
        self.flush()
        return self._head

    def write(self, state: TrainState, beacon: bytes, roots: tuple[bytes, ...],
              replica_lsh: tuple[tuple[int, ...], ...], mean_sketch: np.ndarray | None, loss: float, grad_norm: float,
              lr: float, shards: list[dict[tuple[int, int], bytes]] | None = None) -> None:
        """Queue the entry of the state just reached (step 0: no batch, no sketch; shards: the replicas' state-root
        chunk digests, None to hash the whole state here)."""
        self.pending.append(self.pool.submit(self._write, state, beacon, roots, replica_lsh, mean_sketch, loss,
                                             grad_norm, lr, shards))

    def _write(self, state: TrainState, beacon: bytes, roots: tuple[bytes, ...],
               replica_lsh: tuple[tuple[int, ...], ...], mean_sketch: np.ndarray | None, loss: float, grad_norm: float,
               lr: float, shards: list[dict[tuple[int, int], bytes]] | None) -> None:
        spec = self.plan.spec
        positions = compute_named_positions(beacon, state.step, 2 * state.params.numel(), spec.named_positions)
        lsh: tuple[int, ...] = ()
        if mean_sketch is not None:
            lsh = tuple(compute_quantisation(mean_sketch, spec.lsh_scale).tolist())
        entry = seal_entry(LedgerEntry(
            run_id=self.run_id, step=state.step, prev_head=self._head, positions=tuple(positions.tolist()),
            values=tuple(get_named_values(state, positions).tolist()), batch_roots=roots, lsh=lsh,
            replica_lsh=replica_lsh, loss=loss, grad_norm=grad_norm, lr=lr, state_root=compute_train_state_root(
                state, spec.global_batch, shards)))
        signature = sign_head(self.account, self.run_id, entry.step, entry.head)
        self.store.process_entry(entry, signature)
        with (self.plan.out_dir / "ledger.jsonl").open("ab") as f:  # the published copy auditors read
            f.write(encode_entry(entry, signature) + b"\n")
        self._head = entry.head

    def flush(self) -> None:
        """Wait until every queued entry is stored (raising the first failure)."""
        pending, self.pending = self.pending, []
        for future in pending:
            future.result()

    def close(self) -> None:
        """Flush, stop the thread and close the store."""
        try:
            self.flush()
        finally:
            self.pool.shutdown(wait=True)
            self.store.close()


def get_request_dir(out_dir: Path) -> Path:
    """Return where auditors leave off-chain audit requests (`<step>.json`) for the prover."""
    return out_dir / "requests"


def take_requests(out_dir: Path, last_step: int) -> list[int]:
    """Return the requested steps ≤ last_step not taken before, marking them taken."""
    folder = get_request_dir(out_dir)
    steps = []
    for path in sorted(folder.glob("*.json")) if folder.exists() else []:
        try:
            step = int(json.loads(path.read_text())["step"])
        except (ValueError, KeyError, TypeError, OSError):
            log.warning("ignoring malformed audit request %s", path.name)
            path.unlink(missing_ok=True)
            continue
        if 0 <= step <= last_step:
            steps.append(step)
            path.rename(path.with_suffix(".taken"))
    return steps


def get_response_dir(out_dir: Path, step: int) -> Path:
    """Return where the prover serves the audit response of a step."""
    return out_dir / "responses" / f"{step:08d}"


def _write_atomically(folder: Path, name: str, write: Any) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{name}.tmp-{os.getpid()}"
    write(tmp)
    os.replace(tmp, folder / name)


def _serve_batches(plan: JobPlan, drawn: list[int], batches: dict[int, list[Any]]) -> None:
    for step in drawn:
        if step in batches:
            payload = [{"ids": ids, "tokens": toks} for ids, toks in batches[step]]
            _write_atomically(get_response_dir(plan.out_dir, step), "batch.json",
                              lambda p, payload=payload: p.write_text(json.dumps(payload)))


def _shadow_loop(plan: JobPlan) -> None:
    spec = plan.spec
    model = build_model(spec)
    beacons: dict[int, bytes] = {}

    def update(state: TrainState, grad: torch.Tensor, step: int) -> TrainState:
        beacon = beacons.get(compute_window_index(step, spec.anchor_every))
        return compute_step_update(plan, state, grad, step, beacon)

    shadow = ShadowState(spec, _initial_state(plan, model), update)
    n = shadow.latest.params.numel()
    del model
    last_anchor = 0
    timers: list[threading.Timer] = []
    beacons[0] = _share_beacon(plan, None, 0)
    for step in range(1, spec.steps + 1):
        grad = torch.zeros(2 * n if get_cheat(plan, step).kind in SWAP_CHEATS else n, dtype=torch.float32)
        dist.all_reduce(grad, op=dist.ReduceOp.SUM)
        grad /= spec.workers
        dist.gather_object(None, None, dst=0)  # release rank 0 first: the apply below overlaps the next step
        shadow.on_gradient(step, grad)
        if step % spec.anchor_every == 0 or step == spec.steps:
            drawn = _anchor(plan, None, last_anchor + 1 if last_anchor else 0, step)
            last_anchor = step
            if drawn is None:
                break
            if step < spec.steps:
                index = compute_window_index(step + 1, spec.anchor_every)
                beacons[index] = _share_beacon(plan, None, index)
            for s in drawn:
                serve = _make_state_server(plan, shadow, s, beacons[compute_window_index(s, spec.anchor_every)])
                if get_cheat(plan, s).kind == "late":
                    timers.append(threading.Timer(get_cheat(plan, s).delay_s, serve))
                    timers[-1].start()
                else:
                    serve()
                del serve  # its on-demand Z(s) (1.08 GB for SmolLM2) must not outlive the serving
    for t in timers:
        t.join()


def _make_state_server(plan: JobPlan, shadow: ShadowState, step: int, beacon: bytes) -> Any:
    """Return a callable writing Z(s−1) and Z(s) for an audit (doctored or forged for those cheats).

    An honest server holds the two states (the buffer's own tensors, never changed in place) and writes each
    as params then momentum straight into the .npy, so serving builds no Z vector (2 × 4 bytes × params)."""
    from node.training import attacks  # the dishonest provers' serving; honest runs never call into it

    try:
        prev_state = shadow.get_state(step - 1) if step > 0 else None
        cur_state = shadow.get_state(step)
    except Exception:  # a step that left the buffer is simply not served: the auditor sees a missed audit
        log.warning("audit of step %d can no longer be served", step)
        return lambda: None
    folder = get_response_dir(plan.out_dir, step)
    if get_cheat(plan, step).kind in SERVE_CHEATS and prev_state is not None:
        prev, cur = attacks.compute_served_states(plan, step, prev_state.vector(), cur_state.vector(), beacon)

        def serve_vectors() -> None:
            _write_atomically(folder, "state_prev.npy", lambda p: _save_npy(p, prev))
            _write_atomically(folder, "state.npy", lambda p: _save_npy(p, cur))

        return serve_vectors

    def serve() -> None:
        if prev_state is not None:
            _write_atomically(folder, "state_prev.npy", lambda p: save_state_npy(p, prev_state))
        _write_atomically(folder, "state.npy", lambda p: save_state_npy(p, cur_state))

    return serve


def _save_npy(path: Path, array: np.ndarray) -> None:
    with path.open("wb") as f:
        np.save(f, array)


def save_state_npy(path: Path, state: TrainState) -> None:
    """Write Z = params ‖ momentum as a float32 .npy (the bytes np.save writes for state.vector()) without
    concatenating the two tensors."""
    n = state.params.numel() + state.momentum.numel()
    with path.open("wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": np.lib.format.dtype_to_descr(np.dtype("<f4")),
                                                 "fortran_order": False, "shape": (n,)})
        for part in (state.params, state.momentum):
            f.write(part.detach().contiguous().numpy().astype("<f4", copy=False).data)


def remove_job_outputs(out_dir: Path) -> None:
    """Delete a job's outputs (ledger, responses) before a fresh run into the same folder."""
    shutil.rmtree(out_dir, ignore_errors=True)

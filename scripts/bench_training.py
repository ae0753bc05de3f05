"""Benchmark training verification: prover overhead ÷ step time, k = recompute ÷ step, gas per anchored step.

    .venv/bin/python scripts/bench_training.py [--shapes tiny,smollm2] [--repeats 3]

Per model shape, one worker's step (forward + backward on its mini-batch, the SGD update) is timed
in-process with one thread, as the job's workers run, in CPU seconds of this process (--clock wall
for wall-clock: on a shared machine other load moves wall-clock timings by 2x), at each --batches
size. The prover's additions are timed alone: the batch commitment, the gradient sketch (its replica's;
the all-reduced one is the replicas' mean) of the spec's kind with a precomputed plan (A/B: the
count sketch before, the block-sign sketch now), the ledger entry (named positions, seal, EIP-712
signature, LevelDB write), the state root binding the whole Z(t) in the entry (issue 30: sha256 of every
4 MiB chunk of params ‖ momentum, a Merkle root over them; in rank 0's ledger thread) and the shadow's cost
to the workers (a gloo all-reduce among N+1 instead of N
processes, wall-clock). The auditor's recompute of one step (N replicas) gives k. Gas comes from
anchoring on a real anvil. Prints a table and writes bench-results/training-bench.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from eth_account import Account
from rich.console import Console
from rich.table import Table
from transformers import LlamaForCausalLM

from node.protocol.hashing import keccak256
from node.protocol.ledger import LedgerEntry, compute_batch_root, compute_genesis_head, compute_run_id, seal_entry
from node.protocol.lsh import (
    compute_named_positions,
    compute_quantisation,
    compute_sketch_plan,
    compute_sketch_with_plan,
)
from node.protocol.training_state import (
    compute_root_from_digests,
    compute_shard_digests,
    compute_state_root,
    get_chunk_bounds,
)
from node.training.corpus import get_batch_ids, load_corpus
from node.training.ledger_store import LedgerStore, sign_head
from node.training.model import (
    TrainState,
    build_model,
    compute_local_gradient,
    compute_update,
    get_named_values,
    get_params_vector,
    set_params_vector,
)
from node.training.replay import compute_replay
from node.training.spec import SMOLLM2_135M, ModelShape, RunSpec

OUT = Path("bench-results/training-bench.json")
# In-process timings (one thread) read this clock: the process's CPU seconds by default, which other load on a
# shared machine barely moves; --clock wall for wall-clock seconds. The gloo all-reduces are always wall-clock.
CLOCK: list[Callable[[], float]] = [time.process_time]
SHAPES = {"tiny": ModelShape(), "smollm2": SMOLLM2_135M}


def timed_pair(before: Callable[[], Any], after: Callable[[], Any], repeats: int) -> tuple[float, float]:
    """Return the median seconds of two implementations timed alternately (a shared machine's load hits both)."""
    before()
    after()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        for fn, out in ((before, times[0]), (after, times[1])):
            t = CLOCK[0]()
            fn()
            out.append(CLOCK[0]() - t)
    return statistics.median(times[0]), statistics.median(times[1])


def timed(fn: Callable[[], Any], repeats: int) -> float:
    """Return the median seconds of fn over repeats (after one warm-up call)."""
    fn()
    times = []
    for _ in range(repeats):
        t = CLOCK[0]()
        fn()
        times.append(CLOCK[0]() - t)
    return statistics.median(times)


def _allreduce_rank(rank: int, world: int, port: int, n: int, repeats: int, out: str) -> None:
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    x = torch.ones(n)
    dist.all_reduce(x)
    times = []
    for _ in range(repeats):
        dist.barrier()
        t = time.perf_counter()
        dist.all_reduce(x)
        times.append(time.perf_counter() - t)
    if rank == 0:
        Path(out).write_text(json.dumps(statistics.median(times)))
    dist.destroy_process_group()


def measure_allreduce(world: int, n: int, repeats: int) -> float:
    """Return the median seconds of one gloo all-reduce of n floats among `world` processes."""
    from chain.devnet import find_free_port

    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        spawn = mp.spawn  # type: ignore[attr-defined]
        spawn(_allreduce_rank, args=(world, find_free_port(), n, repeats, f.name), nprocs=world,  # type: ignore[no-untyped-call]
              join=True)
        return float(json.loads(Path(f.name).read_text()))


def bench_shape(name: str, shape: ModelShape, repeats: int, batches: list[int]) -> dict[str, Any]:
    """Return the timings of one model shape."""
    torch.set_num_threads(1)
    spec = RunSpec(shape=shape, steps=10)
    samples = load_corpus(spec.corpus_files, spec.seq_len).samples
    ids = get_batch_ids(spec, len(samples), 1, 0)
    windows = samples[ids]
    model = build_model(spec)
    state = TrainState(0, get_params_vector(model), torch.zeros_like(get_params_vector(model)))
    n = state.params.numel()

    def step() -> None:
        _, g = compute_local_gradient(model, windows)
        compute_update(state, g, 0.01, 0.9)

    t_step = timed(step, repeats)
    _, grad = compute_local_gradient(model, windows)
    t_commit = timed(lambda: compute_batch_root(ids, windows.tolist()), repeats)
    t0 = time.perf_counter()
    plan = compute_sketch_plan(spec.lsh_kind, spec.lsh_seed(), n, spec.lsh_dim)
    t_plan = time.perf_counter() - t0
    before = compute_sketch_plan("count-sketch", spec.lsh_seed(), n, spec.lsh_dim)  # the kind before (A of A/B)
    # each worker sketches its own gradient (in parallel); the all-reduced sketch is their mean (linearity)
    t_lsh_before, t_lsh = timed_pair(
        lambda: compute_quantisation(compute_sketch_with_plan(before, grad.numpy()), spec.lsh_scale),
        lambda: compute_quantisation(compute_sketch_with_plan(plan, grad.numpy()), spec.lsh_scale), repeats)
    t_ledger = bench_ledger(spec, state, repeats)
    z_p, z_m = state.params.numpy(), state.momentum.numpy()
    # A/B in one run: v1's sha256 leaves, v2's BLAKE3 leaves (the whole state: what an auditor hashes), and rank 0's
    # share when the N replicas each hash every N-th chunk (what a worker pays per step)
    t_root_sha256, t_root = timed_pair(lambda: compute_sha256_root(z_p, z_m),
                                       lambda: compute_state_root(z_p, z_m, 1, spec.global_batch), repeats)
    t_root_shard = timed(lambda: compute_shard_digests(z_p, z_m, 0, spec.workers), repeats)
    positions = compute_named_positions(b"b" * 32, 1, 2 * n, spec.named_positions)
    t_named_before, t_named = timed_pair(lambda: state.vector()[positions], lambda: get_named_values(state, positions),
                                         repeats)
    t_ar2 = measure_allreduce(spec.workers, n, repeats)
    t_ar3 = measure_allreduce(spec.workers + 1, n, repeats)
    t_shadow = max(0.0, t_ar3 - t_ar2)
    t_step_wall = t_step + t_ar2
    replica_windows = [samples[get_batch_ids(spec, len(samples), 1, r)] for r in range(spec.workers)]
    set_params_vector(model, state.params)
    t_recompute = timed(lambda: compute_replay(spec, state, replica_windows, 1), max(1, repeats // 2))
    # before: the count sketch, the ledger (with Z built for the named values) on rank 0's critical path;
    # after: the block-sign sketch, the named values gathered without Z, the ledger's CPU time in a
    # background thread (still spent)
    overhead_before = t_commit + t_lsh_before + t_ledger + (t_named_before - t_named) + t_shadow
    unbound = t_commit + t_lsh + t_ledger + t_shadow  # the prover before issue 30: named positions only
    overhead = unbound + t_root_shard
    critical = t_commit + t_lsh + t_shadow
    tokens = spec.batch_per_worker * spec.seq_len
    # the overhead is per step and grows with the parameters; the step grows with the tokens a worker trains on
    tokens_for_5pct = overhead / (0.05 * t_step_wall / tokens)
    return {"shape": name, "params": n, "step_s": t_step, "allreduce_n_s": t_ar2, "allreduce_n_plus_shadow_s": t_ar3,
            "step_wall_s": t_step_wall, "commit_s": t_commit, "lsh_s": t_lsh, "lsh_plan_once_s": t_plan,
            "ledger_s": t_ledger, "shadow_s": t_shadow, "overhead_s": overhead, "state_root_s": t_root,
            "state_root_sha256_s": t_root_sha256, "state_root_worker_shard_s": t_root_shard,
            "state_bytes": 8 * n, "state_root_gb_per_s": 8 * n / t_root / 1e9,
            "state_root_sha256_gb_per_s": 8 * n / t_root_sha256 / 1e9, "overhead_unbound_s": unbound,
            "overhead_unbound_ratio": unbound / t_step_wall, "state_root_ratio": t_root_shard / t_step_wall,
            "state_root_whole_ratio": t_root / t_step_wall, "state_root_sha256_ratio": t_root_sha256 / t_step_wall,
            "named_gather_before_s": t_named_before, "named_gather_s": t_named,
            "overhead_before_s": overhead_before, "overhead_before_ratio": overhead_before / t_step_wall,
            "critical_path_overhead_s": critical, "critical_path_overhead_ratio": critical / t_step_wall,
            "overhead_ratio": overhead / t_step_wall, "recompute_s": t_recompute, "k": t_recompute / t_step_wall,
            "tokens_per_worker_step": tokens, "tokens_per_worker_step_for_5pct_extrapolated": tokens_for_5pct,
            "lsh_ns_per_param": 1e9 * t_lsh / n, "lsh_before_s": t_lsh_before,
            "by_batch": [bench_batch(spec, model, samples, b, repeats, t_lsh + t_ledger + t_shadow, t_ar2, t_root_shard)
                         for b in batches]}


def compute_sha256_root(params: np.ndarray, momentum: np.ndarray) -> bytes:
    """Return the state root with v1's sha256 chunk digests (the A of the leaf-hash A/B)."""
    digests = [[hashlib.sha256(v[a:b].data.cast("B")).digest() for a, b in get_chunk_bounds(v.size)]
               for v in (params, momentum)]
    return compute_root_from_digests(1, 0, (params.size, momentum.size), digests)


def bench_batch(spec: RunSpec, model: LlamaForCausalLM, samples: np.ndarray, batch: int, repeats: int,
                fixed_overhead_s: float, allreduce_s: float, state_root_s: float) -> dict[str, Any]:
    """Return the measured step time and overhead ratio of one worker at `batch` sequences per worker-step."""
    spec = spec.model_copy(update={"batch_per_worker": batch})
    ids = get_batch_ids(spec, len(samples), 1, 0)
    windows = samples[ids]
    state = TrainState(0, get_params_vector(model), torch.zeros_like(get_params_vector(model)))

    def step() -> None:
        _, g = compute_local_gradient(model, windows)
        compute_update(state, g, 0.01, 0.9)

    t_step = timed(step, repeats) + allreduce_s
    t_commit = timed(lambda: compute_batch_root(ids, windows.tolist()), repeats)
    unbound = t_commit + fixed_overhead_s
    overhead = unbound + state_root_s
    return {"batch_per_worker": batch, "tokens_per_worker_step": batch * spec.seq_len, "step_wall_s": t_step,
            "commit_s": t_commit, "overhead_s": overhead, "overhead_ratio": overhead / t_step,
            "overhead_unbound_ratio": unbound / t_step, "state_root_ratio": state_root_s / t_step}


def bench_ledger(spec: RunSpec, state: TrainState, repeats: int) -> float:
    """Return the seconds to name positions, seal, sign and store one ledger entry."""
    account = Account.from_key(b"\x05" * 32)
    run_id = spec.run_id()
    z = state.vector()
    with tempfile.TemporaryDirectory() as tmp:
        store = LedgerStore(Path(tmp) / "l", run_id)
        head = [compute_genesis_head(run_id)]

        def write() -> None:
            step = store.get_head()[0] + 1
            pos = compute_named_positions(b"b" * 32, step, z.size, spec.named_positions)
            e = seal_entry(LedgerEntry(run_id=run_id, step=step, prev_head=head[0], positions=tuple(pos.tolist()),
                                       values=tuple(z[pos].tolist()), batch_roots=(keccak256(b"r"),) * 2,
                                       lsh=(0,) * spec.lsh_dim, replica_lsh=((0,) * spec.lsh_dim,) * 2))
            store.process_entry(e, sign_head(account, run_id, step, e.head))
            head[0] = e.head

        t = timed(write, repeats)
        store.close()
    return t


def bench_gas(windows: list[int]) -> list[dict[str, Any]]:
    """Return gas per anchor and per anchored step for several window sizes m, on anvil."""
    from chain.contracts import HubConfig
    from chain.deploy import deploy
    from chain.devnet import Anvil, dev_account
    from chain.training import TrainingContract, TrainingDeployConfig

    rows = []
    with Anvil() as node:
        w3 = node.web3()
        admin, treasury, prover = dev_account(0), dev_account(1), dev_account(3)
        hub, _ = deploy(w3, admin, HubConfig(treasury=treasury.address))
        training, _ = TrainingContract.deploy(w3, admin, TrainingDeployConfig(hub=hub.address,
                                                                             treasury=treasury.address))
        for m in windows:
            spec_hash = keccak256(b"bench-%d" % m)
            reg = training.register_run(prover, spec_hash, keccak256(b"nonce-%d" % m), b"\x01" * 32, b"\x02" * 32, 0,
                                        10**17, m, 10**18)
            run = compute_run_id(prover.address, spec_hash)
            gas = []
            for i in range(3):
                for _ in range(2):  # the window's beacon (the block after the previous anchor) must be mined
                    w3.provider.make_request("evm_mine", [])  # type: ignore[arg-type]
                gas.append(int(training.anchor(prover, run, (i + 1) * m, keccak256(b"h%d" % i))["gasUsed"]))
            rows.append({"m": m, "register_gas": int(reg["gasUsed"]), "first_anchor_gas": gas[0],
                         "later_anchor_gas": gas[2], "gas_per_step": gas[2] / m})
    return rows


def main() -> None:
    """Run the benchmark and print the table."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", default="tiny,smollm2")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batches", default="2,8,16",
                        help="sequences per worker-step at which the step (and so the overhead ratio) is measured")
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                        help="in-process timings in CPU seconds of this process (default) or wall-clock seconds")
    parser.add_argument("--gas", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args()
    CLOCK[0] = time.process_time if args.clock == "cpu" else time.perf_counter
    console = Console(width=220)
    batches = [int(b) for b in args.batches.split(",") if b]
    results = [bench_shape(s, SHAPES[s], args.repeats, batches) for s in args.shapes.split(",")]
    gas = bench_gas([1, 5, 20, 100]) if args.gas else []
    table = Table("shape", "params", "step s", "commit s", "lsh s (before)", "ledger s",
                  "state root: BLAKE3 s (GB/s)", "v1 sha256 s (GB/s)",
                  "worker's shard s",
                  "named gather s (before)",
                  "shadow s", "overhead before", "overhead after (CPU)", "after (critical path)", "recompute s", "k",
                  "tokens for 5 %")
    for r in results:
        table.add_row(r["shape"], f"{r['params']:,}", f"{r['step_wall_s']:.3f}", f"{r['commit_s']:.4f}",
                      f"{r['lsh_s']:.4f} ({r['lsh_before_s']:.4f})", f"{r['ledger_s']:.4f}",
                      f"{r['state_root_s']:.3f} ({r['state_root_gb_per_s']:.2f})",
                      f"{r['state_root_sha256_s']:.3f} ({r['state_root_sha256_gb_per_s']:.2f})",
                      f"{r['state_root_worker_shard_s']:.3f}",
                      f"{r['named_gather_s']:.5f} ({r['named_gather_before_s']:.5f})", f"{r['shadow_s']:.4f}",
                      f"{100 * r['overhead_before_ratio']:.1f} %", f"{100 * r['overhead_ratio']:.1f} %",
                      f"{100 * r['critical_path_overhead_ratio']:.1f} %", f"{r['recompute_s']:.3f}", f"{r['k']:.2f}",
                      f"{r['tokens_per_worker_step_for_5pct_extrapolated']:.0f}")
    console.print(table)
    batch_table = Table("shape", "sequences / worker-step", "tokens / worker-step", "step s (+ all-reduce)",
                        "commit s", "overhead s (CPU)", "overhead ÷ step", "unbound ÷ step", "state root ÷ step",
                        title="the overhead is per step; the step grows with the batch")
    for r in results:
        for b in r["by_batch"]:
            batch_table.add_row(r["shape"], str(b["batch_per_worker"]), str(b["tokens_per_worker_step"]),
                                f"{b['step_wall_s']:.3f}", f"{b['commit_s']:.5f}", f"{b['overhead_s']:.4f}",
                                f"{100 * b['overhead_ratio']:.1f} %", f"{100 * b['overhead_unbound_ratio']:.1f} %",
                                f"{100 * b['state_root_ratio']:.1f} %")
    console.print(batch_table)
    gas_table = Table("m", "register gas", "anchor gas", "gas per anchored step")
    for g in gas:
        gas_table.add_row(str(g["m"]), str(g["register_gas"]), str(g["later_anchor_gas"]), f"{g['gas_per_step']:.0f}")
    console.print(gas_table)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"shapes": results, "gas": gas, "clock": args.clock, "numpy": np.__version__,
                               "torch": torch.__version__},
                              indent=1))
    console.print(f"wrote {OUT}")


if __name__ == "__main__":
    main()

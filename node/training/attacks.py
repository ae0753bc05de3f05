"""Dishonest provers' audit responses (issue 17's attacks: a doctored checkpoint, a forged shadow state) and
issue 30's hidden-state cheats (a cheated Z(s) with its named positions restored, served only as "before s+1").

Only the job's cheating paths import this; the honest prover and the auditor never do.
"""

from __future__ import annotations

import numpy as np
import torch

from node.protocol.lsh import compute_named_positions
from node.training.corpus import get_batch_ids, load_corpus
from node.training.job import JobPlan, get_cheat
from node.training.model import TrainState, compute_lr, compute_update, state_from_vector
from node.training.replay import compute_replay


def compute_served_states(plan: JobPlan, step: int, prev: np.ndarray, cur: np.ndarray,
                          beacon: bytes) -> tuple[np.ndarray, np.ndarray]:
    """Return the (Z(s−1), Z(s)) a cheater serves for an audit of the step it cheated at (beacon: step s's window)."""
    spec = plan.spec
    n = prev.size // 2
    corpus = load_corpus(spec.corpus_files, spec.seq_len)
    windows = [corpus.samples[get_batch_ids(spec, len(corpus.samples), step, r)] for r in range(spec.workers)]
    prev_state = state_from_vector(step - 1, prev, n)
    replay = compute_replay(spec, prev_state, windows, step)
    kind = get_cheat(plan, step).kind
    if kind in ("doctor", "swap", "swap-stolen"):  # serve the honest successor instead of the real one
        return prev, replay.state.vector()
    if kind == "doctor-patched":  # ... and copy the ledger's values at the named positions into it
        doctored = replay.state.vector().copy()
        positions = compute_named_positions(beacon, step, cur.size, spec.named_positions)
        doctored[positions] = cur[positions]
        return prev, doctored
    if kind == "forge-shadow":  # a Z(s−1) whose honest step lands exactly on the cheated Z(s)
        cur_state = state_from_vector(step, cur, n)
        forged_momentum = (cur_state.momentum - replay.mean_grad) / spec.momentum
        forged = torch.cat([prev_state.params, forged_momentum]).numpy().astype(np.float32)
        return forged, cur
    return prev, cur


def compute_swapped_update(plan: JobPlan, state: TrainState, grad: torch.Tensor, step: int,
                           beacon: bytes) -> TrainState:
    """Return the hidden-state cheater's Z(s): the cheated update (grad = cheated ‖ declared all-reduced gradients;
    "swap-stolen": the stolen parameters) with the named positions I(s) set to the honest update's values."""
    spec, kind = plan.spec, get_cheat(plan, step).kind
    n = state.params.numel()
    lr = compute_lr(spec, step)
    honest = compute_update(state, grad[n:], lr, spec.momentum)
    if kind == "swap-stolen":
        if plan.init_vector is None:
            raise ValueError("the swap-stolen cheat needs the stolen parameters (init_vector)")
        params = torch.from_numpy(np.load(plan.init_vector).astype(np.float32))
        cheated = TrainState(step=step, params=params, momentum=honest.momentum.clone())
    else:
        cheated = compute_update(state, grad[:n], lr, spec.momentum)
    idx = torch.from_numpy(compute_named_positions(beacon, step, 2 * n, spec.named_positions).astype(np.int64))
    params, momentum = cheated.params.clone(), cheated.momentum.clone()
    in_params = idx[idx < n]
    in_momentum = idx[idx >= n] - n
    params[in_params] = honest.params[in_params]
    momentum[in_momentum] = honest.momentum[in_momentum]
    return TrainState(step=step, params=params, momentum=momentum)

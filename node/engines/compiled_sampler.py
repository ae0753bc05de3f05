"""The executer's compiled sampler for unmasked sampling (top_p = 1, no top-k): the common case.

``node.protocol.sampler.sample_position`` is the reference; ``sample_position_compiled`` returns the
same bits (tests/node/engines/test_compiled_sampler.py) and falls back to it for everything else
(greedy, masks, a walk past the leading 256 tokens, no numba). numpy's version makes about ten passes
over the vocabulary and some forty numpy calls a row; in the engine, right after a forward pass has
streamed the weights through the caches, that cost ≈ 0.5–0.9 ms a row at 49,152 tokens. Here the
exp, sums and divisions stay numpy's (a compiled exp need not round like numpy's); the order, the
exact sum Z, the weights and the walk, which are integer work or exact float64 steps and the same
on any implementation, are two compiled calls.

numba (already a vLLM dependency) compiles them on first use and caches the machine code beside this file.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from node.protocol.sampler import (
    MAX_K,
    MAX_VOCAB,
    WEIGHT_MAX,
    WEIGHT_ONE,
    PositionSample,
    SamplingParams,
    compute_probs_and_log_total,
    sample_position,
    to_float32_array,
)

_EXPONENT_SHIFT = 23  # a float32's bits >> 23: its sign and exponent (512 bins)
_LANES = 4


def _bucket_kernel(bits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # pragma: no cover - compiled
    """Return (the float64 sum, the count) of the values per sign and exponent; each sum is exact: fewer
    than 2^20 multiples of one power of two, each below 2^24 of it, in any order."""
    n = bits.size
    values = bits.view(np.float32)
    # four lanes, so that neighbouring tokens of one exponent do not wait on each other's store
    sums = np.zeros((_LANES, 512), dtype=np.float64)
    counts = np.zeros((_LANES, 512), dtype=np.int32)
    whole = n - n % _LANES
    for i in range(0, whole, _LANES):
        for lane in range(_LANES):
            e = bits[i + lane] >> _EXPONENT_SHIFT
            sums[lane, e] += np.float64(values[i + lane])
            counts[lane, e] += 1
    for i in range(whole, n):
        e = bits[i] >> _EXPONENT_SHIFT
        sums[0, e] += np.float64(values[i])
        counts[0, e] += 1
    return sums.sum(axis=0), counts.sum(axis=0).astype(np.int64)  # still exact: multiples of each bin's unit


def _leading_kernel(bits: np.ndarray, counts: np.ndarray, m: int) -> np.ndarray:  # pragma: no cover - compiled
    """Return the first min(m, n) ids by descending bits, ties lower id, given the counts per exponent."""
    n = bits.size
    need = min(m, n)
    # the least exponent whose values and all above number at least `need`: every leading id lies at or above it
    seen = 0
    low = counts.size - 1
    while low > 0:
        seen += counts[low]
        if seen >= need:
            break
        low -= 1
    if low == 0:
        seen = n
    threshold = np.uint32(low << _EXPONENT_SHIFT)
    keys = np.empty(seen, dtype=np.uint64)
    j = 0
    for i in range(n):
        b = bits[i]
        if b >= threshold:
            keys[j] = (np.uint64(np.uint32(0xFFFFFFFF) - b) << np.uint64(32)) | np.uint64(i)
            j += 1
    if seen > 2 * need:  # a crowded octave: select the leading keys before sorting them
        keys = np.partition(keys, need - 1)[:need]
    keys.sort()
    ids = np.empty(need, dtype=np.int64)
    for t in range(need):
        ids[t] = np.int64(keys[t] & np.uint64(0xFFFFFFFF))
    return ids


def _scan_kernel(bits: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # pragma: no cover
    """Return (the leading min(m, n) ids, the non-zero exact sums per exponent, the counts per exponent)."""
    sums, counts = _bucket_kernel(bits)
    return _leading_kernel(bits, counts, m), sums[sums != 0], counts


_ONE = float(WEIGHT_ONE)
_MAX = float(WEIGHT_MAX)


def _walk_kernel(probs: np.ndarray, ids: np.ndarray, total: float, v: int,
                 k: int) -> tuple[int, np.ndarray]:  # pragma: no cover - compiled
    """Return (the walk's index into ids, or -1 past them; the first k weights), as the protocol's float64 steps."""
    weights = np.zeros(k, dtype=np.uint64)
    cumulative = np.uint64(0)
    hit = -1
    for j in range(ids.size):
        w = min(np.floor(np.float64(probs[ids[j]]) * _ONE / total), _MAX)
        if j < k:
            weights[j] = np.uint64(w)
        cumulative += np.uint64(w)
        if hit < 0 and np.uint64(v) < cumulative:
            hit = j
            if j >= k - 1:
                break
    return hit, weights


def _compile() -> tuple[Any, Any, Any] | None:
    """Return the compiled (scan, leading, walk) kernels, or None without numba."""
    global _bucket_kernel, _leading_kernel
    try:
        from numba import njit
    except ImportError:  # pragma: no cover - numba is a dependency; kept usable without it
        return None
    jit = njit(cache=True, nogil=True)
    _bucket_kernel, _leading_kernel = jit(_bucket_kernel), jit(_leading_kernel)  # the scan calls them compiled
    return jit(_scan_kernel), _leading_kernel, jit(_walk_kernel)


_KERNELS = _compile()
_LEADING = 256  # as the protocol's first prefix: the walk stays within it about 24 steps in 25
_WIDER = (1024, 8192)
_SCRATCH = threading.local()


def sample_position_compiled(logits: Any, params: SamplingParams, k: int, v: int) -> PositionSample:
    """Return ``sample_position(logits, params, k, v)``, compiled where nothing is masked."""
    plain = isinstance(logits, np.ndarray) and logits.dtype == np.float32 and logits.ndim == 1
    x = logits if plain and 0 < logits.size <= MAX_VOCAB else to_float32_array(logits)
    top = x.max()  # to_float32_array's finiteness check (-inf: see _walk_row), with the max kept for the softmax
    if not _is_compiled_case(x.size, params, k, v) or not np.isfinite(top):
        return sample_position(x, params, k, v)  # the reference, with its typed errors
    probs, log_total = compute_probs_and_log_total(x, top, params.temperature)
    return _walk_row(x, top, probs, log_total, params, k, v)


def sample_positions_compiled(logits: np.ndarray, requests: Sequence[tuple[SamplingParams, int, int]]
                              ) -> list[PositionSample]:
    """Return ``sample_position_compiled`` of each row of (rows, vocab) logits with its (params, K, v).

    Rows at T = 1 with nothing masked share compute_probs_and_log_total's numpy calls (row-wise reductions,
    the same bits as one row at a time: tested); anything else goes row by row.
    """
    x = logits
    batched = _KERNELS is not None and isinstance(x, np.ndarray) and x.dtype == np.float32 and x.ndim == 2 \
        and len(requests) == x.shape[0] > 1 and 0 < x.shape[1] <= MAX_VOCAB \
        and all(p.temperature == 1.0 and _is_compiled_case(x.shape[1], p, k, v) for p, k, v in requests)
    top = x.max(axis=1) if batched else None
    if top is None or not np.isfinite(top).all():  # -inf: see _walk_row
        return [sample_position_compiled(row, p, k, v) for row, (p, k, v) in zip(x, requests, strict=True)]
    probs = np.subtract(x, top[:, None], out=_scratch(x.shape))
    np.exp(probs, out=probs)
    totals32 = probs.sum(axis=1, dtype=np.float32)
    probs /= totals32[:, None]
    return [_walk_row(x[b], top[b], probs[b], np.log(totals32[b]), p, k, v)
            for b, (p, k, v) in enumerate(requests)]


def _scratch(shape: tuple[int, ...]) -> np.ndarray:
    """Return this thread's float32 buffer of that shape (a fresh 1.5 MB array costs its page faults each step)."""
    buffer: np.ndarray | None = getattr(_SCRATCH, "buffer", None)
    if buffer is None or buffer.shape != shape:
        buffer = _SCRATCH.buffer = np.empty(shape, dtype=np.float32)
    return buffer


def _is_compiled_case(n: int, params: SamplingParams, k: int, v: int) -> bool:
    """Return whether the kernels exist and take this step: T > 0, nothing masked, K and v in range."""
    unmasked = params.temperature > 0.0 and params.top_p == 1.0 and (params.top_k == 0 or params.top_k >= n)
    return _KERNELS is not None and unmasked and 1 <= k <= min(MAX_K, n) and 0 <= v <= WEIGHT_MAX


def _walk_row(x: np.ndarray, top: Any, probs: np.ndarray, log_total: Any, params: SamplingParams, k: int,
              v: int) -> PositionSample:
    """Return the position's sample from its softmax: the compiled scan and walk, the reference past 8,192."""
    assert _KERNELS is not None
    scan, leading, walk = _KERNELS
    n = x.size
    bits = probs.view(np.uint32)
    ids, sums, counts = scan(bits, max(k, _LEADING))
    if counts[0] and not np.isfinite(x.min()):  # a zero probability: perhaps a -inf logit, which is refused
        return sample_position(x, params, k, v)
    total = math.fsum(sums.tolist())
    hit, weights = walk(probs, ids, total, v, k)
    for m in _WIDER:  # the walk goes past the leading tokens (1 step in 25): 1,024, then 8,192 of them
        if hit >= 0 or ids.size >= n:
            break
        ids = leading(bits, counts, m)
        hit, weights = walk(probs, ids, total, v, k)
    if hit < 0 and ids.size < n:  # past those too (1 step in 1,000): the reference's full order
        return sample_position(x, params, k, v)
    chosen = int(ids[hit]) if hit >= 0 else int(ids[0])  # past the whole mass the walk ran out
    candidates = ids[:k]
    return PositionSample(
        chosen=chosen,
        token_ids=tuple(candidates.tolist()),
        weights=tuple(weights.tolist()),
        raw_logprobs=tuple((x[candidates] - top - log_total).tolist()),
        chosen_raw_logprob=float(x[chosen] - top - log_total),
    )

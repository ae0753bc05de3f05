"""The canonical sampler (docs/protocol.md): distribution, integer weights, candidates and the walk.

Decisions where §2 is silent or would break its own stage-1 rules (also in docs/protocol.md):

* Sorted order is descending float32 probability softmax(logits / T) *before* masking, ties by
  lower token id; for T = 0 it is descending raw logit, ties by lower id. Masks keep prefixes of
  that order, so the K candidates are always the model's K most probable tokens.
* The top-p mass is the float32 cumulative sum (sequential, in sorted order) of the unmasked
  probabilities; if no prefix reaches top_p (float32 sums can end just below 1) nothing is cut.
* Renormalisation is done in float64 from the kept float32 probabilities, then
  ``w = min(floor(p * 2^32 / Z), 2^32 - 1)`` where Z is the float64 nearest the *exact* sum of the
  kept probabilities (since 26 Nov; before, numpy's pairwise float64 sum in sorted order, which
  depends on the order and on numpy's summation code and forced a full-vocabulary sort). A float32
  renormalisation can make the kept probabilities sum to 1 + 2^-24 and the weights to more than
  2^32, which the stage-1 rule ``W_K <= 2^32`` would reject for an honest operator. In float64, for vocabularies up to
  MAX_VOCAB, ``2^32 - n_kept - 1 < sum(w) <= 2^32`` holds, so the tail walk can only run out
  when ``v >= 2^32 - vocab_size - 1`` (see ``tail_exhaustion_floor``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from node.protocol.errors import InvalidParams, Reason

WEIGHT_ONE = 2**32
WEIGHT_MAX = 2**32 - 1
MAX_VOCAB = 2**20
MAX_K = 64
# Below this, logits / T overflows float32 for ordinary logit ranges; engines treat it as greedy.
MIN_TEMPERATURE = float(np.float32(0.001))
DEFAULT_K = 5

# sample_position's shortcuts (its results equal the full computation's):
# keys are cut to the top m by the minima of blocks this long, then what is left is sorted exactly;
_BLOCK = 64
# Weights are first computed for this many leading tokens; the walk goes past them only for large v.
_WALK_PREFIX = 256
_WALK_WIDE = 4096
# top-p is first settled on this many leading tokens, then on the whole order.
_TOP_P_PREFIXES = (256, 2048)


def float32_bits(x: float) -> int:
    """Return the IEEE-754 binary32 bit pattern of x (rounded to float32)."""
    return int(np.array([x], dtype=np.float32).view(np.uint32)[0])


def float32_from_bits(bits: int) -> float:
    """Return the float32 value whose bit pattern is bits."""
    return float(np.array([bits], dtype=np.uint32).view(np.float32)[0])


@dataclass(frozen=True)
class SamplingParams:
    """Sampling parameters as committed in the artifact header; floats are float32 values."""

    temperature: float
    top_p: float = 1.0
    top_k: int = 0  # 0 disables top-k
    max_tokens: int = 256

    def __post_init__(self) -> None:
        t = float32_from_bits(float32_bits(self.temperature))
        p = float32_from_bits(float32_bits(self.top_p))
        if not np.isfinite(t) or float32_bits(t) == 0x80000000 or not (t == 0.0 or t >= MIN_TEMPERATURE):
            raise InvalidParams(
                f"temperature must be +0 (greedy) or a finite float32 >= {MIN_TEMPERATURE}, got {self.temperature}",
                Reason.INVALID_TEMPERATURE,
            )
        if not np.isfinite(p) or not 0.0 < p <= 1.0:
            raise InvalidParams(f"top_p must be in (0, 1], got {self.top_p}", Reason.INVALID_TOP_P)
        if not _is_uint32(self.top_k):
            raise InvalidParams(f"top_k must be a uint32 (0 = off), got {self.top_k}", Reason.INVALID_TOP_K)
        if not _is_uint32(self.max_tokens):
            raise InvalidParams(f"max_tokens must be a uint32, got {self.max_tokens}", Reason.OUT_OF_RANGE)
        object.__setattr__(self, "temperature", t)
        object.__setattr__(self, "top_p", p)

    @property
    def temperature_bits(self) -> int:
        """Return temperature as float32 bits, as in the header and on chain."""
        return float32_bits(self.temperature)

    @property
    def top_p_bits(self) -> int:
        """Return top_p as float32 bits, as in the header and on chain."""
        return float32_bits(self.top_p)

    @classmethod
    def from_bits(cls, temperature_bits: int, top_p_bits: int, top_k: int, max_tokens: int) -> SamplingParams:
        """Return params from their header/on-chain encoding."""
        if not (_is_uint32(temperature_bits) and _is_uint32(top_p_bits)):
            raise InvalidParams("float32 bit patterns must be uint32", Reason.OUT_OF_RANGE)
        return cls(float32_from_bits(temperature_bits), float32_from_bits(top_p_bits), top_k, max_tokens)


@dataclass(frozen=True, eq=False)
class SamplingDistribution:
    """One step's canonical distribution: every token id in sorted order with its integer weight."""

    order: np.ndarray  # int64 token ids, canonical sorted order, length = vocab
    weights: np.ndarray  # uint64 weights aligned with order; non-increasing; sum <= 2^32
    raw_logprobs: np.ndarray  # float32 temperature-1 log-probabilities indexed by token id

    def candidates(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Return the K candidate ids and weights in canonical order."""
        return self.order[:k], self.weights[:k]


@dataclass(frozen=True)
class PositionSample:
    """What the executer records for one generated position (one artifact leaf)."""

    chosen: int
    token_ids: tuple[int, ...]
    weights: tuple[int, ...]
    raw_logprobs: tuple[float, ...]
    chosen_raw_logprob: float = 0.0  # not in the leaf (a tail token has none there); for API logprobs


def _is_uint32(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool) and 0 <= int(x) <= WEIGHT_MAX


def to_float32_array(logits: Any) -> np.ndarray:
    """Return logits (numpy array or torch tensor, one row) as a float32 numpy vector."""
    if hasattr(logits, "detach"):  # torch.Tensor without importing torch here
        logits = logits.detach().to("cpu").float().numpy()
    arr = np.asarray(logits, dtype=np.float32)
    if arr.ndim != 1:
        raise InvalidParams(f"logits must be one row, got shape {arr.shape}", Reason.OUT_OF_RANGE)
    if not 0 < arr.size <= MAX_VOCAB:
        raise InvalidParams(f"vocabulary size {arr.size} outside (0, {MAX_VOCAB}]", Reason.VOCAB_TOO_LARGE)
    if not (np.isfinite(arr.max()) and np.isfinite(arr.min())):  # NaN propagates through both
        raise InvalidParams("logits contain NaN or inf", Reason.NON_FINITE_LOGITS)
    return arr


def compute_descending_keys(values: np.ndarray) -> np.ndarray:
    """Return uint32 keys whose ascending order is descending float32 value (-0.0 equal to +0.0)."""
    v = np.asarray(values, dtype=np.float32)
    if np.signbit(v).any():  # negatives or -0.0: the general map from float order to integer order
        bits = (v + np.float32(0.0)).view(np.int32)  # -0.0 -> +0.0
        flip = np.invert(bits)
        flip >>= 31  # all ones where bits >= 0, else zero
        flip &= np.int32(0x7FFFFFFF)
        flip ^= bits  # non-negative: 0x7FFFFFFF - bits; negative: the bits unchanged
        keys: np.ndarray = flip.view(np.uint32)
        return keys
    return _probability_keys(v)


def _probability_keys(v: np.ndarray) -> np.ndarray:
    """Return compute_descending_keys for non-negative values (their bit patterns are in float order)."""
    keys: np.ndarray = np.uint32(0x7FFFFFFF) - v.view(np.uint32)
    return keys


def _argsort_keys(keys: np.ndarray) -> np.ndarray:
    """Return ids by ascending uint32 key, ties by lower id."""
    # a stable sort on the 16-bit halves (numpy radix-sorts 16-bit keys); lexsort is stable and moves
    # no keys between passes, about a quarter faster than two argsorts with gathers
    low, high = keys.astype(np.uint16), (keys >> np.uint32(16)).astype(np.uint16)
    result: np.ndarray = np.lexsort((low, high)).astype(np.int64, copy=False)
    return result


def _leading_order(keys: np.ndarray, m: int) -> np.ndarray:
    """Return the first m ids (all when m is a large share of them) of the ascending key order, ties by id."""
    n = keys.size
    if m * 8 >= n:
        return _argsort_keys(keys)
    blocks = n // _BLOCK
    if blocks >= m:  # the m-th least block minimum bounds the m-th least key: a cheap first cut
        minima = keys[: blocks * _BLOCK].reshape(blocks, _BLOCK).min(axis=1)
        ids = np.flatnonzero(keys <= np.partition(minima, m - 1)[m - 1])
    else:
        ids = np.arange(n)
    cut = keys[ids]
    kth = np.partition(cut, m - 1)[m - 1]
    below = ids[cut < kth]
    below = below[np.argsort(keys[below], kind="stable")]
    ties = ids[cut == kth][: m - below.size]  # ascending ids: ties by lower id
    result: np.ndarray = np.concatenate([below, ties]).astype(np.int64, copy=False)
    return result


def compute_descending_order(values: np.ndarray) -> np.ndarray:
    """Return token ids by descending float32 value, ties by lower id."""
    return _argsort_keys(compute_descending_keys(values))


def compute_raw_logprobs(logits: np.ndarray) -> np.ndarray:
    """Return the temperature-1 log-softmax of float32 logits, in float32."""
    z = logits - logits.max()
    out: np.ndarray = (z - np.log(np.exp(z).sum(dtype=np.float32))).astype(np.float32)
    return out


def compute_tempered_probs(logits: np.ndarray, temperature: float) -> np.ndarray:
    """Return softmax(logits / T) in float32 (T > 0)."""
    z: np.ndarray = logits / np.float32(temperature)
    if not np.isfinite(z).all():
        raise InvalidParams(f"logits / {temperature} overflow float32", Reason.NON_FINITE_LOGITS)
    z -= z.max()
    np.exp(z, out=z)
    z /= z.sum(dtype=np.float32)
    return z


def compute_kept_count(sorted_probs: np.ndarray, top_k: int, top_p: float) -> int:
    """Return how many tokens of the sorted order survive the top-k and top-p masks."""
    keep = sorted_probs.size if top_k == 0 else min(top_k, sorted_probs.size)
    if top_p < 1.0:
        reached = np.cumsum(sorted_probs, dtype=np.float32) >= np.float32(top_p)
        if reached.any():
            keep = min(keep, int(np.argmax(reached)) + 1)
    return keep


def compute_exact_sum(values: np.ndarray) -> float:
    """Return the float64 nearest the exact sum of finite float32 values (the same in any order)."""
    v = np.asarray(values, dtype=np.float32).ravel()
    if v.size > MAX_VOCAB:
        raise InvalidParams(f"{v.size} values exceed {MAX_VOCAB}", Reason.VOCAB_TOO_LARGE)
    # values sharing sign and exponent are multiples of one power of two below 2^24 of it: fewer than
    # 2^20 of them sum exactly in float64 in any order; fsum rounds the bucket sums' total once
    # (float64 weights and intp indices: bincount converts float32 weights several times slower)
    buckets = np.bincount((v.view(np.uint32) >> np.uint32(23)).astype(np.intp), weights=v.astype(np.float64))
    return math.fsum(buckets.tolist())


def compute_integer_weights(kept_probs: np.ndarray) -> np.ndarray:
    """Return w = min(floor(p * 2^32 / Z), 2^32 - 1) for the kept float32 probabilities."""
    return _scaled_weights(np.asarray(kept_probs).astype(np.float64), compute_exact_sum(kept_probs))


def _scaled_weights(p: np.ndarray, total: float) -> np.ndarray:
    """Return min(floor(p * 2^32 / total), 2^32 - 1) for float64 p (overwritten), element by element."""
    p *= float(WEIGHT_ONE)
    p /= total
    np.floor(p, out=p)
    np.minimum(p, float(WEIGHT_MAX), out=p)
    weights: np.ndarray = p.astype(np.uint64)
    return weights


def compute_sampling_distribution(logits: Any, params: SamplingParams) -> SamplingDistribution:
    """Return the canonical sorted order and integer weights for one step's logits."""
    x = to_float32_array(logits)
    weights = np.zeros(x.size, dtype=np.uint64)
    if params.temperature == 0.0:
        order = compute_descending_order(x)
        weights[0] = WEIGHT_MAX
    else:
        probs = compute_tempered_probs(x, params.temperature)
        order = compute_descending_order(probs)
        sorted_probs = probs[order]
        keep = compute_kept_count(sorted_probs, params.top_k, params.top_p)
        weights[:keep] = compute_integer_weights(sorted_probs[:keep])
    return SamplingDistribution(order, weights, compute_raw_logprobs(x))


def choose_token(v: int, candidate_ids: np.ndarray, candidate_weights: np.ndarray,
                 tail_ids: np.ndarray, tail_weights: np.ndarray) -> int:
    """Return the first token j (candidates, then tail, in sorted order) with v < W_j; else the top one."""
    ids = np.concatenate([np.asarray(candidate_ids, dtype=np.int64), np.asarray(tail_ids, dtype=np.int64)])
    cum = np.cumsum(np.concatenate([np.asarray(candidate_weights, dtype=np.uint64),
                                    np.asarray(tail_weights, dtype=np.uint64)]))
    j = int(np.searchsorted(cum, np.uint64(v), side="right"))
    return int(ids[j]) if j < ids.size else int(candidate_ids[0])


def tail_exhaustion_floor(vocab_size: int) -> int:
    """Return the least v for which an honest tail walk can run out (then the top token is chosen)."""
    return WEIGHT_ONE - vocab_size - 1


def sample_position(logits: Any, params: SamplingParams, k: int, v: int) -> PositionSample:
    """Return the chosen token and the K-candidate leaf for one step, given v_i.

    Equal, bit for bit, to walking ``compute_sampling_distribution``; it only computes what the leaf
    and the walk read: the sorted order as far as the masks and candidates need it, the weights up to
    the chosen token, raw log-probabilities of the candidates and the chosen token.
    """
    x = to_float32_array(logits)
    top = x.max()
    if params.temperature == 0.0:
        log_total = np.log(np.exp(x - top).sum(dtype=np.float32))
        _check_k_and_v(k, v, x.size)
        ids = _leading_order(compute_descending_keys(x), k)[:k]
        chosen = int(ids[0])  # the greedy weight 2^32 - 1 holds every v (v = 2^32 - 1 exhausts: the top token)
        weights = np.zeros(k, dtype=np.uint64)
        weights[0] = WEIGHT_MAX
    else:
        probs, log_total = compute_probs_and_log_total(x, top, params.temperature)
        _check_k_and_v(k, v, x.size)
        ids, weights, chosen = _walk_tempered(probs, params, k, v)
    # x[i] - top is compute_raw_logprobs's z[i], rounded the same
    return PositionSample(
        chosen=chosen,
        token_ids=tuple(int(t) for t in ids),
        weights=tuple(int(w) for w in weights),
        raw_logprobs=tuple(float(lp) for lp in x[ids] - top - log_total),
        chosen_raw_logprob=float(x[chosen] - top - log_total),
    )


def compute_probs_and_log_total(x: np.ndarray, top: np.float32, temperature: float) -> tuple[np.ndarray, np.float32]:
    """Return softmax(x / T) as compute_tempered_probs does, and the log of the T = 1 softmax's denominator."""
    if temperature == 1.0:  # x / 1 is exact: the tempered exp is the raw one, made once and in place
        probs = np.subtract(x, top)
        np.exp(probs, out=probs)
        total32 = probs.sum(dtype=np.float32)
        probs /= total32
        return probs, np.log(total32)
    return compute_tempered_probs(x, temperature), np.log(np.exp(x - top).sum(dtype=np.float32))



def _check_k_and_v(k: int, v: int, vocab_size: int) -> None:
    """Raise unless 1 <= K <= min(MAX_K, vocab) and v is a uint32."""
    if not 1 <= k <= min(MAX_K, vocab_size):
        raise InvalidParams(f"K must be in [1, min({MAX_K}, vocab)], got {k}", Reason.INVALID_K)
    if not 0 <= v <= WEIGHT_MAX:
        raise InvalidParams(f"v must be a uint32, got {v}", Reason.OUT_OF_RANGE)


def _walk_tempered(probs: np.ndarray, params: SamplingParams, k: int, v: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Return (candidate ids, candidate weights, chosen id) for tempered probabilities (T > 0)."""
    n = probs.size
    cap = n if params.top_k == 0 else min(params.top_k, n)  # compute_kept_count's top-k bound
    if params.top_p == 1.0 and cap == n:  # nothing masked: Z is every probability's, in any order
        keys = _probability_keys(probs)
        order, total = _leading_order(keys, max(k, _WALK_PREFIX)), compute_exact_sum(probs)
        head = _scaled_weights(probs[order].astype(np.float64), total)
        cumulative = np.cumsum(head)
        for m in (_WALK_WIDE, n):  # the walk goes past the head (about 1 step in 25): a longer prefix
            if v < int(cumulative[-1]) or order.size >= n:
                break
            order = _leading_order(keys, m) if m < n else _argsort_keys(keys)
            cumulative = np.cumsum(_scaled_weights(probs[order].astype(np.float64), total))
        return _finish_walk(order, head, cumulative, n, k, v)
    keys = _probability_keys(probs)
    if params.top_p == 1.0:
        order = _leading_order(keys, max(k, cap))
        sorted_probs = probs[order]
        keep = cap
    else:  # the top-p cut is usually early: settle it on growing prefixes
        for m in (*_TOP_P_PREFIXES, n):
            order = _leading_order(keys, max(k, min(cap, m)))
            sorted_probs = probs[order]
            reached = np.cumsum(sorted_probs, dtype=np.float32) >= np.float32(params.top_p)
            if reached.any():
                keep = min(cap, int(np.argmax(reached)) + 1)
                break
            if order.size >= cap:  # not reached within the top-k bound (or the whole order): top-k decides
                keep = cap
                break
    total = compute_exact_sum(sorted_probs[:keep])
    head = _scaled_weights(sorted_probs[: min(keep, max(k, _WALK_PREFIX))].astype(np.float64), total)
    cumulative = np.cumsum(head)
    if v >= int(cumulative[-1]) and head.size < keep:  # the walk goes past the head: all kept weights
        cumulative = np.cumsum(_scaled_weights(sorted_probs[:keep].astype(np.float64), total))
    return _finish_walk(order, head, cumulative, keep, k, v)


def _finish_walk(order: np.ndarray, head: np.ndarray, cumulative: np.ndarray, keep: int, k: int,
                 v: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Return (candidate ids, candidate weights, chosen id): the first j with v < W_j, else the top token."""
    j = int(np.searchsorted(cumulative, np.uint64(v), side="right"))
    weights = np.zeros(k, dtype=np.uint64)
    weights[: min(k, head.size)] = head[:k]
    chosen = int(order[j]) if j < keep else int(order[0])  # past the kept mass the walk ran out
    return order[:k], weights, chosen

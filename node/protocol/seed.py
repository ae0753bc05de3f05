"""run_seed and the counter-based per-position uniforms (docs/protocol.md)."""

from __future__ import annotations

import hashlib

import numpy as np

from node.protocol.errors import InvalidParams, Reason
from node.protocol.hashing import sha256

UINT32_MAX = 2**32 - 1
UINT64_MAX = 2**64 - 1
UINT256_MAX = 2**256 - 1


def _require_uint(value: int, bits: int, name: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**bits:
        raise InvalidParams(f"{name} must be an integer in [0, 2^{bits}), got {value!r}", Reason.OUT_OF_RANGE)


def _require_seed(seed: bytes) -> None:
    if not isinstance(seed, bytes) or len(seed) != 32:
        raise InvalidParams("run_seed must be 32 bytes", Reason.OUT_OF_RANGE)


def run_seed(user_seed: int, inference_id: int) -> bytes:
    """Return run_seed = sha256(uint64(user_seed) ‖ uint256(inference_id))."""
    _require_uint(user_seed, 64, "user_seed")
    _require_uint(inference_id, 256, "inference_id")
    return sha256(user_seed.to_bytes(8, "big") + inference_id.to_bytes(32, "big"))


def position_uniform(seed: bytes, i: int) -> int:
    """Return u_i = uint64(sha256(run_seed ‖ uint32(i))[0:8])."""
    _require_seed(seed)
    _require_uint(i, 32, "position")
    return int.from_bytes(sha256(seed + i.to_bytes(4, "big"))[:8], "big")


def sampler_uniform(u: int) -> int:
    """Return v_i = u_i >> 32, the uint32 the sampler walks with."""
    return u >> 32


def compute_sampler_uniforms(seed: bytes, count: int) -> np.ndarray:
    """Return v_0 … v_{count-1} as a uint64 array (values < 2^32)."""
    _require_uint(count, 32, "count")
    _require_seed(seed)
    prefixes = b"".join(hashlib.sha256(seed + i.to_bytes(4, "big")).digest()[:4] for i in range(count))
    return np.frombuffer(prefixes, dtype=">u4").astype(np.uint64)

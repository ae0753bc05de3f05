"""The executer's compiled interpolation for TOPLOC fingerprints: the protocol's integer steps, compiled.

``node.protocol.fingerprint.compute_interpolation`` is the reference (Newton's divided differences,
then the monomial basis, over GF(65497)); it runs ≈ 2,200 small numpy calls for a 256-token
generation's nine chunks of 128 points (≈ 3 ms). This is the same arithmetic on int64 in one compiled
loop, so its coefficients are the reference's exactly (tests/node/engines/test_compiled_fingerprint.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from node.protocol.fingerprint import PRIME, compute_interpolation, compute_inverse_table


def _interpolation_kernel(x: np.ndarray, y: np.ndarray, inv: np.ndarray) -> np.ndarray:  # pragma: no cover
    """Return ascending coefficients of each row's polynomial through (x, y) mod PRIME (x distinct mod PRIME)."""
    rows, n = x.shape
    coeffs = np.zeros((rows, n), dtype=np.int64)
    dd = np.empty(n, dtype=np.int64)
    factor = np.empty(n, dtype=np.int64)
    for r in range(rows):
        for i in range(n):
            dd[i] = y[r, i] % PRIME
        for k in range(1, n):  # divided differences of order k, in place from the top
            for i in range(n - 1, k - 1, -1):
                diff = (dd[i] - dd[i - 1]) % PRIME
                dd[i] = diff * inv[(x[r, i] - x[r, i - k]) % PRIME] % PRIME
        factor[:] = 0
        factor[0] = 1
        for i in range(n):  # coeffs += dd[i] * prod_{j<i} (X - x_j)
            for j in range(i + 1):
                coeffs[r, j] = (coeffs[r, j] + dd[i] * factor[j]) % PRIME
            xi = x[r, i] % PRIME
            for j in range(i + 1, 0, -1):
                if j < n:
                    factor[j] = (factor[j - 1] - xi * factor[j]) % PRIME
            factor[0] = (-xi * factor[0]) % PRIME
    return coeffs


def _compile() -> Any:
    try:
        from numba import njit
    except ImportError:  # pragma: no cover - numba is a dependency; kept usable without it
        return None
    return njit(cache=True, nogil=True)(_interpolation_kernel)


_KERNEL = _compile()


def compute_interpolation_compiled(xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """Return ``compute_interpolation(xs, ys)``, compiled."""
    if _KERNEL is None:
        return compute_interpolation(xs, ys)
    x = np.ascontiguousarray(xs, dtype=np.int64) % PRIME
    y = np.ascontiguousarray(ys, dtype=np.int64)
    result: np.ndarray = _KERNEL(x, y, compute_inverse_table())
    return result

"""The executer's compiled interpolation gives the protocol's coefficients exactly."""

from __future__ import annotations

import numpy as np
import pytest

from node.engines import compiled_fingerprint
from node.engines.compiled_fingerprint import compute_interpolation_compiled
from node.protocol.fingerprint import PRIME, build_fingerprint, compute_interpolation


def test_the_kernel_is_compiled():
    assert compiled_fingerprint._KERNEL is not None


@pytest.mark.parametrize("seed", range(3))
def test_equal_to_the_reference_on_random_points(seed):
    rng = np.random.default_rng(seed)
    for _ in range(15):
        rows, n = int(rng.integers(1, 10)), int(rng.integers(1, 129))
        xs = np.stack([rng.choice(PRIME, n, replace=False) for _ in range(rows)])
        xs[0, 0] = PRIME - 1  # the edge of the field
        ys = rng.integers(0, 2**16, (rows, n))  # bf16 bits, some >= PRIME
        assert np.array_equal(compute_interpolation_compiled(xs, ys), compute_interpolation(xs, ys))


def test_equal_fingerprints_on_hidden_states():
    rng = np.random.default_rng(11)
    hidden = rng.standard_normal((307, 576)).astype(np.float32) * rng.uniform(0.01, 50, 576).astype(np.float32)
    assert build_fingerprint(hidden, 51, compute_interpolation_compiled) == build_fingerprint(hidden, 51)

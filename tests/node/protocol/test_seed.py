import hashlib
import struct

import numpy as np
import pytest

from node.errors import InvalidParams, Reason
from node.protocol.seed import compute_sampler_uniforms, position_uniform, run_seed, sampler_uniform


def test_run_seed_is_sha256_of_big_endian_uint64_and_uint256():
    # Built independently with struct: uint64 BE ‖ uint256 BE (as two uint128 halves).
    packed = struct.pack(">Q", 42) + struct.pack(">QQQQ", 0, 0, 0, 7)
    assert run_seed(42, 7) == hashlib.sha256(packed).digest()
    assert len(packed) == 40


def test_run_seed_edges_and_known_value():
    assert run_seed(0, 0) == hashlib.sha256(b"\x00" * 40).digest()
    assert run_seed(2**64 - 1, 2**256 - 1) == hashlib.sha256(b"\xff" * 40).digest()


@pytest.mark.parametrize("user_seed,inference_id", [(-1, 0), (2**64, 0), (0, -1), (0, 2**256), (True, 0), (1.0, 0)])
def test_run_seed_rejects_out_of_range(user_seed, inference_id):
    with pytest.raises(InvalidParams) as err:
        run_seed(user_seed, inference_id)
    assert err.value.reason is Reason.OUT_OF_RANGE


def test_position_uniform_is_first_8_bytes_and_v_the_high_32_bits():
    seed = run_seed(42, 7)
    digest = hashlib.sha256(seed + struct.pack(">I", 3)).digest()
    u = position_uniform(seed, 3)
    assert u == struct.unpack(">Q", digest[:8])[0]
    assert sampler_uniform(u) == struct.unpack(">I", digest[:4])[0]
    assert 0 <= sampler_uniform(u) < 2**32


def test_position_uniform_is_counter_based_and_batch_matches_scalar():
    seed = run_seed(1, 2)
    batch = compute_sampler_uniforms(seed, 300)
    assert batch.dtype == np.uint64
    assert [int(x) for x in batch] == [sampler_uniform(position_uniform(seed, i)) for i in range(300)]
    assert len(set(batch.tolist())) == 300


def test_position_uniform_rejects_bad_seed_and_index():
    with pytest.raises(InvalidParams):
        position_uniform(b"short", 0)
    with pytest.raises(InvalidParams):
        position_uniform(run_seed(0, 0), 2**32)

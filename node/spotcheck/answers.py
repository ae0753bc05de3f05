"""What a challenge asks and what its answer is (pure): label indices and digest, the state's seeded LSH.

Labels are exact integers, so their answer is a sha256 over the nonce and the named blocks: one flipped
bit fails. The identifying state is a float activation that the verifier recomputes on its own engine,
so its answer is the nonce-seeded count-sketch of ``node.protocol.lsh``, quantised, compared with a
measured tolerance. Both are fixed by the nonce alone, which the pinger draws fresh per challenge.
"""

from __future__ import annotations

import hashlib
import struct

import numpy as np

from node.protocol.lsh import compute_quantised_projection
from node.spotcheck.errors import InvalidSpotParams

LABELS_DOMAIN = b"verinfer/spotcheck/labels/v1"
INDICES_DOMAIN = b"verinfer/spotcheck/indices/v1"
STATE_DOMAIN = b"verinfer/spotcheck/state/v1"
NONCE_BYTES = 32
STATE_SKETCH_DIM = 64
STATE_SCALE = 256.0
MAX_LABELS_PER_CHALLENGE = 256


def _check_nonce(nonce: bytes) -> None:
    if len(nonce) != NONCE_BYTES:
        raise InvalidSpotParams(f"nonce of {len(nonce)} bytes; {NONCE_BYTES} are needed")


def compute_challenge_indices(nonce: bytes, n_blocks: int, count: int) -> np.ndarray:
    """Return the sorted distinct block indices a labels challenge names (drawn from sha256(domain ‖ nonce))."""
    _check_nonce(nonce)
    if not 1 <= count <= MAX_LABELS_PER_CHALLENGE or n_blocks < 1:
        raise InvalidSpotParams(f"{count} labels of {n_blocks} blocks per challenge")
    digest = hashlib.sha256(INDICES_DOMAIN + nonce).digest()
    rng = np.random.Generator(np.random.PCG64(int.from_bytes(digest, "big")))
    return np.sort(rng.choice(n_blocks, size=min(count, n_blocks), replace=False)).astype(np.int64)


def compute_labels_digest(nonce: bytes, indices: np.ndarray, blocks: np.ndarray) -> str:
    """Return hex sha256(domain ‖ nonce ‖ (uint32 index ‖ block little-endian bytes) for each named index)."""
    _check_nonce(nonce)
    h = hashlib.sha256(LABELS_DOMAIN + nonce)
    for i in indices:
        h.update(struct.pack(">I", int(i)))
        h.update(np.ascontiguousarray(blocks[int(i)], dtype="<u8").tobytes())
    return h.hexdigest()


def compute_state_seed(nonce: bytes) -> bytes:
    """Return the LSH seed of a state challenge: sha256(domain ‖ nonce)."""
    _check_nonce(nonce)
    return hashlib.sha256(STATE_DOMAIN + nonce).digest()


def compute_state_answer(state: np.ndarray, nonce: bytes) -> tuple[int, ...]:
    """Return the quantised nonce-seeded sketch (STATE_SKETCH_DIM int32) of the identifying state."""
    sketch = compute_quantised_projection(np.asarray(state, dtype=np.float32), compute_state_seed(nonce),
                                          STATE_SKETCH_DIM, STATE_SCALE)
    return tuple(int(v) for v in sketch)


def compute_state_distance(claimed: tuple[int, ...], recomputed: tuple[int, ...]) -> int:
    """Return the largest coordinate gap (in quanta) between two state answers; a huge value when shapes differ."""
    if len(claimed) != len(recomputed):
        return 1 << 31
    return int(np.abs(np.asarray(claimed, dtype=np.int64) - np.asarray(recomputed, dtype=np.int64)).max(initial=0))

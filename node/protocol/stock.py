"""A stock-sampler inference's on-chain commitment (docs/protocol.md §13.1): its output, and no leaves.

An operator of a model registered with a stock sampler (sampler = "vllm-seeded") has no artifact and no
fingerprint. It commits outputHash over its tokens as every operator does, the fixed STOCK_ARTIFACT_ROOT
in place of a Merkle root, and 32 zero bytes in place of a fingerprint hash. The artifact root is a domain
tag, not zero, so that a log reader can tell a stock commitment from a mistake; no leaf hashes to it, so
proveFraud and proveTermination cannot be aimed at a stock inference.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from node.protocol.artifact import compute_output_hash
from node.protocol.hashing import keccak256

STOCK_ARTIFACT_ROOT = keccak256(b"verinfer/stock-sampler/v1")
STOCK_FINGERPRINT_HASH = bytes(32)


def compute_stock_commitment(output_ids: Sequence[int] | np.ndarray) -> tuple[bytes, bytes, bytes]:
    """Return (outputHash, artifactRoot, fingerprintHash) a stock-sampler operator commits for its tokens."""
    return compute_output_hash(output_ids), STOCK_ARTIFACT_ROOT, STOCK_FINGERPRINT_HASH


def is_stock_commitment(artifact_root: bytes, fingerprint_hash: bytes) -> bool:
    """Check whether a commitment's artifact root and fingerprint hash are the stock sampler's."""
    return artifact_root == STOCK_ARTIFACT_ROOT and fingerprint_hash == STOCK_FINGERPRINT_HASH

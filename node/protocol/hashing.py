"""Hash functions of the protocol: sha256 (seed, uniforms) and Ethereum's keccak256 (commitments)."""

from __future__ import annotations

import hashlib

import sha3  # safe-pysha3: Keccak-256 with Ethereum's padding (hashlib.sha3_256 is FIPS-202, not this)

ZERO32 = b"\x00" * 32


def sha256(data: bytes) -> bytes:
    """Return the SHA-256 digest of data."""
    return hashlib.sha256(data).digest()


def keccak256(data: bytes) -> bytes:
    """Return the Keccak-256 digest of data, as Solidity's keccak256."""
    return sha3.keccak_256(data).digest()

"""Hash functions of the protocol: sha256 (seed, uniforms) and Ethereum's keccak256 (commitments)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import sha3  # safe-pysha3: Keccak-256 with Ethereum's padding (hashlib.sha3_256 is FIPS-202, not this)

ZERO32 = b"\x00" * 32
_keccak = sha3.keccak_256


def sha256(data: bytes) -> bytes:
    """Return the SHA-256 digest of data."""
    return hashlib.sha256(data).digest()


def keccak256(data: bytes) -> bytes:
    """Return the Keccak-256 digest of data, as Solidity's keccak256."""
    digest: bytes = _keccak(data).digest()
    return digest


def keccak256_many(items: Iterable[bytes]) -> list[bytes]:
    """Return keccak256 of each item (one loop, no per-item call overhead: Merkle layers are hot)."""
    return [_keccak(x).digest() for x in items]


def double_keccak256_many(items: Iterable[bytes]) -> list[bytes]:
    """Return keccak256(keccak256(item)) of each item (OpenZeppelin leaf hashes)."""
    return [_keccak(_keccak(x).digest()).digest() for x in items]

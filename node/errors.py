"""verinfer's one exception tree.

VerinferError
├── InvalidInput          bad input: reject with a reason code, keep running
│   ├── InvalidParams
│   └── InvalidArtifact
├── RecoverableError      transient (RPC down, peer gone): retry with back-off
└── FatalError            the node must stop (DB owned by another process, deep reorg, key misuse)

Adapters translate library errors (web3, plyvel, aiohttp, libp2p) into these at their boundary.
"""

from __future__ import annotations

from node.protocol.errors import (
    InvalidArtifact,
    InvalidInput,
    InvalidParams,
    Reason,
    VerinferError,
)


class RecoverableError(VerinferError):
    """A transient failure: the same operation may succeed if retried later."""


class FatalError(VerinferError):
    """A failure after which the daemon must stop rather than risk a wrong or double signature."""


__all__ = [
    "FatalError",
    "InvalidArtifact",
    "InvalidInput",
    "InvalidParams",
    "Reason",
    "RecoverableError",
    "VerinferError",
]

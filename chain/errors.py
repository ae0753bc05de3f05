"""The chain adapter's exceptions: one root, recoverable (retry later) vs fatal (stop), with a code.

``chain`` imports nothing from ``node`` (docs/architecture.md), so it keeps its own small tree; the node
wraps these at its boundary.
"""

from __future__ import annotations


class ChainError(Exception):
    """Root of every error raised by the chain package."""

    recoverable = False
    code = "chain"


class ChainUnavailable(ChainError):
    """The RPC endpoint did not answer or answered garbage; retry later."""

    recoverable = True
    code = "rpc_unavailable"


class ContractReverted(ChainError):
    """A call or transaction reverted; ``error`` names the contract's custom error when known."""

    code = "reverted"

    def __init__(self, error: str, args: tuple[object, ...] = (), data: str = "") -> None:
        super().__init__(f"{error}{args if args else ''}")
        self.error = error
        self.args_ = args
        self.data = data


class ChainMismatch(ChainError):
    """The node is pointed at another chain or contract than its configuration says."""

    code = "chain_mismatch"


class ToolMissing(ChainError):
    """A required external tool (node, solc-js, anvil) is not installed."""

    code = "tool_missing"


class ArtifactsStale(ChainError):
    """The committed contract artifacts do not match a fresh compile of contracts/src."""

    code = "artifacts_stale"


class NoFreePort(ChainError):
    """No loopback TCP port outside the kernel's ephemeral range could be bound."""

    code = "no_free_port"

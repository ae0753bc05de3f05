"""Typed errors of the workload record; each names the object it is about (``obj``).

Bad data from a prover (a tampered tensor, a trace naming an unknown op) is ``InvalidInput``: the
verifier rejects that record and keeps running. A record directory owned by another writer is fatal
for the would-be second writer.
"""

from __future__ import annotations

from node.errors import FatalError, InvalidInput, Reason


class WorkloadError(InvalidInput):
    """A workload-record object that is malformed, inconsistent or missing."""

    def __init__(self, message: str, reason: Reason = Reason.OUT_OF_RANGE, *, obj: str = "") -> None:
        super().__init__(f"{obj}: {message}" if obj else message, reason)
        self.obj = obj


class InvalidObject(WorkloadError):
    """A device, link, trace, tensor or graph that breaks the data model's rules."""


class InvalidImport(InvalidObject):
    """A device-registry file (SLURM topology.conf / gres.conf) that does not parse; obj is ``file:line``."""


class UnknownObject(WorkloadError):
    """A reference to an object the record does not hold (device, op, tensor, graph, trace)."""


class TamperedTensor(WorkloadError):
    """A blob whose bytes no longer hash to its content address."""

    def __init__(self, message: str, *, obj: str) -> None:
        super().__init__(message, Reason.CORRUPTED_ENTRY, obj=obj)


class TruncatedBlob(WorkloadError):
    """A blob that is shorter than recorded or cannot be parsed as safetensors."""

    def __init__(self, message: str, *, obj: str) -> None:
        super().__init__(message, Reason.TRUNCATED, obj=obj)


class CorruptedEntry(WorkloadError):
    """An index entry whose checksum or structure does not verify."""

    def __init__(self, message: str, *, obj: str) -> None:
        super().__init__(message, Reason.CORRUPTED_ENTRY, obj=obj)


class RootMismatch(WorkloadError):
    """A record whose index does not hash to its committed (or the expected) root: refused as a whole."""

    def __init__(self, message: str, *, obj: str) -> None:
        super().__init__(message, Reason.CORRUPTED_ENTRY, obj=obj)


class ConflictingObject(WorkloadError):
    """An attempt to overwrite an object under an existing id with different content."""

    def __init__(self, message: str, *, obj: str) -> None:
        super().__init__(message, Reason.CORRUPTED_ENTRY, obj=obj)


class BindingError(WorkloadError):
    """Data that does not fit the graph edge it is bound to (dtype, shape, unknown edge)."""


class RecordLocked(FatalError):
    """Another process is the writer of this record."""

    def __init__(self, message: str) -> None:
        super().__init__(message, Reason.STORE_LOCKED)

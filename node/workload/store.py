"""The workload record on disk: a LevelDB index (plyvel) and content-addressed blobs beside it.

Layout of a record directory::

  index/                       LevelDB; every value is ``sha256(body) hex ‖ body`` (body = canonical JSON)
    device/<id>                Device
    link/<a|b>                 Link (unordered pair)
    tensor/<sha256>            {dtype, shape, size}: the content of one tensor blob
    ref/<trace>\\0<event>\\0<name>  TensorRef: a tensor's role and the event that emitted it
    graph/<graph id>           Graph without its MLIR text + ``mlir_sha256`` (the text is a blob)
    gwant/<pending id>         a GraphKey whose graphs are to be exported (written when first needed)
    gkey/<pending id>          {decode_graph_id, verification_graph_id}: the key resolved (written once)
    gtrace/<graph id>\\0<trace>  empty: graph → its traces (\\0 separates: ids may contain "/")
    trace/<id>                 Trace
    binding/<graph id>\\0<name>  Binding (edge → TensorRef)
    vmfb/<graph id>\\0<target>  {sha256}: an IREE module compiled from the graph (a cache)
  blobs/<ab>/<sha256>.safetensors   one tensor ("data"), addressed by its canonical digest
  blobs/<ab>/<sha256>.bin           other bytes (MLIR text, vmfb), addressed by sha256 of the bytes

One process writes (LevelDB's LOCK); readers open ``readonly=True``, which reads a private snapshot of
the index (a copy of its files) so that they never take the writer's lock. Nothing is overwritten:
an id stored again with different content raises ConflictingObject; a blob is written to a temporary
file, fsynced and renamed, and its index entry only then. Every read re-verifies checksums and
content addresses and raises a typed error that names the object.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import logging
import os
import shutil
import tempfile
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import ml_dtypes
import numpy as np
import plyvel
import safetensors
import safetensors.numpy

from node.protocol.hashing import ZERO32
from node.protocol.merkle import compute_leaf_hash, compute_merkle_root
from node.workload.bind import Binding, verify_binding
from node.workload.errors import (
    ConflictingObject,
    CorruptedEntry,
    InvalidObject,
    RecordLocked,
    RootMismatch,
    TamperedTensor,
    TruncatedBlob,
    UnknownObject,
    WorkloadError,
)
from node.workload.graph import compute_mlir_bytecode, parse_module
from node.workload.model import (
    Device,
    Graph,
    Link,
    TensorRef,
    Trace,
    compute_canonical_json,
    compute_tensor_digest,
    device_from_json,
    graph_from_json,
    link_from_json,
    tensor_ref_from_json,
    to_json,
    trace_from_json,
    verify_trace_refs,
)

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

SAFETENSORS_DTYPES = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64",
                      "int32": "I32", "int16": "I16", "int8": "I8", "uint64": "U64", "uint32": "U32",
                      "uint16": "U16", "uint8": "U8", "bool": "BOOL"}
FROM_SAFETENSORS = {v: k for k, v in SAFETENSORS_DTYPES.items()}


def get_numpy_dtype(dtype: str) -> np.dtype[Any]:
    """Return the numpy dtype for a record dtype name (bfloat16 through ml_dtypes)."""
    if dtype == "bfloat16":
        bf16: np.dtype[Any] = np.dtype(ml_dtypes.bfloat16)
        return bf16
    return np.dtype(dtype)


def to_canonical_array(array: np.ndarray[Any, Any] | torch.Tensor) -> np.ndarray[Any, Any]:
    """Return a C-contiguous little-endian numpy copy of a numpy array or torch tensor."""
    if hasattr(array, "detach"):
        import torch

        t = array.detach().to("cpu").contiguous()
        if t.dtype == torch.bfloat16:
            return np.asarray(t.view(torch.int16).numpy().view(ml_dtypes.bfloat16), order="C")
        array = t.numpy()
    arr = np.asarray(array)
    if arr.dtype.name not in SAFETENSORS_DTYPES:
        raise InvalidObject(f"unsupported dtype {arr.dtype}", obj="tensor")
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    return np.asarray(arr, order="C")  # (np.ascontiguousarray turns a 0-d array into 1-d)


def encode_safetensors(arr: np.ndarray[Any, Any], digest: str) -> bytes:
    """Return one tensor as safetensors bytes with its digest in the metadata."""
    meta = {"sha256": digest, "format": "verinfer-tensor-v1"}
    if arr.dtype.name == "bfloat16":
        import torch
        from safetensors.torch import save as save_torch

        t = torch.from_numpy(arr.view(np.int16).copy()).view(torch.bfloat16)
        return bytes(save_torch({"data": t}, metadata=meta))
    return bytes(safetensors.numpy.save({"data": arr}, metadata=meta))


class WorkloadRecord:
    """A workload record directory; one writer process, any number of snapshot readers."""

    def __init__(self, root: Path, db: Any, readonly: bool, snapshot: Path | None) -> None:
        self.root = root
        self.readonly = readonly
        self._db = db
        self._snapshot = snapshot
        self._lock = threading.RLock()
        self._buckets: list[list[bytes]] = [[] for _ in range(ROOT_BUCKETS)]  # sorted leaf hashes per bucket
        self._bucket_roots = [ZERO32] * ROOT_BUCKETS
        self._leaves = 0
        # a reader's snapshot goes when it is closed, collected, or at interpreter exit (whichever first)
        self._cleanup = weakref.finalize(self, _drop_snapshot, db, snapshot)

    @classmethod
    def open(cls, path: Path, *, readonly: bool = False, expected_root: bytes | None = None,
             reroot: bool = False) -> WorkloadRecord:
        """Open (or, for the writer, create) the record at path; its entries must hash to its committed root.

        A record whose index does not hash to the root in ``ROOT`` (or to ``expected_root``, e.g. the one
        the prover signed) raises RootMismatch. ``reroot`` (writer only) accepts the index as it is and
        commits its root: for a record written before roots, or one the prover repaired by hand.
        """
        path = Path(path)
        index = path / "index"
        if readonly:
            if not (index / "CURRENT").exists():
                raise UnknownObject("no workload record here", obj=str(path))
            remove_stale_snapshots()
            for attempt in range(SNAPSHOT_ATTEMPTS):  # a writer committing during the copy: copy again
                before = read_committed_roots(path)
                snapshot = Path(tempfile.mkdtemp(prefix=f"{SNAPSHOT_PREFIX}{os.getpid()}-"))
                try:
                    shutil.copytree(index, snapshot / "index", ignore=shutil.ignore_patterns("LOCK"))
                    db = plyvel.DB(str(snapshot / "index"), create_if_missing=False)
                except plyvel.Error as exc:
                    shutil.rmtree(snapshot, ignore_errors=True)
                    raise CorruptedEntry(f"index does not open ({exc})", obj=str(index)) from exc
                except BaseException:
                    shutil.rmtree(snapshot, ignore_errors=True)
                    raise
                rec = cls(path, db, True, snapshot)
                try:
                    rec._load_leaves()
                    committed = before | read_committed_roots(path)
                    if rec.root_hash in committed or attempt == SNAPSHOT_ATTEMPTS - 1:
                        rec._check_root(committed, expected_root)
                        return rec
                except BaseException:
                    rec.close()
                    raise
                rec.close()
        (path / "blobs").mkdir(parents=True, exist_ok=True)
        fresh = not (index / "CURRENT").exists()
        try:
            db = plyvel.DB(str(index), create_if_missing=True)
        except plyvel.IOError as exc:
            raise RecordLocked(f"{path} is being written by another process ({exc})") from exc
        except plyvel.Error as exc:
            raise CorruptedEntry(f"index does not open ({exc})", obj=str(index)) from exc
        rec = cls(path, db, False, None)
        try:
            rec._load_leaves()
            committed = read_committed_roots(path)
            if fresh or (reroot and not committed):
                rec._commit_root()  # a new record, or one recorded before roots existed (explicitly accepted)
            else:
                rec._check_root(committed, expected_root, reroot)
                if rec.root_hash not in read_committed_roots(path, pending=False):
                    rec._commit_root()  # the writer crashed after a batch, before its root: the pending root
        except BaseException:
            rec.close()
            raise
        return rec

    def close(self) -> None:
        """Close the index (and drop a reader's snapshot)."""
        with self._lock:
            self._cleanup()

    def __enter__(self) -> WorkloadRecord:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- the record root ----------------------------------------------------------------------------

    @property
    def root_hash(self) -> bytes:
        """Return the Merkle root over every rooted index entry (graphs, traces, tensor refs, devices, …)."""
        with self._lock:
            return compute_merkle_root([*self._bucket_roots, self._leaves.to_bytes(32, "big")])

    @property
    def leaf_count(self) -> int:
        """Return how many index entries the root covers."""
        return self._leaves

    def _add_leaf(self, key: str, raw: bytes) -> int:
        leaf = compute_record_leaf(key, raw)
        bucket = leaf[0] % ROOT_BUCKETS
        bisect.insort(self._buckets[bucket], leaf)
        self._leaves += 1
        return bucket

    def _load_leaves(self) -> None:
        with self._lock:
            for key, raw in self._db.iterator():
                if is_rooted(key.decode(errors="replace")):
                    self._add_leaf(key.decode(errors="replace"), raw)
            self._bucket_roots = [compute_merkle_root(b) for b in self._buckets]

    def _check_root(self, committed: set[bytes], expected_root: bytes | None, reroot: bool = False) -> None:
        root = self.root_hash
        if expected_root is not None and root != expected_root:
            raise RootMismatch(f"the record's root {root.hex()} is not the expected {expected_root.hex()}",
                               obj=str(self.root_path))
        if root not in committed and not (reroot and not self.readonly):
            raise RootMismatch(f"the index hashes to {root.hex()} over {self._leaves} entries, not to its committed "
                               f"root ({', '.join(sorted(c.hex()[:16] for c in committed)) or 'none'})",
                               obj=str(self.root_path))

    def _commit_root(self) -> None:
        """Write the current root to ROOT (temp file, fsync, rename) and drop a pending one."""
        write_root_file(self.root_path, self.root_hash, self._leaves)
        (self.root_path.parent / PENDING_ROOT).unlink(missing_ok=True)

    @property
    def root_path(self) -> Path:
        """Return the path of the committed-root file."""
        return self.root / ROOT_FILE

    # ---- index entries ----------------------------------------------------------------------------

    def _get(self, key: str) -> Any | None:
        with self._lock:
            if self._db.closed:
                raise WorkloadError("the record is closed", obj=str(self.root))
            raw = self._db.get(key.encode())
        if raw is None:
            return None
        return decode_entry(key, raw)

    def _require(self, key: str, what: str) -> Any:
        value = self._get(key)
        if value is None:
            raise UnknownObject(f"no {what} in the record", obj=display_key(key.split("/", 1)[1]))
        return value

    def _scan(self, prefix: str, after: str | None = None, limit: int | None = None) -> list[tuple[str, Any]]:
        """Return (key, value) under prefix in key order; after: exclusive start suffix; limit: at most."""
        with self._lock:
            if self._db.closed:
                raise WorkloadError("the record is closed", obj=str(self.root))
            p = prefix.encode()
            start = p if after is None else p + after.encode()
            it = self._db.iterator(start=start, stop=p + b"\xff", include_start=after is None)
            items = list(it if limit is None else (kv for kv, _ in zip(it, range(limit), strict=False)))
        return [(k.decode(), decode_entry(k.decode(), v)) for k, v in items]

    def _put_new(self, entries: dict[str, Any]) -> None:
        """Write entries in one synced batch; an existing key with other content raises ConflictingObject."""
        if self.readonly:
            raise WorkloadError("the record is open read-only", obj=str(self.root))
        with self._lock:
            fresh: dict[str, Any] = {}
            for key, value in entries.items():
                existing = self._get(key)
                if existing is None:
                    fresh[key] = value
                elif compute_canonical_json(existing) != compute_canonical_json(value):
                    raise ConflictingObject("already recorded with different content", obj=display_key(key))
            if not fresh:
                return
            encoded = {key: encode_entry(value) for key, value in fresh.items()}
            leaves = [compute_record_leaf(key, raw) for key, raw in encoded.items() if is_rooted(key)]
            dirty = {leaf[0] % ROOT_BUCKETS for leaf in leaves}
            saved = ({b: list(self._buckets[b]) for b in dirty}, list(self._bucket_roots), self._leaves)
            for leaf in leaves:
                bisect.insort(self._buckets[leaf[0] % ROOT_BUCKETS], leaf)
            self._leaves += len(leaves)
            for bucket in dirty:
                self._bucket_roots[bucket] = compute_merkle_root(self._buckets[bucket])
            try:
                if dirty:  # the root this batch will give, written before it: a crash in between is recoverable
                    write_root_file(self.root / PENDING_ROOT, self.root_hash, self._leaves)
                with self._db.write_batch(sync=True) as batch:
                    for key, raw in encoded.items():
                        batch.put(key.encode(), raw)
            except BaseException:
                for bucket, content in saved[0].items():
                    self._buckets[bucket] = content
                self._bucket_roots, self._leaves = saved[1], saved[2]
                raise
            if dirty:  # the pending root becomes the root (a rename: no second fsync per batch)
                os.replace(self.root / PENDING_ROOT, self.root_path)

    # ---- devices ---------------------------------------------------------------------------------

    def put_device(self, device: Device) -> None:
        """Register a device (identical re-registration is a no-op)."""
        self._put_new({f"device/{device.device_id}": to_json(device)})

    def get_device(self, device_id: str) -> Device:
        """Return a registered device."""
        return parse_entry(f"device/{device_id}", self._require(f"device/{device_id}", "device"), device_from_json)

    def devices(self) -> list[Device]:
        """Return every registered device."""
        return [parse_entry(k, v, device_from_json) for k, v in self._scan("device/")]

    def put_link(self, link: Link) -> None:
        """Register a link; both ends must be registered devices."""
        for end in (link.a, link.b):
            self.get_device(end)
        self._put_new({f"link/{link.link_id}": to_json(link)})

    def links(self) -> list[Link]:
        """Return every registered link."""
        return [parse_entry(k, v, link_from_json) for k, v in self._scan("link/")]

    # ---- blobs -----------------------------------------------------------------------------------

    def _blob_path(self, sha: str, suffix: str) -> Path:
        return self.root / "blobs" / sha[:2] / f"{sha}{suffix}"

    def _write_blob(self, path: Path, data: bytes) -> None:
        """Write a blob atomically (temp file, fsync, rename); an existing blob is never replaced."""
        if path.exists():
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        write_file_atomically(path, data, ".tmp-")

    def _read_blob(self, path: Path, obj: str, size: int | None) -> bytes:
        try:
            data = path.read_bytes()
        except FileNotFoundError as exc:
            raise UnknownObject("blob missing from the record", obj=obj) from exc
        if size is not None and len(data) < size:
            raise TruncatedBlob(f"blob has {len(data)} of {size} bytes", obj=obj)
        if size is not None and len(data) > size:
            raise TamperedTensor(f"blob has {len(data)} bytes, {size} recorded", obj=obj)
        return data

    def put_bytes(self, data: bytes) -> str:
        """Store opaque bytes (MLIR text, a compiled module); return their sha256."""
        if self.readonly:
            raise WorkloadError("the record is open read-only", obj=str(self.root))
        sha = hashlib.sha256(data).hexdigest()
        self._write_blob(self._blob_path(sha, ".bin"), data)
        self._put_new({f"bytes/{sha}": {"size": len(data)}})
        return sha

    def get_bytes(self, sha: str) -> bytes:
        """Return stored bytes, re-verified against their sha256."""
        meta = self._require(f"bytes/{sha}", "blob")
        data = self._read_blob(self._blob_path(sha, ".bin"), sha, int(meta["size"]))
        if hashlib.sha256(data).hexdigest() != sha:
            raise TamperedTensor("blob bytes do not hash to their address", obj=sha)
        return data

    # ---- tensors ---------------------------------------------------------------------------------

    def put_tensor(self, array: np.ndarray[Any, Any] | torch.Tensor, *, role: str, name: str,
                   event_id: str | None = None, trace_id: str | None = None) -> TensorRef:
        """Store a tensor content-addressed and record what it was; return its reference."""
        arr = to_canonical_array(array)
        dtype = arr.dtype.name
        digest = compute_tensor_digest(dtype, tuple(arr.shape), arr.tobytes())
        ref = TensorRef(digest, dtype, tuple(int(d) for d in arr.shape), role, name, event_id, trace_id)
        blob = encode_safetensors(arr, digest)
        if self.readonly:
            raise WorkloadError("the record is open read-only", obj=str(self.root))
        self._write_blob(self._blob_path(digest, ".safetensors"), blob)
        self._put_new({
            f"tensor/{digest}": {"dtype": dtype, "shape": list(ref.shape), "size": len(blob)},
            ref_key(ref): to_json(ref),
        })
        return ref

    def get_tensor_size(self, sha: str) -> int:
        """Return the recorded byte size of a tensor's blob (without reading the blob)."""
        meta = self._require(f"tensor/{sha}", "tensor")
        if not isinstance(meta.get("size"), int):
            raise CorruptedEntry("tensor entry has no size", obj=f"tensor/{sha}")
        return int(meta["size"])

    def get_tensor(self, ref_or_sha: TensorRef | str) -> np.ndarray[Any, Any]:
        """Return a tensor by reference or digest, re-verifying its digest on read."""
        sha = ref_or_sha.sha256 if isinstance(ref_or_sha, TensorRef) else ref_or_sha
        meta = self._require(f"tensor/{sha}", "tensor")
        blob = self._read_blob(self._blob_path(sha, ".safetensors"), sha, int(meta["size"]))
        try:
            items = safetensors.deserialize(blob)  # type: ignore[no-untyped-call]
        except Exception as exc:  # safetensors raises its own error type for any malformed byte
            raise TruncatedBlob(f"not a readable safetensors blob ({exc})", obj=sha) from exc
        if len(items) != 1 or items[0][0] != "data":
            raise TamperedTensor("blob does not hold exactly one tensor 'data'", obj=sha)
        info = items[0][1]
        dtype = FROM_SAFETENSORS.get(str(info["dtype"]), "?")
        shape = tuple(int(d) for d in info["shape"])
        data = bytes(info["data"])
        if compute_tensor_digest(dtype, shape, data) != sha or dtype != meta["dtype"]:
            raise TamperedTensor("tensor bytes do not hash to their address", obj=sha)
        return np.frombuffer(data, dtype=get_numpy_dtype(dtype)).reshape(shape).copy()

    def tensor_refs(self) -> list[TensorRef]:
        """Return every recorded tensor reference."""
        return [parse_entry(k, v, tensor_ref_from_json) for k, v in self._scan("ref/")]

    def tensor_refs_of_trace(self, trace_id: str, after: str | None = None,
                             limit: int | None = None) -> list[TensorRef]:
        """Return one trace's tensor references in key order (after: exclusive "event\\0name" cursor)."""
        return [parse_entry(k, v, tensor_ref_from_json) for k, v in self._scan(f"ref/{trace_id}\0", after, limit)]

    # ---- graphs ----------------------------------------------------------------------------------

    def put_graph(self, graph: Graph) -> str:
        """Record a graph (its parent and its devices must be recorded first); return its id."""
        if parse_module(graph.mlir).ops != graph.ops:
            raise InvalidObject("the op list does not match the MLIR", obj=graph.graph_id)
        if graph.parent_id is not None:
            self.get_graph_entry(graph.parent_id)
        if graph.distribution is not None:
            for device_id in graph.distribution.device_ids:
                self.get_device(device_id)
        entry = to_json(graph)
        entry["mlir_sha256"] = self.put_bytes(graph.mlir.encode())
        entry["mlir_bytecode_sha256"] = self.put_bytes(compute_mlir_bytecode(graph.mlir))
        del entry["mlir"]
        existing = self._get(f"graph/{graph.graph_id}")
        if existing is not None:
            return graph.graph_id  # same identity; the first name and attrs stay
        self._put_new({f"graph/{graph.graph_id}": entry})
        return graph.graph_id

    def get_graph_entry(self, graph_id: str) -> dict[str, Any]:
        """Return a graph's index entry (everything but the MLIR text)."""
        entry: dict[str, Any] = self._require(f"graph/{graph_id}", "graph")
        return entry

    def get_graph(self, graph_id: str) -> Graph:
        """Return a graph, re-verifying that its content still has its id."""
        entry = dict(self.get_graph_entry(graph_id))
        if not isinstance(entry.get("mlir_sha256"), str):
            raise CorruptedEntry("graph entry has no MLIR reference", obj=f"graph/{graph_id}")
        entry["mlir"] = self.get_bytes(entry.pop("mlir_sha256")).decode()
        entry.pop("mlir_bytecode_sha256", None)
        graph = parse_entry(f"graph/{graph_id}", entry, graph_from_json)
        if graph.graph_id != graph_id:
            raise CorruptedEntry("graph content does not match its id", obj=graph_id)
        if parse_module(graph.mlir).ops != graph.ops:  # the op list (not in the id) must be the MLIR's own
            raise CorruptedEntry("graph op list does not match its MLIR", obj=graph_id)
        return graph

    def graph_entries(self, after: str | None = None, limit: int | None = None) -> list[dict[str, Any]]:
        """Return graph index entries in id order (after: exclusive start id; limit: at most)."""
        return [v for _, v in self._scan("graph/", after, limit)]

    # ---- graph keys: pending exports and their resolution ------------------------------------------

    def put_graph_request(self, pending_id: str, key: dict[str, Any]) -> None:
        """Record that the graphs of a key are wanted (idempotent: the key's JSON is deterministic)."""
        self._put_new({f"gwant/{pending_id}": key})

    def graph_requests(self) -> list[tuple[str, dict[str, Any]]]:
        """Return (pending id, key JSON) of every requested graph pair, resolved or not."""
        return [(k[len("gwant/"):], v) for k, v in self._scan("gwant/")]

    def get_graph_request(self, pending_id: str) -> dict[str, Any] | None:
        """Return a requested key's JSON, or None."""
        value: dict[str, Any] | None = self._get(f"gwant/{pending_id}")
        return value

    def resolve_graph_request(self, pending_id: str, decode_graph_id: str, verification_graph_id: str) -> None:
        """Link a pending id to its exported graphs, and its traces to the verification graph (one batch)."""
        verify = self.get_graph_entry(verification_graph_id)
        self.get_graph_entry(decode_graph_id)
        if verify.get("kind") != "verification" or verify.get("parent_id") != decode_graph_id:
            raise InvalidObject("not a verification graph of that decode graph", obj=verification_graph_id)
        entries: dict[str, Any] = {f"gkey/{pending_id}": {"decode_graph_id": decode_graph_id,
                                                           "verification_graph_id": verification_graph_id}}
        for trace_id in self.trace_ids_of_graph(pending_id):
            entries[f"gtrace/{verification_graph_id}\0{trace_id}"] = {}
        self._put_new(entries)

    def get_graph_resolution(self, pending_id: str) -> dict[str, str] | None:
        """Return {decode_graph_id, verification_graph_id} of a resolved pending id, or None."""
        value = self._get(f"gkey/{pending_id}")
        if value is None:
            return None
        if not isinstance(value.get("verification_graph_id"), str) or not isinstance(value.get("decode_graph_id"), str):
            raise CorruptedEntry("graph key resolution has the wrong structure", obj=f"gkey/{pending_id}")
        return {"decode_graph_id": value["decode_graph_id"], "verification_graph_id": value["verification_graph_id"]}

    def resolve_graph_id(self, graph_id: str) -> str | None:
        """Return the recorded graph an id names: itself, the verification graph of a resolved key, or None."""
        if self._get(f"graph/{graph_id}") is not None:
            return graph_id
        resolution = self.get_graph_resolution(graph_id)
        return None if resolution is None else resolution["verification_graph_id"]

    def put_compiled(self, graph_id: str, target: str, module: bytes) -> None:
        """Cache a compiled module for a recorded graph."""
        self.get_graph_entry(graph_id)
        if self.readonly:
            raise WorkloadError("the record is open read-only", obj=str(self.root))
        sha = hashlib.sha256(module).hexdigest()
        self._write_blob(self._blob_path(sha, ".bin"), module)  # a cache: outside the record root
        self._put_new({f"vmfb/{graph_id}\0{target}": {"sha256": sha, "size": len(module)}})

    def get_compiled(self, graph_id: str, target: str) -> bytes | None:
        """Return a cached compiled module (re-verified against its sha256), or None."""
        entry = self._get(f"vmfb/{graph_id}\0{target}")
        if entry is None:
            return None
        sha = str(entry["sha256"])
        if "size" not in entry:
            return self.get_bytes(sha)
        data = self._read_blob(self._blob_path(sha, ".bin"), sha, int(entry["size"]))
        if hashlib.sha256(data).hexdigest() != sha:
            raise TamperedTensor("compiled module does not hash to its address", obj=sha)
        return data

    # ---- bindings --------------------------------------------------------------------------------

    def put_binding(self, binding: Binding) -> None:
        """Record a binding (its graph and every bound tensor must be recorded; checked against the graph)."""
        graph = self.get_graph(binding.graph_id)
        for _, ref in binding.values:
            self._require(f"tensor/{ref.sha256}", "tensor")
        verify_binding(graph, binding.as_dict())
        self._put_new({f"binding/{binding.graph_id}\0{binding.name}": to_json(binding)})

    def get_binding(self, graph_id: str, name: str) -> Binding:
        """Return a recorded binding."""
        key = f"binding/{graph_id}\0{name}"
        return parse_entry(key, self._require(key, "binding"), binding_from_json)

    def bindings_of_graph(self, graph_id: str) -> list[Binding]:
        """Return every binding recorded for a graph."""
        return [parse_entry(k, v, binding_from_json) for k, v in self._scan(f"binding/{graph_id}\0")]

    # ---- traces ----------------------------------------------------------------------------------

    def put_trace(self, trace: Trace) -> None:
        """Record a trace; every event's device must be registered, and its ops in the graph if recorded."""
        device_ids = {d.device_id for d in self.devices()}
        graph_entry = self._get(f"graph/{trace.graph_id}")
        op_ids = None if graph_entry is None else {str(op["op_id"]) for op in graph_entry["ops"]}
        verify_trace_refs(trace, device_ids, op_ids)
        self._put_new({f"trace/{trace.trace_id}": to_json(trace), f"gtrace/{trace.graph_id}\0{trace.trace_id}": {}})

    def get_trace(self, trace_id: str) -> Trace:
        """Return a recorded trace; its devices (and its graph's ops, when recorded) must exist."""
        trace = parse_entry(f"trace/{trace_id}", self._require(f"trace/{trace_id}", "trace"), trace_from_json)
        self._verify_trace(trace, {d.device_id for d in self.devices()})
        return trace

    def traces(self) -> list[Trace]:
        """Return every recorded trace (each checked as get_trace does)."""
        device_ids = {d.device_id for d in self.devices()}
        traces = [parse_entry(k, v, trace_from_json) for k, v in self._scan("trace/")]
        for trace in traces:
            self._verify_trace(trace, device_ids)
        return traces

    def _verify_trace(self, trace: Trace, device_ids: set[str]) -> None:
        graph_entry = self._get(f"graph/{trace.graph_id}")
        try:
            op_ids = None if graph_entry is None else {str(op["op_id"]) for op in graph_entry["ops"]}
            verify_trace_refs(trace, device_ids, op_ids)
        except (UnknownObject, KeyError, TypeError) as exc:
            raise CorruptedEntry(f"recorded trace is inconsistent with the record ({exc})",
                                 obj=f"trace/{trace.trace_id}") from exc

    def trace_ids(self, after: str | None = None, limit: int | None = None) -> list[str]:
        """Return trace ids in order (after: exclusive start id; limit: at most)."""
        return [k[len("trace/"):] for k, _ in self._scan("trace/", after, limit)]

    def trace_ids_of_graph(self, graph_id: str, after: str | None = None, limit: int | None = None) -> list[str]:
        """Return the ids of the traces that executed a graph (or name its pending key), in order."""
        prefix = f"gtrace/{graph_id}\0"
        return [k[len(prefix):] for k, _ in self._scan(prefix, after, limit)]


SNAPSHOT_PREFIX = "workload-snapshot-"
SNAPSHOT_ATTEMPTS = 3
ROOT_FILE = "ROOT"  # {"root": hex, "leaves": n}: the committed Merkle root of the index
PENDING_ROOT = "ROOT.pending"  # the root of the batch being written (a crash between batch and ROOT)
ROOT_BUCKETS = 256  # leaves grouped by their first byte: a write re-hashes one bucket, not the whole record
LEAF_DOMAIN = b"verinfer/workload-record/v1\0"


def is_rooted(key: str) -> bool:
    """Check whether an index key is covered by the record root (everything but the compiled-module cache)."""
    return not key.startswith("vmfb/")


def compute_record_leaf(key: str, raw: bytes) -> bytes:
    """Return the Merkle leaf of one index entry: its key and its stored checksum (which binds its body)."""
    return compute_leaf_hash(LEAF_DOMAIN + key.encode() + b"\0" + raw[:64])


def write_root_file(path: Path, root: bytes, leaves: int) -> None:
    """Write a root file atomically."""
    write_file_atomically(path, json.dumps({"root": root.hex(), "leaves": leaves}).encode(), ".tmp-root-")


def write_file_atomically(path: Path, data: bytes, prefix: str) -> None:
    """Write a file so that a reader sees the old bytes or the new, never a part (temp file, fsync, rename)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=prefix)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_committed_roots(path: Path, pending: bool = True) -> set[bytes]:
    """Return the roots a record folder commits to: ROOT's, and (pending) the one of a batch in flight."""
    roots = set()
    for name in (ROOT_FILE, PENDING_ROOT) if pending else (ROOT_FILE,):
        try:
            data = json.loads((path / name).read_text())
            root = bytes.fromhex(data["root"])
        except FileNotFoundError:
            continue
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise RootMismatch(f"unreadable root file ({exc})", obj=str(path / name)) from exc
        if len(root) != 32:
            raise RootMismatch("root file does not hold a 32-byte root", obj=str(path / name))
        roots.add(root)
    return roots


def _drop_snapshot(db: Any, snapshot: Path | None) -> None:
    """Close an index and remove a reader's snapshot folder (the finaliser of a WorkloadRecord)."""
    if not db.closed:
        db.close()
    if snapshot is not None:
        shutil.rmtree(snapshot, ignore_errors=True)


def _is_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_snapshots(directory: Path | None = None) -> int:
    """Remove reader snapshots left by processes that died without cleanup (killed); return how many."""
    base = Path(directory or tempfile.gettempdir())
    removed = 0
    try:
        candidates = list(base.glob(f"{SNAPSHOT_PREFIX}*-*"))
    except OSError:
        return 0
    for folder in candidates:
        pid_text = folder.name[len(SNAPSHOT_PREFIX):].split("-", 1)[0]
        try:
            owned = folder.is_dir() and not folder.is_symlink() and folder.stat().st_uid == os.getuid()
        except OSError:
            continue
        if owned and pid_text.isdigit() and int(pid_text) != os.getpid() and not _is_alive(int(pid_text)):
            shutil.rmtree(folder, ignore_errors=True)
            removed += 1
    return removed


def binding_from_json(d: dict[str, Any]) -> Binding:
    """Return a Binding from its JSON dict."""
    return Binding(d["graph_id"], d["name"], tuple((str(e), tensor_ref_from_json(r)) for e, r in d["values"]))


def ref_key(ref: TensorRef) -> str:
    """Return the index key of a tensor reference."""
    return f"ref/{ref.trace_id or ''}\0{ref.event_id or ''}\0{ref.name}"


def display_key(key: str) -> str:
    """Return an index key as printed in errors (the NUL separators shown as '/')."""
    return key.replace("\0", "/")


def encode_entry(value: Any) -> bytes:
    """Return an index value: hex sha256 of the canonical body, then the body."""
    body = compute_canonical_json(value)
    return hashlib.sha256(body).hexdigest().encode() + body


def decode_entry(key: str, raw: bytes) -> Any:
    """Return an index value's body, or raise CorruptedEntry naming the key."""
    check, body = raw[:64], raw[64:]
    if len(raw) < 64 or hashlib.sha256(body).hexdigest().encode() != check:
        raise CorruptedEntry("index entry fails its checksum", obj=display_key(key))
    try:
        return json.loads(body)
    except ValueError as exc:
        raise CorruptedEntry(f"index entry is not JSON ({exc})", obj=display_key(key)) from exc


T = TypeVar("T")


def parse_entry(key: str, value: Any, parse: Callable[[Any], T]) -> T:
    """Return parse(value), translating structural errors into CorruptedEntry naming the key."""
    try:
        return parse(value)
    except WorkloadError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CorruptedEntry(f"index entry has the wrong structure ({exc!r})", obj=display_key(key)) from exc


__all__ = ["WorkloadRecord"]

"""Stage 2's prefill on IREE: a validator engine whose teacher-forced prefill is its own verification graph.

``IreePrefillEngine`` wraps the validator's torch engine: generation (and everything else) is the
wrapped engine's, ``prefill`` is the verifier's own export of the model's verification graph (one per
length bucket, exported and compiled once, cached in the verifier's record) replayed with IREE on its
own weights. It returns a ``Prefill`` with the rows torch's would have (hidden rows of every fed
position, logits of every output position), so the daemon's stage 2 — fingerprints, measurements,
the model profile's thresholds and decision — runs unchanged on it.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from node.checks.stage2_record import RecordedInference
from node.engines.base import Engine, EngineInfo, Prefill
from node.workload.errors import InvalidObject
from node.workload.export import get_module_state
from node.workload.inference import CausalLmGraphExporter
from node.workload.stage2_replay import IreeRecordReplayer
from node.workload.store import WorkloadRecord


class IreePrefillEngine:
    """The validator's engine with its prefill replayed by IREE on its own verification graph (an Engine)."""

    def __init__(self, inner: Engine, model: torch.nn.Module, model_name: str, model_id_hex: str, dtype: str,
                 cache: WorkloadRecord) -> None:
        if cache.readonly:
            raise InvalidObject("the IREE prefill needs a writable cache record", obj=str(cache.root))
        self.inner = inner
        self.info = EngineInfo("iree", inner.info.model, inner.info.dtype, "cpu")
        self.vocab_size = inner.vocab_size
        exporter = CausalLmGraphExporter(lambda: copy.deepcopy(model), model_name, model_id_hex, dtype)
        self._replayer = IreeRecordReplayer(cache, get_module_state(model), cache=cache, own_graphs=exporter)
        self._lock = threading.Lock()

    def generate(self, requests: Sequence[Any]) -> list[Any]:
        """Generate with the wrapped engine."""
        return list(self.inner.generate(requests))

    def prefill(self, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> Prefill:
        """Return the teacher-forced prefill's logits (per output position) and hidden rows, computed by IREE."""
        if not output_ids:
            return self.inner.prefill(prompt_ids, output_ids)
        prompt, output = np.asarray(prompt_ids, np.int64), np.asarray(output_ids, np.int64)
        with self._lock:  # one export / compile / run at a time; modules and weights are reused
            graph, _, outputs, _, _, _ = self._replayer.run_verification(
                RecordedInference("", "", prompt, output, b""))
        names = [s.name for s in graph.outputs]
        logits, hidden = outputs[names.index("logits")], outputs[names.index("hidden")]
        p, n = prompt.size, output.size
        return Prefill(logits=np.asarray(logits[p - 1:p - 1 + n], np.float32),
                       hidden=np.asarray(hidden[:p + n - 1], np.float32))

    def __getattr__(self, name: str) -> Any:
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

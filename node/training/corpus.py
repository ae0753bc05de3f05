"""The declared corpus: the Python standard library's .py files, tokenised with SmolLM2's tokenizer.

Every machine with the same Python has these files. Files are taken in sorted relative-path order
(tests and site-packages excluded), tokenised, joined with the tokenizer's eos and cut into windows
of seq_len + 1 tokens; sample id i is window i. The data order is a permutation of the sample ids
drawn from the declared data seed, and the data root is the Merkle root over all samples in id order.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from node.protocol.ledger import InvalidTraining, TrainingReason, compute_batch_root
from node.training.spec import RunSpec

log = logging.getLogger(__name__)
TOKENIZER_MODEL = "smollm2-135m-instruct"


@dataclass(frozen=True)
class Corpus:
    """All samples of a run's corpus (int64, windows × (seq_len + 1)) and its data root."""

    samples: np.ndarray
    data_root: bytes
    files: tuple[str, ...]


def get_stdlib_files(count: int) -> list[Path]:
    """Return the first `count` stdlib .py files in sorted relative-path order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [p for p in sorted(root.rglob("*.py"))
             if not {"test", "tests", "site-packages", "idlelib", "lib2to3"} & set(p.relative_to(root).parts)]
    return files[:count]


@functools.lru_cache(maxsize=1)
def get_tokenizer() -> object:
    """Return SmolLM2's tokenizer from the model registry (materialised once)."""
    from transformers import AutoTokenizer

    from node.engines.models import get_model_spec, materialise_model

    path = materialise_model(get_model_spec(TOKENIZER_MODEL)).path
    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


@functools.lru_cache(maxsize=4)
def load_corpus(corpus_files: int, seq_len: int) -> Corpus:
    """Return the tokenised corpus windows for a file count and sequence length."""
    tok = get_tokenizer()
    files = get_stdlib_files(corpus_files)
    ids: list[int] = []
    for path in files:
        ids.extend(tok.encode(path.read_text(encoding="utf-8", errors="replace")))  # type: ignore[attr-defined]
        ids.append(int(tok.eos_token_id))  # type: ignore[attr-defined]
    width = seq_len + 1
    n = len(ids) // width
    samples = np.asarray(ids[: n * width], dtype=np.int64).reshape(n, width)
    root = compute_batch_root(list(range(n)), samples.tolist())
    log.info("corpus: %d files, %d tokens, %d samples of %d", len(files), len(ids), n, width)
    return Corpus(samples=samples, data_root=root, files=tuple(p.name for p in files))


def compute_data_order(data_seed: int, n_samples: int, needed: int) -> np.ndarray:
    """Return the declared sample order: permutations of all ids, one epoch after another, seeded by data_seed."""
    epochs = -(-needed // n_samples)
    order = []
    for epoch in range(epochs):
        digest = hashlib.sha256(b"verinfer-data-order" + data_seed.to_bytes(8, "big") + epoch.to_bytes(8, "big"))
        rng = np.random.Generator(np.random.PCG64(int.from_bytes(digest.digest(), "big")))
        order.append(rng.permutation(n_samples))
    return np.concatenate(order)[:needed].astype(np.int64)


def get_batch_ids(spec: RunSpec, n_samples: int, step: int, rank: int) -> list[int]:
    """Return the sample ids worker `rank` trains on at step t ≥ 1 under the declared order."""
    if step < 1 or not 0 <= rank < spec.workers:
        raise InvalidTraining(f"no batch for step {step}, rank {rank}", TrainingReason.DATA_UNDECLARED, step)
    order = compute_data_order(spec.data_seed, n_samples, spec.steps * spec.global_batch)
    start = (step - 1) * spec.global_batch + rank * spec.batch_per_worker
    return [int(i) for i in order[start:start + spec.batch_per_worker]]

"""A stock-sampler operator (docs/protocol.md §13.1): the engine's seeded sampler, the stock commitment, the payload.

An operator of a model registered with sampler = "vllm-seeded" runs stock vLLM. What verinfer adds beside
it is small: the request seed vLLM must use (``vllm_request_seed`` of the run seed), the commitment
(outputHash, STOCK_ARTIFACT_ROOT, zero fingerprint hash) and the payload validators fetch (the request and
the tokens). ``generate`` is the engine: ``VllmEngine.generate_stock`` for a real operator, or the numpy
reproduction of vLLM's rule over a transformers engine (tests, devnet).
"""

from __future__ import annotations

import logging
import secrets
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from node.engines.base import EngineInfo
from node.engines.models import ModelFiles
from node.engines.tokenizer import ModelTokenizer
from node.errors import InvalidInput, Reason
from node.executer.api import StockPayload
from node.executer.chain_mode import ChainGate
from node.executer.service import PayloadStore, derive_inference_id
from node.protocol.artifact import compute_output_hash
from node.protocol.sampler import SamplingParams
from node.protocol.seed import run_seed
from node.protocol.stock import STOCK_ARTIFACT_ROOT, STOCK_FINGERPRINT_HASH
from node.protocol.vllm_sampler import SAMPLER_NAME, require_known_sampler, vllm_request_seed

log = logging.getLogger(__name__)

# (prompt ids, declared params, vLLM request seed, stop ids) → the tokens the stock engine chose
StockGenerate = Callable[[Sequence[int], SamplingParams, int, frozenset[int]], Sequence[int]]


@dataclass(frozen=True)
class StockServed:
    """One stock-sampler inference as served and committed."""

    inference_id: int
    user_seed: int
    prompt_hash: bytes
    request: dict[str, Any]
    output_ids: tuple[int, ...]

    @property
    def output_hash(self) -> bytes:
        """Return outputHash of the served tokens."""
        return compute_output_hash(self.output_ids)

    @property
    def fingerprint_hash(self) -> bytes:
        """Return the stock commitment's fingerprint hash (none exists)."""
        return STOCK_FINGERPRINT_HASH


def truncate_at_stop(tokens: Sequence[int], stop_ids: frozenset[int]) -> tuple[int, ...]:
    """Return tokens up to and including the first stop token (what a stock engine with those stops returns)."""
    for i, token in enumerate(tokens):
        if token in stop_ids:
            return tuple(tokens[: i + 1])
    return tuple(tokens)


class StockService:
    """Serves a stock-sampler model: generates with the engine's seeded sampler, commits, keeps payloads."""

    recorder = None  # the workload record covers the canonical executer only

    def __init__(self, files: ModelFiles, tokenizer: ModelTokenizer, generate: StockGenerate, info: EngineInfo,
                 gate: ChainGate | None = None, keep: int = 10_000, store: PayloadStore | None = None) -> None:
        if require_known_sampler(files.spec.sampler) != SAMPLER_NAME:
            raise InvalidInput(f"{files.spec.name} is not registered for the stock sampler", Reason.UNKNOWN_SAMPLER)
        self.files = files
        self.tokenizer = tokenizer
        self.generate = generate
        self.info = info
        self.gate = gate
        self.store = store  # on a chain: every payload written here (synced) before its commit is sent
        self.keep = keep
        self._served: OrderedDict[int, StockServed] = OrderedDict()

    def infer(self, prompt_ids: Sequence[int], prompt_hash: bytes, params: SamplingParams, user_seed: int | None,
              inference_id: int | None, request: dict[str, Any]) -> StockServed:
        """Generate one inference with the request's vLLM seed, commit it (on a chain) and keep its payload."""
        if self.gate is not None:
            self.gate.authorize(inference_id, prompt_hash, user_seed, params)
        seed = secrets.randbits(64) if user_seed is None else user_seed
        iid = derive_inference_id(prompt_hash, seed, params) if inference_id is None else inference_id
        stops = frozenset(self.files.spec.stop_token_ids)
        tokens = self.generate(prompt_ids, params, vllm_request_seed(run_seed(seed, iid)), stops)
        served = StockServed(iid, seed, prompt_hash, request, truncate_at_stop(tokens, stops)[: params.max_tokens])
        if not served.output_ids:
            raise InvalidInput("the engine returned no tokens", Reason.OUTPUT_LENGTH_MISMATCH)
        if self.store is not None:  # durable first: a commit is never sent for a payload a restart would lose
            self.store.put_served(iid, self._encode_payload(served))
        if self.gate is not None:
            self.gate.commit(served, STOCK_ARTIFACT_ROOT)
        self._served.pop(iid, None)
        self._served[iid] = served
        while len(self._served) > self.keep:
            self._served.popitem(last=False)
        log.info("stock inference served", extra={"inference_id": hex(iid), "tokens": len(served.output_ids)})
        return served

    def is_stop(self, served: StockServed) -> bool:
        """Check whether a served response ended on a stop token (else it ran to max_tokens)."""
        return served.output_ids[-1] in self.files.spec.stop_token_ids

    def payload_json(self, inference_id: int) -> bytes | None:
        """Return the StockPayload validators fetch: from memory, else from disk."""
        served = self._served.get(inference_id)
        if served is not None:
            return self._encode_payload(served)
        return None if self.store is None else self.store.get_served(inference_id)

    def _encode_payload(self, served: StockServed) -> bytes:
        return StockPayload(model=self.files.spec.name, model_id="0x" + self.files.model_id.hex(),
                            inference_id=str(served.inference_id), user_seed=str(served.user_seed),
                            request=served.request, output_ids=list(served.output_ids)).model_dump_json().encode()

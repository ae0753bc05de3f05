"""The transformers backend (default): CPU or CUDA, KV-cache decode, batches with left padding.

The sampler is the protocol's canonical sampler, called once per generated position on that row's
float32 logits. Hidden states are the decoder's ``last_hidden_state`` (after the final norm); the
logits are the LM head applied to it, so both come from the same forward pass. With
``record_layers``, the outputs of those decoder layers (the residual stream, before the final norm)
are recorded too, row for row like the last hidden state (projection fingerprints, protocol v2).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import AutoModelForCausalLM

from node.engines.base import Engine, EngineInfo, FinishReason, Generation, GenerationRequest, Prefill
from node.engines.compiled_sampler import sample_positions_compiled
from node.engines.llama_prefill import compute_logits, compute_prefill_hidden, is_supported
from node.engines.models import ModelSpec
from node.errors import InvalidParams, Reason
from node.protocol.sampler import PositionSample, SamplingParams
from node.protocol.seed import compute_sampler_uniforms
from node.protocol.vllm_sampler import compute_step_seeds, sample_vllm_position

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class TransformersOptions:
    """How the backend runs: device, dtype, CPU threads, KV cache on or off."""

    device: str = "cpu"
    dtype: str = "float32"
    threads: int | None = None
    kv_cache: bool = True
    record_layers: tuple[int, ...] = ()


@dataclass
class _Row:
    request: GenerationRequest
    uniforms: np.ndarray
    samples: list[PositionSample]
    hidden: list[np.ndarray]
    finish: FinishReason | None = None
    layers: list[np.ndarray] = field(default_factory=list)  # (len(record_layers), rows, hidden) per decoder call


class TransformersEngine(Engine):
    """Engine over a transformers causal LM loaded from a safetensors folder."""

    def __init__(self, model_dir: Path, model_name: str, options: TransformersOptions | None = None) -> None:
        self.options = options or TransformersOptions()
        if self.options.threads:
            torch.set_num_threads(self.options.threads)
        self.model = AutoModelForCausalLM.from_pretrained(
            str(model_dir), dtype=DTYPES[self.options.dtype], local_files_only=True).to(self.options.device)
        self.model.eval()
        self.decoder = self.model.get_decoder()
        self.lm_head = self.model.get_output_embeddings()
        self.softcap = getattr(self.model.config, "final_logit_softcapping", None)
        self.vocab_size = int(self.model.config.vocab_size)
        # the validator's prefill through node/engines/llama_prefill.py where it is bit for bit the module's
        self.fast_prefill = is_supported(self.decoder) and isinstance(self.lm_head, torch.nn.Linear) \
            and self.lm_head.bias is None and not self.softcap
        self.info = EngineInfo("transformers", model_name, self.options.dtype, self.options.device)

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden)
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits.float()

    @contextmanager
    def _recording(self) -> Iterator[list[torch.Tensor]]:
        """Yield a list that holds, after each decoder call, the recorded layers' outputs (one per layer)."""
        captured: list[torch.Tensor] = []
        layers = self.decoder.layers
        for i in self.options.record_layers:
            if not 0 <= i < len(layers):
                raise InvalidParams(f"record layer {i} outside [0, {len(layers)})", Reason.OUT_OF_RANGE)

        def hook(_module: torch.nn.Module, _args: object, output: torch.Tensor | tuple[torch.Tensor, ...]) -> None:
            captured.append((output[0] if isinstance(output, tuple) else output).detach())

        handles = [layers[i].register_forward_hook(hook) for i in self.options.record_layers]
        try:
            yield captured
        finally:
            for h in handles:
                h.remove()

    @staticmethod
    def _stack_layers(captured: list[torch.Tensor], batch: int, start: int) -> np.ndarray:
        """Return captured layer outputs of one batch row from `start` as (layers, rows, hidden) float32."""
        return np.stack([t[batch, start:].float().cpu().numpy() for t in captured]) if captured else \
            np.zeros((0, 0, 0), dtype=np.float32)

    def _require_ids(self, ids: Sequence[int]) -> None:
        if any(not 0 <= t < self.vocab_size for t in ids):
            raise InvalidParams(f"token id outside [0, {self.vocab_size})", Reason.OUT_OF_RANGE)

    @torch.inference_mode()
    def prefill(self, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> Prefill:
        """Return logits for every output position and hidden rows from one forward pass."""
        if not prompt_ids:
            raise InvalidParams("empty prompt", Reason.OUT_OF_RANGE)
        self._require_ids([*prompt_ids, *output_ids])
        fed = list(prompt_ids) + list(output_ids[:-1])
        ids = torch.tensor([fed], device=self.options.device)
        with self._recording() as captured:
            hidden = self._prefill_hidden(ids, captured)[0]
        logits = self._prefill_logits(hidden[len(prompt_ids) - 1:]) if output_ids else \
            hidden.new_zeros((0, self.vocab_size))
        return Prefill(logits=logits.float().cpu().numpy(), hidden=hidden.float().cpu().numpy(),
                       layers=self._stack_layers(captured, 0, 0) if captured else None)

    @torch.inference_mode()
    def prefill_batch(self, items: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[Prefill]:
        """Return `prefill` of every (prompt, output) pair from one right-padded forward pass.

        Causal attention lets no row see a later one, so padding at the end changes no real row's
        inputs: each result is the one-at-a-time prefill up to the batched kernels' rounding. An engine
        that records decoder layers (projection fingerprints) runs them one at a time.
        """
        if not items:
            return []
        if self.options.record_layers:
            return [self.prefill(prompt_ids, output_ids) for prompt_ids, output_ids in items]
        fed = []
        for prompt_ids, output_ids in items:
            if not prompt_ids:
                raise InvalidParams("empty prompt", Reason.OUT_OF_RANGE)
            self._require_ids([*prompt_ids, *output_ids])
            fed.append(list(prompt_ids) + list(output_ids[:-1]))
        width = max(len(f) for f in fed)
        ids = torch.zeros((len(fed), width), dtype=torch.long, device=self.options.device)
        for b, f in enumerate(fed):
            ids[b, : len(f)] = torch.tensor(f)
        hidden = self._prefill_hidden(ids, [])
        out = []
        for b, (prompt_ids, output_ids) in enumerate(items):
            rows = hidden[b, : len(fed[b])]
            logits = self._prefill_logits(rows[len(prompt_ids) - 1:]) if output_ids else \
                rows.new_zeros((0, self.vocab_size))
            out.append(Prefill(logits=logits.float().cpu().numpy(), hidden=rows.float().cpu().numpy()))
        return out

    def _prefill_hidden(self, ids: torch.Tensor, captured: list[torch.Tensor]) -> torch.Tensor:
        """Return the last hidden state of one causal pass over `ids`; add the recorded layers to `captured`."""
        if not self.fast_prefill:
            return self.decoder(input_ids=ids, use_cache=False).last_hidden_state  # the hooks fill `captured`
        record = self.options.record_layers
        hidden, layers = compute_prefill_hidden(self.decoder, ids, tuple(sorted(set(record))))
        # as the hooks would: in layer order, once per hook on that layer
        captured.extend(t for i, t in zip(sorted(set(record)), layers, strict=True) for _ in range(record.count(i)))
        return hidden

    def _prefill_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Return `_logits(hidden)` for the prefill's response rows, bit for bit."""
        return compute_logits(hidden, self.lm_head.weight) if self.fast_prefill else self._logits(hidden)

    @torch.inference_mode()
    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """Generate every request as one left-padded batch with the canonical sampler."""
        for r in requests:
            if not r.prompt_ids:
                raise InvalidParams("empty prompt", Reason.OUT_OF_RANGE)
            if r.params.max_tokens < 1:
                raise InvalidParams("generation needs max_tokens >= 1", Reason.OUT_OF_RANGE)
            self._require_ids(r.prompt_ids)
        rows = [_Row(r, compute_sampler_uniforms(r.run_seed, r.params.max_tokens), [], []) for r in requests]
        width = max(len(r.prompt_ids) for r in requests)
        device = self.options.device
        ids = torch.zeros((len(rows), width), dtype=torch.long, device=device)
        mask = torch.zeros((len(rows), width), dtype=torch.long, device=device)
        for b, r in enumerate(requests):
            ids[b, width - len(r.prompt_ids):] = torch.tensor(r.prompt_ids)
            mask[b, width - len(r.prompt_ids):] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        with self._recording() as captured:
            out = self.decoder(input_ids=ids, attention_mask=mask, position_ids=positions,
                               use_cache=self.options.kv_cache)
            for b, r in enumerate(requests):
                rows[b].hidden.append(out.last_hidden_state[b, width - len(r.prompt_ids):].float().cpu().numpy())
                if captured:
                    rows[b].layers.append(self._stack_layers(captured, b, width - len(r.prompt_ids)))
            return self._decode(rows, ids, mask, positions, out, captured)

    def _decode(self, rows: list[_Row], ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, out: Any,
                captured: list[torch.Tensor]) -> list[Generation]:
        """Sample and feed back until every row finishes; return the generations."""
        logits = self._logits(out.last_hidden_state[:, -1])
        cache = out.past_key_values if self.options.kv_cache else None
        step = 0
        while True:
            next_ids = self._sample_step(rows, logits, step)
            if all(row.finish for row in rows):
                break
            ids = torch.cat([ids, next_ids[:, None]], dim=1)
            mask = torch.cat([mask, torch.ones_like(next_ids)[:, None]], dim=1)
            positions = torch.cat([positions, positions[:, -1:] + 1], dim=1)
            captured.clear()
            if cache is not None:
                out = self.decoder(input_ids=next_ids[:, None], attention_mask=mask, position_ids=positions[:, -1:],
                                   past_key_values=cache, use_cache=True)
                cache = out.past_key_values
            else:
                out = self.decoder(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False)
            last = out.last_hidden_state[:, -1]
            for b, row in enumerate(rows):
                if row.finish is None:
                    row.hidden.append(last[b:b + 1].float().cpu().numpy())
                    if captured:
                        row.layers.append(self._stack_layers([t[:, -1:] for t in captured], b, 0))
            logits = self._logits(last)
            step += 1
        return [self._finish(row) for row in rows]

    def _sample_step(self, rows: list[_Row], logits: torch.Tensor, step: int) -> torch.Tensor:
        """Sample position `step` of every unfinished row; return the ids to feed next."""
        next_ids = [0] * len(rows)
        cpu_logits = logits.detach().cpu().float().numpy()  # one conversion for the batch, not one a row
        active = [b for b, row in enumerate(rows) if row.finish is None]
        batch = cpu_logits if len(active) == len(rows) else cpu_logits[active]
        samples = sample_positions_compiled(batch, [(rows[b].request.params, rows[b].request.k,
                                                     int(rows[b].uniforms[step])) for b in active])
        for b, sample in zip(active, samples, strict=True):
            row, r = rows[b], rows[b].request
            row.samples.append(sample)
            next_ids[b] = sample.chosen
            if sample.chosen in r.stop_ids:
                row.finish = "stop"
            elif len(row.samples) >= r.params.max_tokens:
                row.finish = "length"
        return torch.tensor(next_ids, dtype=torch.long, device=logits.device)

    @torch.inference_mode()
    def generate_with_vllm_rule(self, prompt_ids: Sequence[int], params: SamplingParams, request_seed: int,
                                stop_ids: frozenset[int] = frozenset()) -> tuple[int, ...]:
        """Return the tokens vLLM's seeded CPU sampler picks from this engine's logits (docs/protocol.md §13),
        up to and including the first stop token: a stock-sampler operator's tokens without vLLM."""
        if not prompt_ids or params.max_tokens < 1:
            raise InvalidParams("generation needs a prompt and max_tokens >= 1", Reason.OUT_OF_RANGE)
        self._require_ids(prompt_ids)
        steps = compute_step_seeds(request_seed, params.max_tokens)
        device = self.options.device
        out = self.decoder(input_ids=torch.tensor([list(prompt_ids)], device=device), use_cache=True)
        chosen: list[int] = []
        for i in range(params.max_tokens):
            logits = self._logits(out.last_hidden_state[:, -1]).float().cpu().numpy()[0]
            token = sample_vllm_position(logits, params, int(steps[i]))
            chosen.append(token)
            if token in stop_ids or i + 1 == params.max_tokens:
                break
            out = self.decoder(input_ids=torch.tensor([[token]], device=device), past_key_values=out.past_key_values,
                               use_cache=True)
        return tuple(chosen)

    @staticmethod
    def _finish(row: _Row) -> Generation:
        assert row.finish is not None
        return Generation(
            output_ids=tuple(s.chosen for s in row.samples),
            samples=tuple(row.samples),
            hidden=np.concatenate(row.hidden, axis=0),
            finish_reason=row.finish,
            layers=np.concatenate(row.layers, axis=1) if row.layers else None,
        )


def load_projection_engine(path: Path, spec: ModelSpec) -> TransformersEngine | None:
    """Return the engine a validator recomputes kind-1 sources with (the registered dtype, recording the
    projection's decoder layers), or None where stage 2's own prefill serves (ModelSpec.needs_projection_engine)."""
    if spec.projection is None or not spec.needs_projection_engine:
        return None
    return TransformersEngine(path, spec.name,
                              TransformersOptions(dtype=spec.dtype, record_layers=spec.projection.decoder_layers()))

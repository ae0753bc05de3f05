"""The declared workload of a simulated device: inference steps of a registry llama (tiny-llama, SmolLM2-135M).

Step s feeds the sliding window tokens[s : s+T] and keeps the final-norm hidden states of that window
(T × hidden float32) as the device's identifying state; a token sampled from the last position is appended
(greedy decoding of a random model falls into a one-token loop, and a constant state would make a stale copy
indistinguishable). The tokens are recorded, so a verifier re-executes any step from them. A step is a
decode step without a KV cache (the window is recomputed), so the verifier's replay runs the very same
computation and is bit-identical; a cached decode would need a calibrated tolerance instead.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from node.engines.hf_convert import compute_state_dict_sha256
from node.engines.models import get_model_spec, materialise_model
from node.spotcheck.errors import InvalidSpotParams

MODEL_NAME = "tiny-llama"
SMOL_NAME = "smollm2-135m-instruct"


def build_model(name: str = MODEL_NAME) -> LlamaForCausalLM:
    """Return a registry llama in float32: tiny-llama built from its config and seed, others from the model cache."""
    spec = get_model_spec(name)
    if spec.source != "tiny-random":
        files = materialise_model(spec)  # the same folder node.engines serves and node.calibrate loads
        loaded = LlamaForCausalLM.from_pretrained(str(files.path), dtype=torch.float32, local_files_only=True)
        if not isinstance(loaded, LlamaForCausalLM):
            raise InvalidSpotParams(f"{name} is not a llama-architecture model")
        loaded.eval()  # type: ignore[no-untyped-call]
        return loaded
    options: dict[str, Any] = dict(spec.config)
    config = LlamaConfig(vocab_size=spec.vocab_size, tie_word_embeddings=True, **options)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)  # the seed is the model's identity, as in node.engines.hf_convert
        model = LlamaForCausalLM(config)  # float32, torch's default dtype
    model.eval()  # type: ignore[no-untyped-call]
    return model


def get_weights_digest(model: LlamaForCausalLM) -> str:
    """Return the hex sha256 of the model's weights (what the record names the workload's model by)."""
    return compute_state_dict_sha256(model).hex()


def compute_state(model: LlamaForCausalLM, context: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return (final-norm hidden states of the context, T × hidden float32, and the last position's logits)."""
    with torch.inference_mode():
        ids = torch.as_tensor(np.asarray(context, dtype=np.int64))[None]
        hidden = model.model(input_ids=ids).last_hidden_state
        logits = model.lm_head(hidden[:, -1])
    return hidden[0].numpy().astype(np.float32, copy=True), logits[0].numpy().astype(np.float64)


def compute_sampled_token(logits: np.ndarray, sampling_seed: int, step: int) -> int:
    """Return the token sampled from softmax(logits) with a generator seeded by (seed, step): replayable per step.

    Greedy decoding of a random model repeats one token; a per-step seed lets a verifier check any one step's
    token from that step alone (a step recorded but never computed carries a token the logits do not give).
    """
    p = np.exp(logits - logits.max())
    return int(np.random.default_rng((sampling_seed, step)).choice(len(p), p=p / p.sum()))


def compute_prompt(seed: int, tokens: int, vocab_size: int) -> np.ndarray:
    """Return the device's prompt: `tokens` ids drawn from a numpy generator with the given seed."""
    return np.random.default_rng(seed).integers(0, vocab_size, size=tokens).astype(np.int64)


class InferenceWorkload:
    """Sliding-window sampled decoding; `step` returns the new identifying state (the tokens are recorded)."""

    def __init__(self, model: LlamaForCausalLM, prompt: np.ndarray, sampling_seed: int) -> None:
        self.model = model
        self.sampling_seed = sampling_seed
        self.window = len(prompt)
        self.tokens: list[int] = [int(t) for t in prompt]
        self.steps = 0

    def step(self) -> tuple[int, np.ndarray]:
        """Run one step; return (its index, the state)."""
        s = self.steps
        state, logits = compute_state(self.model, np.asarray(self.tokens[s:s + self.window]))
        self.tokens.append(compute_sampled_token(logits, self.sampling_seed, s))
        self.steps += 1
        return s, state

    def fabricate_step(self, rng: np.random.Generator) -> int:
        """The fabricate cheat: record a step without computing it (a random token); return its index."""
        s = self.steps
        self.tokens.append(int(rng.integers(0, int(self.model.config.vocab_size))))
        self.steps += 1
        return s

    def compute_state_of(self, step: int) -> np.ndarray:
        """Return the state of a step already recorded, computed now (the fabricate cheat's on-demand answer)."""
        state, _ = compute_state(self.model, np.asarray(self.tokens[step:step + self.window]))
        return state


class WorkloadReplayer:
    """Re-execute steps of a recorded run from its tokens (the verifier's side), caching states."""

    def __init__(self, model: LlamaForCausalLM, tokens: np.ndarray, window: int, sampling_seed: int = 0) -> None:
        self.model = model
        self.tokens = np.asarray(tokens, dtype=np.int64)
        self.window = window
        self.sampling_seed = sampling_seed
        self._cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def _replay(self, step: int) -> tuple[np.ndarray, np.ndarray] | None:
        if step not in self._cache:
            context = self.tokens[step:step + self.window]
            if step < 0 or len(context) != self.window:
                return None
            self._cache[step] = compute_state(self.model, context)
        return self._cache[step]

    def recompute_state(self, step: int) -> np.ndarray | None:
        """Return the state of step `step`, re-executed from tokens[step : step+window] (None past the tokens)."""
        replayed = self._replay(step)
        return None if replayed is None else replayed[0]

    def check_token(self, step: int) -> bool | None:
        """Check that step `step`'s recorded token is the one its replayed logits give (None: nothing to check)."""
        replayed = self._replay(step)
        if replayed is None or step + self.window >= len(self.tokens):
            return None
        return compute_sampled_token(replayed[1], self.sampling_seed, step) == int(self.tokens[step + self.window])

"""The model's own tokenizer and chat template: how a request becomes prompt token ids.

Executer and validator both tokenise the request with this, so an injected system prompt shows up
as different prompt ids (stage 1's PROMPT_MISMATCH).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

from node.errors import InvalidInput, Reason


class PromptError(InvalidInput):
    """A request that cannot be turned into prompt ids for this model."""


class ModelTokenizer:
    """Encode chat messages or completion text, decode ids, and know the stop tokens."""

    def __init__(self, model_dir: Path, chat: bool, eos_ids: Sequence[int] = ()) -> None:
        self.hf = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
        self.chat = chat
        stops = set(eos_ids)
        if self.hf.eos_token_id is not None:
            stops.add(int(self.hf.eos_token_id))
        self.stop_ids = frozenset(stops)

    def encode_chat(self, messages: Sequence[dict[str, Any]]) -> tuple[int, ...]:
        """Return the prompt ids of chat messages with the model's chat template."""
        if not self.chat or not self.hf.chat_template:
            raise PromptError("this model has no chat template: use /v1/completions", Reason.PROMPT_MISMATCH)
        if not messages:
            raise PromptError("messages must not be empty", Reason.PROMPT_MISMATCH)
        try:
            encoded = self.hf.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True)
        except Exception as exc:  # a template may refuse messages (jinja raise_exception): a bad request, typed
            raise PromptError(f"the chat template refused these messages: {exc}", Reason.PROMPT_MISMATCH) from exc
        ids = encoded["input_ids"] if isinstance(encoded, dict) or hasattr(encoded, "keys") else encoded
        return tuple(int(t) for t in ids)

    def encode_text(self, text: str) -> tuple[int, ...]:
        """Return the prompt ids of completion text (with the model's BOS if it uses one)."""
        ids = tuple(int(t) for t in self.hf(text)["input_ids"])
        if not ids:
            raise PromptError("prompt encodes to no tokens", Reason.PROMPT_MISMATCH)
        return ids

    def encode_response(self, text: str) -> tuple[int, ...]:
        """Return the ids of a complete assistant response: its text, then the model's stop token."""
        ids = [int(t) for t in self.hf(text, add_special_tokens=False)["input_ids"]]
        if self.hf.eos_token_id is not None:
            ids.append(int(self.hf.eos_token_id))
        return tuple(ids)

    def decode(self, ids: Sequence[int]) -> str:
        """Return the text of output ids, without special tokens."""
        return str(self.hf.decode(list(ids), skip_special_tokens=True))

    def token_text(self, token_id: int) -> str:
        """Return one token's text as OpenAI logprobs show it."""
        return str(self.hf.decode([token_id]))

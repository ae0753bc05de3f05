"""Prompt binding (docs/protocol.md): promptHash as the requester computes it, and outputHash's input.

promptHash = sha256(canonical JSON of {"model": "0x<model id>", "messages": [...]} or
{"model": …, "prompt": "<text>"}), keys sorted, no insignificant whitespace, UTF-8 (not ASCII-escaped).
Messages keep only "role" and "content" (strings); anything else a client sends is not bound.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from node.protocol.errors import InvalidParams, Reason
from node.protocol.hashing import sha256


def canonical_json(value: Any) -> bytes:
    """Return value as canonical JSON bytes: sorted keys, compact separators, UTF-8."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


def normalise_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    """Return messages reduced to their bound fields, or raise InvalidParams."""
    out = []
    for m in messages:
        role, content = m.get("role"), m.get("content")
        if not isinstance(role, str) or not isinstance(content, str):
            raise InvalidParams("each message needs string 'role' and 'content'", Reason.OUT_OF_RANGE)
        out.append({"role": role, "content": content})
    return out


def compute_prompt_hash(model_id: bytes, messages: Sequence[Mapping[str, Any]] | None = None,
                        prompt: str | None = None) -> bytes:
    """Return promptHash for chat messages or completion text under a model id."""
    if (messages is None) == (prompt is None):
        raise InvalidParams("exactly one of messages or prompt", Reason.OUT_OF_RANGE)
    body: dict[str, Any] = {"model": "0x" + model_id.hex()}
    if messages is not None:
        body["messages"] = normalise_messages(messages)
    else:
        body["prompt"] = prompt
    return sha256(canonical_json(body))

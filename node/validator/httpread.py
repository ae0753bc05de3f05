"""Read an HTTP response body whole, up to a cap (aiohttp's `content.read(n)` returns what is buffered, not n bytes)."""

from __future__ import annotations

import aiohttp


class BodyTooLarge(ValueError):
    """A peer sent more than the cap allows."""


async def read_capped(response: aiohttp.ClientResponse, cap: int) -> bytes:
    """Return the whole body of `response`; BodyTooLarge as soon as it exceeds `cap` bytes."""
    chunks: list[bytes] = []
    total = 0
    async for chunk in response.content.iter_chunked(1 << 16):
        total += len(chunk)
        if total > cap:
            raise BodyTooLarge(f"body exceeds {cap} bytes")
        chunks.append(chunk)
    return b"".join(chunks)

"""read_capped: the whole body of a streamed response, or a typed error past the cap."""

from __future__ import annotations

import asyncio
import os

import aiohttp
import pytest
from aiohttp import web

from node.validator.httpread import BodyTooLarge, read_capped
from tests.node.validator.harness import free_port

BODY = os.urandom(3 * 2**20 + 17)


async def _with_server(cap: int) -> bytes:
    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        for i in range(0, len(BODY), 50_000):  # in pieces, with pauses: the client sees partial buffers
            await response.write(BODY[i:i + 50_000])
            await asyncio.sleep(0)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/", stream)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/") as response:
            return await read_capped(response, cap)
    finally:
        await runner.cleanup()


def test_a_streamed_body_is_read_whole() -> None:
    assert asyncio.run(_with_server(len(BODY))) == BODY


def test_a_body_past_the_cap_is_a_typed_error() -> None:
    with pytest.raises(BodyTooLarge):
        asyncio.run(_with_server(len(BODY) - 1))

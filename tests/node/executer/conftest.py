"""A real executer HTTP server on 127.0.0.1 in a background thread, per model."""

import asyncio
import socket
import threading
from collections.abc import Iterator

import openai
import pytest
from aiohttp import web

from node.executer.server import create_app
from node.executer.service import ExecuterService
from node.profiles import load_profile


class RunningServer:
    def __init__(self, service: ExecuterService, app: web.Application | None = None) -> None:
        if app is None:
            path, profile = load_profile(service.files.spec)
            app = create_app(service, str(path), profile.meta.calibrated)
        self.app = app
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.loop = asyncio.new_event_loop()
        self.started = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.runner = web.AppRunner(self.app)
        self.loop.run_until_complete(self.runner.setup())
        self.loop.run_until_complete(web.TCPSite(self.runner, "127.0.0.1", self.port).start())
        self.started.set()
        self.loop.run_forever()
        self.loop.run_until_complete(self.runner.cleanup())

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0, timeout=120)

    def __enter__(self) -> "RunningServer":
        self.thread.start()
        assert self.started.wait(30)
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)


def serve(model) -> Iterator[RunningServer]:
    _, profile = load_profile(model.files.spec)
    service = ExecuterService(model.files, model.tokenizer, model.engine, profile.fingerprint_thresholds())
    with RunningServer(service) as server:
        yield server


@pytest.fixture(scope="module")
def tiny_server(tiny) -> Iterator[RunningServer]:
    yield from serve(tiny)


@pytest.fixture(scope="module")
def smol_server(smol) -> Iterator[RunningServer]:
    yield from serve(smol)

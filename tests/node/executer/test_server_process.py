"""Issue 31, finding 2: requests that stopped the executer, sent to the real `verinfer executer serve` process.

A 7 MB prompt (under the 8 MiB body cap) grew the process to 20.9 GB until the kernel killed it, and a
body of 100,000 nested `[` crashed it in JSON parsing. Both must be refused with a typed 4xx before any
work, and the process must go on serving; so must a burst of many concurrent clients.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from chain.devnet import find_free_port, stop_process_group

MODEL = "tiny-llama"  # max_position_embeddings 2048
CLIENTS = 40
KEYS = [f"client-key-{i}" for i in range(CLIENTS)]
REPO = Path(__file__).resolve().parents[3]


class ServerProcess:
    """`verinfer executer serve` in its own process group."""

    def __init__(self, tmp_path: Path) -> None:
        self.port = find_free_port()
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
               "VERINFER_API_KEYS": ",".join(KEYS), "VERINFER_API_MAX_QUEUE": "32",
               "VERINFER_API_MAX_CONCURRENT_PER_CLIENT": "4"}
        self.log = tmp_path / "executer.log"
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "node.cli", "executer", "serve", "--model", MODEL, "--port", str(self.port),
                 "--threads", "1"], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                cwd=REPO, start_new_session=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def wait_ready(self, timeout: float = 180.0) -> None:
        import urllib.request

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.alive, self.log.read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(0.3)
        raise AssertionError(f"executer not ready:\n{self.log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = ServerProcess(tmp_path_factory.mktemp("executer"))
    try:
        process.wait_ready()
        yield process
    finally:
        stop_process_group(process.process, 10.0)


def encode(body: dict) -> bytes:
    return json.dumps(body).encode()


def chat_body(content: str, max_tokens: int = 4) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, "seed": 1}


ATTACKS: dict[str, tuple[bytes, str]] = {
    # the review's two requests: a 7 MB prompt, and 100,000 nested `[` (with their closing brackets)
    "seven-megabyte-prompt": (encode(chat_body("hello " * (7 * 10**6 // 6))),
                              "context_length_exceeded"),
    "nested-brackets": (b'{"model": "tiny-llama", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
                        "json_too_deep"),
    # a prompt only just over the context (2048 tokens): refused after tokenising, before the engine
    "just-over-the-context": (encode(chat_body("hello " * 2100)), "context_length_exceeded"),
}


async def post(session: aiohttp.ClientSession, url: str, body: bytes, key: str) -> tuple[int, dict, dict]:
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    async with session.post(f"{url}/v1/chat/completions", data=body, headers=headers) as response:
        return response.status, await response.json(), dict(response.headers)


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_an_oversized_prompt_or_a_deep_body_is_a_typed_4xx_and_the_process_serves_on(server, attack) -> None:
    body, code = ATTACKS[attack]
    assert len(body) < 8 * 2**20  # under the body cap: it reaches the handler

    async def scenario() -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
            started = time.monotonic()
            status, answer, _ = await post(session, server.url, body, KEYS[0])
            assert (status, answer["error"]["code"]) == (400, code), (status, answer)
            assert time.monotonic() - started < 30  # refused before any work on the engine
            assert server.alive, server.log.read_text()[-3000:]
            ok = encode(chat_body("Say hello."))
            status, answer, _ = await post(session, server.url, ok, KEYS[1])
            assert status == 200 and answer["choices"][0]["message"]["verification_proofs"], answer

    asyncio.run(scenario())
    assert server.rss_bytes() < 3 * 2**30, server.rss_bytes()


def test_a_burst_of_many_clients_with_attacks_among_them_is_answered_and_leaves_the_process_serving(server) -> None:
    """200 requests from 40 clients at once (each with its own key), the attacks mixed in: every answer is a 200
    or a typed refusal (429/503 with Retry-After, 400 for the attacks), and the process serves afterwards."""
    ok = encode(chat_body("Count to three."))
    jobs = [(KEYS[i % CLIENTS], ok, None) for i in range(200)]
    for i, (body, code) in enumerate(ATTACKS.values()):
        jobs.insert(50 * (i + 1), (KEYS[i], body, code))

    async def scenario() -> Counter[int]:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300),
                                         connector=aiohttp.TCPConnector(limit=0)) as session:
            answers = await asyncio.gather(*(post(session, server.url, body, key) for key, body, _ in jobs))
        statuses: Counter[int] = Counter()
        for (_, _, code), (status, answer, headers) in zip(jobs, answers, strict=True):
            statuses[status] += 1
            if code is not None and status == 400:  # an attack the door let in: refused by the handler
                assert answer["error"]["code"] == code, answer
            elif status != 200 or code is not None:  # or refused at the door, before its body is read
                assert status in (429, 503) and "Retry-After" in headers, (status, answer)
                assert answer["error"]["code"] in ("rate_limit_exceeded", "queue_full", "queue_timeout"), answer
        return statuses

    statuses = asyncio.run(scenario())
    assert statuses[200] >= 32, statuses  # at least a full queue's worth served
    assert sum(statuses.values()) == len(jobs) and not set(statuses) - {200, 400, 429, 503}, statuses
    assert server.alive, server.log.read_text()[-3000:]

    async def after() -> None:
        async with aiohttp.ClientSession() as session:
            status, answer, _ = await post(session, server.url, ok, KEYS[5])
            assert status == 200, answer

    asyncio.run(after())
    assert server.rss_bytes() < 3 * 2**30, server.rss_bytes()


def test_the_completions_route_bounds_the_prompt_too(server) -> None:
    async def scenario() -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
            for prompt in ("hello " * (7 * 10**6 // 6), "hello " * 2100):
                body = encode({"model": MODEL, "prompt": prompt, "max_tokens": 4})
                headers = {"Authorization": f"Bearer {KEYS[2]}", "Content-Type": "application/json"}
                async with session.post(f"{server.url}/v1/completions", data=body, headers=headers) as response:
                    answer = await response.json()
                assert (response.status, answer["error"]["code"], answer["error"]["param"]) == (
                    400, "context_length_exceeded", "prompt"), answer
            assert server.alive

    asyncio.run(scenario())

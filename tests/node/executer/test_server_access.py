"""The executer API's door (issue 15, finding 10): bearer keys, a per-client limit and a bounded queue.

Each test runs the real aiohttp app with the tiny model and performs the attack: calls without a key,
one client flooding the engine, a flood that fills the queue, clients that leave while queued. The
test holds the engine lock itself to keep requests queued, so nothing here waits on a sleep except the
queue timeout it measures.
"""

import asyncio
import hashlib
import threading
import time

import aiohttp
import openai
import pytest
from aiohttp import web

from node.executer.server import LOCK_KEY, ApiSettings, create_app, load_api_settings
from node.executer.service import ExecuterService
from node.profiles import load_profile

TINY = "tiny-llama"
CHAT = {"model": TINY, "messages": [{"role": "user", "content": "Count to five."}], "max_tokens": 2, "seed": 1}
CHAT_URL = "/v1/chat/completions"
WAIT_S = 10.0  # ceiling for conditions that a working server meets in milliseconds


class CountingService(ExecuterService):
    """The real service, counting how many inferences reached the engine."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.inferences = 0
        self.fail_next = False

    def infer(self, *args, **kwargs):
        self.inferences += 1
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("engine blew up")
        return super().infer(*args, **kwargs)


@pytest.fixture
def service(tiny) -> CountingService:
    _, profile = load_profile(tiny.files.spec)
    return CountingService(tiny.files, tiny.tokenizer, tiny.engine, profile.fingerprint_thresholds())


def make_app(service, **settings):
    return create_app(service, "profile", False, ApiSettings(**settings))


def run(service, scenario, handler_cancellation=False, **settings):
    """Run scenario(client, app, url, runner) against a real server on loopback, set up as run_app sets it."""
    app = make_app(service, **settings)

    async def main():
        runner = web.AppRunner(app, handler_cancellation=handler_cancellation)
        await runner.setup()
        try:
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            host, port = runner.addresses[0][:2]
            url = f"http://{host}:{port}"
            async with aiohttp.ClientSession(url) as client:
                await scenario(client, app, url, runner)
        finally:
            await runner.cleanup()

    asyncio.run(main())


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def engine_waiters(app) -> int:
    """How many requests wait on the engine lock (the lock's own queue, the same object on the old server)."""
    return len(app[LOCK_KEY]._waiters or ())


async def until(condition) -> None:
    async with asyncio.timeout(WAIT_S):
        while not condition():
            await asyncio.sleep(0.005)


async def post(client, body=CHAT, url=CHAT_URL, headers=None):
    """POST and return (status, JSON body, headers); gives up after WAIT_S (the old server never refuses)."""
    async with asyncio.timeout(WAIT_S):
        async with client.post(url, json=body, headers=headers or {}) as r:
            return r.status, await r.json(), r.headers


def queue(client, headers=None) -> asyncio.Task:
    return asyncio.ensure_future(post(client, headers=headers))


def test_generating_routes_need_a_valid_bearer_key(service):
    hashed = "sha256:" + hashlib.sha256(b"hashed-key").hexdigest()

    async def scenario(client, app, url, _):
        for headers in ({}, bearer("wrong-key"), bearer(""), {"Authorization": "Basic right-key"},
                        bearer("right-keyX"), bearer(hashlib.sha256(b"hashed-key").hexdigest())):
            status, body, hdrs = await post(client, headers=headers)
            assert status == 401, (headers, body)
            assert body["error"]["code"] == "invalid_api_key" and body["error"]["type"] == "invalid_request_error"
            assert hdrs["WWW-Authenticate"] == "Bearer"
        status, _, _ = await post(client, {"model": TINY, "prompt": "Once", "max_tokens": 2}, "/v1/completions")
        assert status == 401
        verify = {**CHAT, "messages": [*CHAT["messages"], {"role": "assistant", "content": "1"}], "max_tokens": 0,
                  "verification_proof_to_validate": []}
        assert (await post(client, verify))[0] == 401  # the verification mode costs a prefill: keyed too
        assert service.inferences == 0

        status, ok, _ = await post(client, headers=bearer("right-key"))
        assert status == 200 and ok["choices"][0]["message"]["verification_proofs"]
        assert (await post(client, headers=bearer("hashed-key")))[0] == 200  # listed by its sha256 only
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="right-key", max_retries=0) as good:
            r = await good.completions.create(model=TINY, prompt="Once", max_tokens=2, seed=1)
            assert r.choices[0].text is not None
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="stolen?", max_retries=0) as bad:
            with pytest.raises(openai.AuthenticationError):
                await bad.chat.completions.create(model=TINY, messages=CHAT["messages"], max_tokens=2)

        # what validators fetch stays open: it is checked against the on-chain commitments anyway
        info = ok["verinfer"]
        for path in ("/health", "/v1/models", f"/v1/payloads/{info['inference_id']}",
                     f"/v1/artifacts/{info['artifact_root']}"):
            async with client.get(path) as r:
                assert r.status == 200, path

    run(service, scenario, keys=["right-key", hashed])


def test_a_client_over_its_limit_gets_429_while_others_are_served(service):
    async def scenario(client, app, *_):
        async with app[LOCK_KEY]:  # the engine is busy: what comes now waits
            a = [queue(client, bearer("key-a")) for _ in range(2)]
            await until(lambda: engine_waiters(app) == 2)
            t0 = time.monotonic()
            status, body, headers = await post(client, headers=bearer("key-a"))
            assert status == 429 and time.monotonic() - t0 < 2
            assert body["error"]["type"] == "rate_limit_error" and body["error"]["code"] == "rate_limit_exceeded"
            assert headers["Retry-After"] == "1"
            b = queue(client, bearer("key-b"))  # another client still gets in line
            await until(lambda: engine_waiters(app) == 3)
            assert service.inferences == 0
        assert [s for s, _, _ in await asyncio.gather(*a, b)] == [200, 200, 200]
        assert service.inferences == 3
        assert (await post(client, headers=bearer("key-a")))[0] == 200  # its slots came back

    run(service, scenario, keys=["key-a", "key-b"], max_concurrent_per_client=2)


def test_a_full_queue_answers_503_at_once_without_running_the_model(service):
    async def scenario(client, app, *_):
        async with app[LOCK_KEY]:
            waiting = [queue(client) for _ in range(2)]
            await until(lambda: engine_waiters(app) == 2)
            t0 = time.monotonic()
            status, body, headers = await post(client)
            elapsed = time.monotonic() - t0
            assert status == 503 and elapsed < 2, elapsed
            assert body["error"]["type"] == "server_error" and body["error"]["code"] == "queue_full"
            assert headers["Retry-After"] == "1"
            async with client.get("/health") as r:  # the loop is free; the read-only routes answer
                assert r.status == 200
            assert service.inferences == 0
        assert [s for s, _, _ in await asyncio.gather(*waiting)] == [200, 200]
        assert service.inferences == 2  # the refused request never reached the engine
        assert (await post(client))[0] == 200

    run(service, scenario, max_queue=2, max_concurrent_per_client=10)


def test_waiting_past_the_queue_timeout_is_503_and_frees_the_slot(service):
    async def scenario(client, app, *_):
        async with app[LOCK_KEY]:
            t0 = time.monotonic()
            status, body, headers = await post(client)
            assert status == 503 and body["error"]["code"] == "queue_timeout" and headers["Retry-After"] == "1"
            assert 0.2 <= time.monotonic() - t0 < 5
            assert engine_waiters(app) == 0
            again = queue(client)  # the timed-out request's slot is free again ...
            await until(lambda: engine_waiters(app) == 1)
            assert (await post(client))[0] == 429  # ... and the limit of one still holds
        assert (await again)[0] == 200
        assert service.inferences == 1

    run(service, scenario, queue_timeout=0.2, max_concurrent_per_client=1)


@pytest.mark.parametrize("handler_cancellation", [False, True], ids=["run_app-default", "handler-cancellation"])
def test_slots_come_back_after_errors_and_disconnects(service, handler_cancellation):
    async def scenario(client, app, *_):
        # One client (by address: no keys), one slot. A 400, a 404 and an engine failure must not keep it.
        async with client.post(CHAT_URL, data=b"{not json") as r:
            assert r.status == 400
        assert (await post(client, {**CHAT, "model": "nope"}))[0] == 404
        service.fail_next = True
        assert (await post(client))[0] == 500
        async with app[LOCK_KEY]:
            leaver = queue(client)
            await until(lambda: engine_waiters(app) == 1)
            leaver.cancel()  # the client hangs up while queued
            await asyncio.gather(leaver, return_exceptions=True)
            await until(lambda: engine_waiters(app) == 0)  # the server noticed and left the line
            stayer = queue(client)  # neither the client's slot nor the queue's is still taken ...
            await until(lambda: engine_waiters(app) == 1)
            status, body, _ = await post(client)
            assert status == 429, body  # ... and the limit of one still holds
        assert (await stayer)[0] == 200
        assert service.inferences == 2  # the failed one and the stayer: the leaver never ran

    run(service, scenario, handler_cancellation, max_concurrent_per_client=1, max_queue=1)


def test_a_request_cancelled_on_the_engine_keeps_it_until_the_engine_is_done(service):
    first_may_finish = threading.Event()
    on_engine = []  # requests inside the engine right now
    most_on_engine = [0]
    original_infer = service.infer

    def watched_infer(*args, **kwargs):
        on_engine.append(1)
        most_on_engine[0] = max(most_on_engine[0], len(on_engine))
        try:
            if most_on_engine[0] == 1 and service.inferences == 0:
                assert first_may_finish.wait(WAIT_S)
            return original_infer(*args, **kwargs)
        finally:
            on_engine.pop()

    async def scenario(client, app, _, runner):
        service.infer = watched_infer
        leaver = queue(client)
        await until(lambda: len(on_engine) == 1)
        leaver.cancel()  # the server cancels its handler (handler_cancellation) while the engine runs it
        await asyncio.gather(leaver, return_exceptions=True)
        await until(lambda: not runner.server.connections)  # the server saw the hang-up
        follower = queue(client)  # admitted (two per client), and must wait for the engine
        await until(lambda: engine_waiters(app) == 1 or len(on_engine) == 2)
        assert len(on_engine) == 1 and app[LOCK_KEY].locked()  # nobody starts on an engine still busy
        first_may_finish.set()
        assert (await follower)[0] == 200
        assert most_on_engine[0] == 1

    run(service, scenario, handler_cancellation=True, max_concurrent_per_client=2)


def test_settings_come_from_toml_and_environment(tmp_path, monkeypatch):
    path = tmp_path / "api.toml"
    path.write_text('keys = ["toml-key"]\nmax_queue = 3\n')
    settings = load_api_settings(path)
    assert settings.max_queue == 3 and settings.compute_key_digests() == (hashlib.sha256(b"toml-key").digest(),)
    assert "toml-key" not in repr(settings)  # keys never reach a log line
    for bad in ({"keys": ["sha256:abc"]}, {"keys": [""]}, {"keys": [" padded"]}, {"max_queue": 0},
                {"max_concurrent_per_client": 0}, {"queue_timeout": 0}, {"unknown": 1}):
        with pytest.raises(ValueError):
            ApiSettings(**bad)
    assert ApiSettings().keys == []  # off by default
    monkeypatch.setenv("VERINFER_API_KEYS", "env-a, sha256:" + "ab" * 32)
    monkeypatch.setenv("VERINFER_API_MAX_CONCURRENT_PER_CLIENT", "2")
    settings = load_api_settings(path)  # the environment wins over the file
    assert settings.compute_key_digests() == (hashlib.sha256(b"env-a").digest(), bytes.fromhex("ab" * 32))
    assert settings.max_concurrent_per_client == 2 and settings.max_queue == 3

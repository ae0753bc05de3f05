"""A real device process over a real Unix socket: answers, bad input as typed error replies, workload keeps going."""

import json
import secrets
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from node.spotcheck.answers import compute_challenge_indices, compute_labels_digest, compute_state_answer
from node.spotcheck.device import DeviceConfig, run_device
from node.spotcheck.errors import SpotCode
from node.spotcheck.pinger import Pinger, PingerConfig
from node.spotcheck.sim import get_context
from node.spotcheck.stuffing import StuffingParams, compute_stuffing
from node.spotcheck.wire import (
    MAX_FRAME,
    Answer,
    Challenge,
    ErrorReply,
    FrameDecoder,
    encode_frame,
    encode_raw_frame,
    parse_message,
)
from node.spotcheck.workload import WorkloadReplayer, build_model


@pytest.fixture(scope="module")
def device():
    path = "/tmp/" + secrets.token_hex(6) + ".sock"  # AF_UNIX paths must stay short
    config = DeviceConfig(device_id="dev-a", socket_path=path, arena_bytes=1 << 20, declared_bytes=1 << 20,
                          stuffing_seed=secrets.token_hex(32), block_bytes=4096, layers=2, step_interval_ms=10)
    ctx = get_context()
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=run_device, args=(config, child))
    proc.start()
    assert parent.poll(120), "device did not start"
    kind, info = parent.recv()
    assert kind == "ready"
    yield config, info, parent
    if proc.is_alive():
        parent.send("stop")
        parent.poll(20)
    proc.join(timeout=20)
    Path(path).unlink(missing_ok=True)


class Client:
    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.sock.settimeout(20)
        self.decoder = FrameDecoder()
        self.pending: list[bytes] = []

    def ask(self, frame: bytes):
        self.sock.sendall(frame)
        while not self.pending:
            self.pending += [b for b in self.decoder.feed(self.sock.recv(65536)) if isinstance(b, bytes)]
        return parse_message(self.pending.pop(0))


def challenge(kind="state", device_id="dev-a", nonce=None, seq=1):
    return Challenge(device_id=device_id, seq=seq, nonce=nonce or secrets.token_hex(32), kind=kind,
                     count=16 if kind == "labels" else 0)


def test_labels_answers_match_the_stuffing_recomputed_from_the_seed(device):
    config, info, _ = device
    params = StuffingParams(n_blocks=info["n_blocks"], block_bytes=4096, layers=2)
    blocks = np.empty((params.n_blocks, params.words), dtype=np.uint64)
    compute_stuffing(bytes.fromhex(config.stuffing_seed), params, blocks)
    c = challenge("labels")
    answer = Client(config.socket_path).ask(encode_frame(c))
    n = bytes.fromhex(c.nonce)
    assert isinstance(answer, Answer)
    assert answer.digest == compute_labels_digest(n, compute_challenge_indices(n, params.n_blocks, 16), blocks)


@pytest.mark.parametrize("frame, code", [
    (encode_raw_frame(b"{not json"), SpotCode.MALFORMED),
    (encode_raw_frame(json.dumps({"type": "challenge", "v": 1}).encode()), SpotCode.MALFORMED),
    (encode_raw_frame(b"x" * (MAX_FRAME + 10)), SpotCode.OVERSIZED),
    (encode_frame(challenge(device_id="dev-b")), SpotCode.UNKNOWN_DEVICE),
    (encode_frame(Answer(device_id="dev-a", seq=1, nonce="00" * 32, kind="labels", digest="00" * 32)),
     SpotCode.MALFORMED),
])
def test_bad_input_gets_a_typed_refusal_and_the_device_keeps_working(device, frame, code):
    config, _, _ = device
    client = Client(config.socket_path)
    first = client.ask(encode_frame(challenge()))
    reply = client.ask(frame)
    assert isinstance(reply, ErrorReply) and reply.code is code
    time.sleep(0.1)
    after = client.ask(encode_frame(challenge()))
    assert isinstance(after, Answer) and after.step > first.step  # the workload kept running


def test_a_replayed_nonce_is_refused(device):
    config, _, _ = device
    client = Client(config.socket_path)
    c = challenge()
    assert isinstance(client.ask(encode_frame(c)), Answer)
    reply = client.ask(encode_frame(c.model_copy(update={"seq": 2})))
    assert isinstance(reply, ErrorReply) and reply.code is SpotCode.REPLAYED_NONCE


def test_the_pinger_challenges_a_real_device_and_the_state_answers_replay(device):
    config, _, _ = device
    records = Pinger(PingerConfig(targets=(("dev-a", config.socket_path),), rate_hz=20, run_s=1.0)).run()
    assert len(records) >= 5 and len({r.nonce for r in records}) == len(records)
    assert all(r.answer_json is not None and r.received_ns > r.sent_ns for r in records)
    states = [Answer.model_validate_json(r.answer_json) for r in records if r.kind == "state"]
    assert states
    # the state is the workload's: stop the device, take its tokens, re-execute the answered steps
    _, _, control = device
    control.send("stop")
    assert control.poll(30)
    _, log = control.recv()
    replayer = WorkloadReplayer(build_model(), np.asarray(log.tokens), config.state_tokens)
    for answer in states:
        assert compute_state_answer(replayer.recompute_state(answer.step), bytes.fromhex(answer.nonce)) == answer.sketch


def test_the_pinger_refuses_oversized_and_foreign_answers_and_survives_a_hang_up():
    path = "/tmp/" + secrets.token_hex(6) + ".sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)

    def serve():
        conn, _ = server.accept()
        decoder = FrameDecoder()
        replies = [encode_raw_frame(b"y" * (MAX_FRAME + 1)),
                   encode_frame(Answer(device_id="other", seq=2, nonce="00" * 32, kind="labels", digest="00" * 32))]
        with conn:
            while replies and (data := conn.recv(65536)):
                for _ in decoder.feed(data):
                    conn.sendall(replies.pop(0))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    records = Pinger(PingerConfig(targets=(("dev-x", path),), rate_hz=50, run_s=0.5, timeout_ms=3000)).run()
    server.close()
    Path(path).unlink()
    assert records[0].error == SpotCode.OVERSIZED.value and records[0].answer_json is None
    assert records[1].error == SpotCode.MISMATCHED_ANSWER.value
    assert all(r.answer_json is None for r in records)
    # the fake device then hung up: the pinger keeps going and records the rest as unanswered
    assert len(records) > 2 and all(r.received_ns is None and r.error is None for r in records[2:])

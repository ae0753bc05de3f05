"""A real device process over a real Unix socket: answers, bad input as typed error replies, workload keeps going."""

import json
import secrets
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from eth_account import Account
from pydantic import SecretStr

from node.spotcheck.answers import compute_challenge_indices, compute_labels_digest, compute_state_answer
from node.spotcheck.auth import compute_challenge_digest, is_answer_signed_by, sign_answer, sign_challenge
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

VERIFIER = Account.create()
OTHER_VERIFIER = Account.create()
STRANGER = Account.create()
OPERATOR = Account.create()
RUN = "run-test"


def key_of(account) -> SecretStr:
    return SecretStr(bytes(account.key).hex())


@pytest.fixture(scope="module")
def device():
    path = "/tmp/" + secrets.token_hex(6) + ".sock"  # AF_UNIX paths must stay short
    config = DeviceConfig(device_id="dev-a", socket_path=path, run_id=RUN, operator_key=key_of(OPERATOR),
                          verifiers=(VERIFIER.address, OTHER_VERIFIER.address), arena_bytes=1 << 20,
                          declared_bytes=1 << 20, stuffing_seed=secrets.token_hex(32), block_bytes=4096, layers=2,
                          step_interval_ms=10, max_challenge_age_ms=5000)
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


def challenge(kind="state", device_id="dev-a", nonce=None, seq=1, signer=VERIFIER, run_id=RUN, age_ms=0):
    unsigned = Challenge(device_id=device_id, seq=seq, nonce=nonce or secrets.token_hex(32), kind=kind,
                         count=16 if kind == "labels" else 0, issued_ms=time.time_ns() // 1_000_000 - age_ms,
                         verifier=signer.address)
    return sign_challenge(signer, unsigned, run_id)


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
    assert is_answer_signed_by(answer, compute_challenge_digest(c, RUN), OPERATOR.address)


def test_every_allowed_verifier_is_answered(device):
    config, _, _ = device
    client = Client(config.socket_path)
    for signer in (VERIFIER, OTHER_VERIFIER):
        c = challenge(signer=signer)
        answer = client.ask(encode_frame(c))
        assert isinstance(answer, Answer) and is_answer_signed_by(answer, compute_challenge_digest(c, RUN),
                                                                  OPERATOR.address)


@pytest.mark.parametrize("frame, code", [
    (encode_raw_frame(b"{not json"), SpotCode.MALFORMED),
    (encode_raw_frame(json.dumps({"type": "challenge", "v": 1}).encode()), SpotCode.MALFORMED),
    (encode_raw_frame(b"x" * (MAX_FRAME + 10)), SpotCode.OVERSIZED),
    (encode_frame(challenge(device_id="dev-b")), SpotCode.UNKNOWN_DEVICE),
    (encode_frame(Answer(device_id="dev-a", seq=1, nonce="00" * 32, kind="labels", digest="00" * 32)),
     SpotCode.MALFORMED),
    (encode_frame(challenge(signer=STRANGER)), SpotCode.UNKNOWN_VERIFIER),
    (encode_frame(challenge().model_copy(update={"verifier": STRANGER.address})), SpotCode.UNKNOWN_VERIFIER),
    (encode_frame(challenge().model_copy(update={"count": 0, "kind": "state", "seq": 9})), SpotCode.BAD_SIGNATURE),
    (encode_frame(challenge(kind="labels").model_copy(update={"signature": None})), SpotCode.BAD_SIGNATURE),
    (encode_frame(challenge(run_id="another-run")), SpotCode.BAD_SIGNATURE),
    (encode_frame(challenge(age_ms=60_000)), SpotCode.EXPIRED_CHALLENGE),
    (encode_frame(challenge(age_ms=-60_000)), SpotCode.EXPIRED_CHALLENGE),
])
def test_bad_input_gets_a_typed_refusal_and_the_device_keeps_working(device, frame, code):
    config, _, _ = device
    client = Client(config.socket_path)
    first = client.ask(encode_frame(challenge()))
    reply = client.ask(frame)
    assert isinstance(reply, ErrorReply) and reply.code is code
    deadline = time.monotonic() + 10  # the workload thread runs at nice +10: on a loaded machine it steps slowly
    after = client.ask(encode_frame(challenge()))
    while isinstance(after, Answer) and after.step <= first.step and time.monotonic() < deadline:
        time.sleep(0.1)
        after = client.ask(encode_frame(challenge()))
    assert isinstance(after, Answer) and after.step > first.step  # the workload kept running


def test_a_replayed_nonce_is_refused(device):
    config, _, _ = device
    client = Client(config.socket_path)
    c = challenge()
    assert isinstance(client.ask(encode_frame(c)), Answer)
    assert client.ask(encode_frame(c)).code is SpotCode.REPLAYED_NONCE  # the very same signed frame
    reply = client.ask(encode_frame(challenge(nonce=c.nonce, seq=2)))  # re-signed with a new seq
    assert isinstance(reply, ErrorReply) and reply.code is SpotCode.REPLAYED_NONCE
    assert client.ask(encode_frame(challenge(nonce=c.nonce, seq=3, signer=OTHER_VERIFIER))).code is (
        SpotCode.REPLAYED_NONCE)  # another verifier cannot reuse a nonce either


def test_the_pinger_challenges_a_real_device_and_the_state_answers_replay(device):
    config, _, _ = device
    records = Pinger(PingerConfig(targets=(("dev-a", config.socket_path, OPERATOR.address),), run_id=RUN,
                                  verifier_key=key_of(VERIFIER), rate_hz=20, run_s=1.0)).run()
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


def test_the_pinger_refuses_oversized_foreign_and_unsigned_answers_and_survives_a_hang_up():
    path = "/tmp/" + secrets.token_hex(6) + ".sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)

    def signed_by(signer, c: Challenge) -> bytes:
        answer = Answer(device_id=c.device_id, seq=c.seq, nonce=c.nonce, kind="labels", digest="00" * 32) if (
            c.kind == "labels") else Answer(device_id=c.device_id, seq=c.seq, nonce=c.nonce, kind="state", step=0,
                                            sketch=(0,) * 64)
        return encode_frame(sign_answer(signer, compute_challenge_digest(c, RUN), answer))

    def serve():
        conn, _ = server.accept()
        decoder = FrameDecoder()
        replies = [lambda c: encode_raw_frame(b"y" * (MAX_FRAME + 1)),
                   lambda c: encode_frame(Answer(device_id="other", seq=2, nonce="00" * 32, kind="labels",
                                                 digest="00" * 32)),
                   lambda c: signed_by(STRANGER, c),  # the right challenge, not the operator's key
                   lambda c: signed_by(OPERATOR, c)]
        with conn:
            while replies and (data := conn.recv(65536)):
                for body in decoder.feed(data):
                    conn.sendall(replies.pop(0)(parse_message(body)))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    records = Pinger(PingerConfig(targets=(("dev-x", path, OPERATOR.address),), run_id=RUN,
                                  verifier_key=key_of(VERIFIER), rate_hz=50, run_s=0.5, timeout_ms=3000)).run()
    server.close()
    Path(path).unlink()
    assert records[0].error == SpotCode.OVERSIZED.value and records[0].answer_json is None
    assert records[1].error == SpotCode.MISMATCHED_ANSWER.value
    assert records[2].error == SpotCode.BAD_SIGNATURE.value and records[2].answer_json is None
    assert records[3].error is None and records[3].answer_json is not None  # signed by the operator: accepted
    # the fake device then hung up: the pinger keeps going and records the rest as unanswered
    assert len(records) > 4 and all(r.received_ns is None and r.error is None for r in records[4:])

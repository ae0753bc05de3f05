"""The pinger: challenges at Poisson times with fresh nonces, timed on its own clock (a separate process).

Each device gets its own Poisson stream of rate λ; a device has at most one challenge outstanding, and the
next one is drawn from the send time of the previous. Answers are matched to the outstanding challenge
(device, sequence number, nonce, kind) and must carry the device operator's signature over the
challenge's digest and the answer; anything else is a typed refusal recorded against the device. Every
challenge is signed with the verifier's key (node.spotcheck.auth).
"""

from __future__ import annotations

import logging
import os
import secrets
import selectors
import socket
import time
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection

import numpy as np
from eth_account import Account
from pydantic import BaseModel, ConfigDict, Field, SecretStr

from node.spotcheck.auth import compute_challenge_digest, is_answer_signed_by, sign_challenge
from node.spotcheck.errors import BadSignature, MismatchedAnswer, OversizedMessage, SpotcheckError, SpotCode
from node.spotcheck.wire import Answer, Challenge, ErrorReply, FrameDecoder, encode_frame, parse_message

log = logging.getLogger(__name__)


class PingerConfig(BaseModel):
    """Whom to challenge, how often, with what mix, and how long to wait for an answer."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    targets: tuple[tuple[str, str, str], ...]  # (device_id, socket path, operator address)
    run_id: str = Field(min_length=1, max_length=128)
    verifier_key: SecretStr  # hex secp256k1 key of the verifier this pinger challenges for
    rate_hz: float = Field(gt=0, le=1000)
    labels_share: float = Field(0.5, ge=0, le=1)
    labels_count: int = Field(64, ge=1, le=256)
    timeout_ms: float = Field(5000, gt=0)
    run_s: float = Field(gt=0)
    # (device_id, pid): the device processes whose CPU time the pinger meters (the sim's device seconds)
    meters: tuple[tuple[str, int], ...] = ()
    meter_ms: float = Field(250.0, gt=0)


@dataclass(frozen=True)
class MeterSample:
    """The CPU time the kernel had given a device's process at a time of the pinger's clock."""

    device_id: str
    t_ns: int
    cpu_ns: int


def read_cpu_ns(pid: int) -> int | None:
    """Return utime + stime of a process (all its threads) from /proc, in ns; None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) * 1_000_000_000 // os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class ExchangeRecord:
    """One challenge and its outcome as the pinger saw it (plain values, so it pickles and serialises)."""

    device_id: str
    seq: int
    kind: str
    nonce: str
    count: int
    issued_ms: int
    verifier: str
    signature: str
    sent_ns: int
    received_ns: int | None
    answer_json: str | None
    error: str | None


@dataclass
class _Outstanding:
    challenge: Challenge
    digest: bytes
    sent_ns: int


def match_answer(outstanding: Challenge, message: Answer | ErrorReply | Challenge) -> Answer:
    """Return the answer if it is the outstanding challenge's; raise the typed refusal otherwise."""
    if not isinstance(message, Answer):
        raise MismatchedAnswer(f"a device sent a {message.type}, not an answer", device=outstanding.device_id)
    if (message.device_id, message.seq, message.nonce, message.kind) != (
            outstanding.device_id, outstanding.seq, outstanding.nonce, outstanding.kind):
        raise MismatchedAnswer(f"answer for {message.device_id}/{message.seq} while {outstanding.seq} is open",
                               device=outstanding.device_id)
    return message


class Pinger:
    """Challenge every target at Poisson times until run_s has passed, recording each exchange."""

    def __init__(self, config: PingerConfig, progress: Connection | None = None) -> None:
        self.config = config
        self.progress = progress
        self.account = Account.from_key(config.verifier_key.get_secret_value())
        self.operators = {device_id: operator for device_id, _, operator in config.targets}
        self.rng = np.random.default_rng(secrets.randbits(128))
        self.records: list[ExchangeRecord] = []
        self.samples: list[MeterSample] = []
        self.seq = 0

    def _meter(self) -> None:
        for device_id, pid in self.config.meters:
            t_ns = time.monotonic_ns()
            cpu = read_cpu_ns(pid)
            if cpu is not None:
                self.samples.append(MeterSample(device_id, t_ns, cpu))

    def _next_gap_ns(self) -> int:
        return int(self.rng.exponential(1.0 / self.config.rate_hz) * 1e9)

    def _finish(self, open_: _Outstanding, received_ns: int | None, answer: Answer | None,
                error: SpotCode | None) -> None:
        ch = open_.challenge
        record = ExchangeRecord(device_id=ch.device_id, seq=ch.seq, kind=ch.kind, nonce=ch.nonce, count=ch.count,
                                issued_ms=ch.issued_ms, verifier=ch.verifier, signature=ch.signature or "",
                                sent_ns=open_.sent_ns, received_ns=received_ns,
                                answer_json=None if answer is None else answer.model_dump_json(exclude_none=True),
                                error=None if error is None else error.value)
        self.records.append(record)
        if self.progress is not None:
            self.progress.send(("exchange", asdict(record)))

    def _new_challenge(self, device_id: str) -> tuple[Challenge, bytes]:
        self.seq += 1
        labels = self.rng.random() < self.config.labels_share
        challenge = sign_challenge(self.account, Challenge(
            device_id=device_id, seq=self.seq, nonce=secrets.token_bytes(32).hex(),
            kind="labels" if labels else "state", count=self.config.labels_count if labels else 0,
            issued_ms=time.time_ns() // 1_000_000, verifier=self.account.address), self.config.run_id)
        return challenge, compute_challenge_digest(challenge, self.config.run_id)

    def _on_frame(self, open_: _Outstanding | None, item: bytes | OversizedMessage, received_ns: int
                  ) -> _Outstanding | None:
        if open_ is None:
            log.warning("unsolicited frame dropped")
            return None
        try:
            if isinstance(item, OversizedMessage):
                raise item
            message = parse_message(item)
            if isinstance(message, Answer | ErrorReply) and message.seq is not None and (
                    message.seq < open_.challenge.seq):
                log.warning("answer to expired challenge %s dropped", message.seq)
                return open_  # the challenge it answers was already recorded as missing
            if isinstance(message, ErrorReply):
                self._finish(open_, received_ns, None, message.code)
                return None
            answer = match_answer(open_.challenge, message)
            if not is_answer_signed_by(answer, open_.digest, self.operators[open_.challenge.device_id]):
                raise BadSignature(f"answer {answer.seq} is not signed by the operator", device=answer.device_id)
            self._finish(open_, received_ns, answer, None)
        except SpotcheckError as exc:
            log.warning("refused an answer from %s: %s", open_.challenge.device_id, exc)
            self._finish(open_, received_ns, None, exc.code)
        return None

    @staticmethod
    def _on_dead(selector: selectors.BaseSelector, sock: socket.socket, device_id: str, dead: set[str]) -> None:
        if device_id not in dead:
            log.warning("device %s closed its connection", device_id)
            selector.unregister(sock)
            dead.add(device_id)

    def run(self) -> list[ExchangeRecord]:
        """Run the challenge loop and return every exchange."""
        selector = selectors.DefaultSelector()
        socks: dict[str, socket.socket] = {}
        for device_id, path, _ in self.config.targets:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(path)
            socks[device_id] = sock
            selector.register(sock, selectors.EVENT_READ, device_id)
        decoders = {d: FrameDecoder() for d in socks}
        start = time.monotonic_ns()
        end = start + int(self.config.run_s * 1e9)
        timeout_ns = int(self.config.timeout_ms * 1e6)
        next_send = {d: start + self._next_gap_ns() for d in socks}
        open_: dict[str, _Outstanding | None] = {d: None for d in socks}
        dead: set[str] = set()
        meter_ns = int(self.config.meter_ms * 1e6)
        next_meter: int | None = start if self.config.meters else None  # None: metering done (or none asked)
        while True:
            now = time.monotonic_ns()
            if next_meter is not None and now >= next_meter:
                self._meter()  # every meter_ms, and once at the end of the run
                next_meter = None if now >= end else min(now + meter_ns, end)
            pending = [o.sent_ns + timeout_ns for o in open_.values() if o is not None]
            if now >= end and not pending:
                break
            due = [t for d, t in next_send.items() if open_[d] is None and t < end]
            if next_meter is not None:
                due.append(next_meter)
            wake = min([*pending, *due] + ([end] if now < end else []))  # never a zero timeout after the end
            arrived = []  # read every ready socket first: an answer's time must not include checking another's
            for key, _ in selector.select(max(0.0, (wake - now) / 1e9)):
                device_id = str(key.data)
                try:
                    data = socks[device_id].recv(65536)
                except OSError:
                    data = b""  # reset by the device: the same as closed
                arrived.append((device_id, data, time.monotonic_ns()))
            for device_id, data, received_ns in arrived:
                if not data:
                    self._on_dead(selector, socks[device_id], device_id, dead)
                    continue
                for item in decoders[device_id].feed(data):
                    open_[device_id] = self._on_frame(open_[device_id], item, received_ns)
            now = time.monotonic_ns()
            for device_id, o in open_.items():
                if o is not None and (now - o.sent_ns > timeout_ns or device_id in dead):
                    self._finish(o, None, None, None)  # no answer within the pinger's patience
                    open_[device_id] = None
            for device_id in socks:
                if open_[device_id] is None and next_send[device_id] <= now < end:
                    challenge, digest = self._new_challenge(device_id)
                    sent_ns = time.monotonic_ns()
                    open_[device_id] = _Outstanding(challenge, digest, sent_ns)
                    next_send[device_id] = sent_ns + self._next_gap_ns()
                    if device_id in dead:
                        continue  # recorded as missing at the next pass
                    try:
                        socks[device_id].sendall(encode_frame(challenge))
                    except OSError:  # the device closed or died: its challenges go unanswered from now on
                        self._on_dead(selector, socks[device_id], device_id, dead)
        for sock in socks.values():
            sock.close()
        return self.records


def run_pinger(config: PingerConfig, control: Connection) -> None:
    """Pinger process entry: run, streaming each exchange to the parent, then send them all."""
    logging.basicConfig(level=logging.WARNING)
    pinger = Pinger(config, control)
    records = pinger.run()
    control.send(("done", {"exchanges": [asdict(r) for r in records],
                           "meter": [asdict(m) for m in pinger.samples]}))

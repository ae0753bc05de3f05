"""A simulated device: a worker process with a resident arena, a declared workload and a challenge server.

The arena (one numpy buffer, written end to end so every page is resident) holds the identifying state
(the workload's latest activations) and the stuffing. The workload runs in a thread; a Unix-socket
server answers challenges in others. Cheating behaviours are switches of the same class, so that an
honest and a cheating device differ only in what they do with memory.
"""

from __future__ import annotations

import gc
import logging
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Literal

import numpy as np
import torch
from eth_account import Account
from pydantic import BaseModel, ConfigDict, Field, SecretStr

from node.spotcheck.answers import compute_challenge_indices, compute_labels_digest, compute_state_answer
from node.spotcheck.auth import get_address, sign_answer, verify_challenge
from node.spotcheck.errors import (
    ExpiredChallenge,
    MalformedMessage,
    OversizedMessage,
    ReplayedNonce,
    SpotcheckError,
    UnknownDevice,
)
from node.spotcheck.stuffing import StuffingParams, compute_n_blocks, compute_stuffing
from node.spotcheck.wire import Answer, Challenge, ErrorReply, FrameDecoder, encode_frame, parse_message
from node.spotcheck.workload import MODEL_NAME, InferenceWorkload, build_model, compute_prompt, get_weights_digest

log = logging.getLogger(__name__)

Behaviour = Literal["honest", "evict", "far_state", "recompute", "stale", "liar", "gaps", "fabricate"]
PRUNE_EVERY = 1024  # prune expired nonces from the replay set every this many accepted challenges


class DeviceConfig(BaseModel):
    """How to start one simulated device (the parent passes it to the worker process)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    device_id: str
    socket_path: str
    run_id: str = Field(min_length=1, max_length=128)
    operator_key: SecretStr  # hex secp256k1 key: signs every answer (the run's operator, bonded on chain)
    verifiers: tuple[str, ...] = Field(min_length=1)  # the only addresses whose challenges are answered
    max_challenge_age_ms: int = Field(30_000, gt=0)  # issued-at window (both ways: clock skew across hosts)
    arena_bytes: int = Field(gt=0)
    declared_bytes: int = Field(gt=0)
    stuffing_seed: str = Field(pattern=r"^[0-9a-f]{64}$")
    model: str = MODEL_NAME  # the declared workload's model (a registry llama)
    prompt_seed: int = 0
    state_tokens: int = Field(32, ge=2, le=512)
    block_bytes: int = 16384
    layers: int = 8
    parents: int = 2
    behaviour: Behaviour = "honest"
    evict_fraction: float = Field(0.0, ge=0.0, le=1.0)
    far_delay_ms: float = Field(0.0, ge=0.0)
    stale_every: int = Field(0, ge=0)
    gaps_fraction: float = Field(0.0, ge=0.0, lt=1.0)  # the gaps cheat: this share of its compute is undeclared
    gc_pressure: bool = False
    gc_freeze: bool = True  # move start-up objects out of the collector's reach (full GC: 270 ms → 1-2 ms)
    step_interval_ms: float = Field(0.0, ge=0.0)  # 0: flat out (an honest device fills its capacity)
    # the answer path before the workload (docs/spotcheck.md, "Honest latency under load"): the workload thread
    # runs this much nicer than the challenge server, and a waiting server thread gets the GIL after this long
    workload_nice: int = Field(10, ge=0, le=19)
    switch_interval_ms: float = Field(0.5, gt=0, le=100)


@dataclass
class DeviceLog:
    """What a device hands back at the end: its fill, steps, tokens, answered states and counters."""

    device_id: str
    n_blocks: int
    state_bytes: int
    fill_s: float
    weights_digest: str
    steps: list[tuple[int, int, int]] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    answered_states: dict[int, np.ndarray] = field(default_factory=dict)
    gc_pauses_ms: list[float] = field(default_factory=list)
    serve_ms: list[float] = field(default_factory=list)  # per answered frame: recv returned → answer sent
    undeclared_s: float = 0.0  # the gaps cheat: CPU seconds of undeclared compute (for the report, not the verifier)
    answers: int = 0
    refusals: int = 0


class SimDevice:
    """One device: arena, stuffing, workload thread and challenge server."""

    def __init__(self, config: DeviceConfig) -> None:
        self.config = config
        self.model = build_model(config.model)
        hidden = int(self.model.config.hidden_size)
        self.state_shape = (config.state_tokens, hidden)
        state_bytes = config.state_tokens * hidden * 4
        n_blocks = compute_n_blocks(config.declared_bytes, state_bytes, config.block_bytes)
        self.params = StuffingParams(n_blocks=n_blocks, block_bytes=config.block_bytes, layers=config.layers,
                                     parents=config.parents)
        self.seed = bytes.fromhex(config.stuffing_seed)
        self.arena = np.ones(config.arena_bytes // 8, dtype=np.uint64)  # written, so every page is resident
        state_words = state_bytes // 8
        self.state_view = self.arena[:state_words].view(np.float32).reshape(self.state_shape)
        self.stuffing = self.arena[state_words:state_words + self.params.n_blocks * self.params.words].reshape(
            self.params.n_blocks, self.params.words)
        self.far = np.zeros(self.state_shape, dtype=np.float32)  # far memory: only the far_state cheater uses it
        self.workload = InferenceWorkload(self.model, compute_prompt(config.prompt_seed, config.state_tokens,
                                                                     int(self.model.config.vocab_size)),
                                          sampling_seed=config.prompt_seed)
        self.lock = threading.Lock()
        self.current_step = -1
        self.stop_event = threading.Event()
        self.operator = Account.from_key(config.operator_key.get_secret_value())
        self.verifiers = frozenset(get_address(v) for v in config.verifiers)
        self.seen_lock = threading.Lock()
        self.seen: dict[bytes, int] = {}  # nonce → issued_ms; only fresh, correctly signed challenges enter
        self.log = DeviceLog(device_id=config.device_id, n_blocks=n_blocks, state_bytes=state_bytes, fill_s=0.0,
                             weights_digest=get_weights_digest(self.model))
        self.threads: list[threading.Thread] = []

    # ---- preparation ---------------------------------------------------------------------------

    def process_fill(self) -> None:
        """Fill the stuffing (timed), then apply the behaviour's use of the memory."""
        t0 = time.perf_counter()
        if self.config.behaviour != "recompute":
            compute_stuffing(self.seed, self.params, self.stuffing)
        self.log.fill_s = time.perf_counter() - t0
        undeclared = np.random.default_rng()  # the cheater's own data: nothing a verifier could predict
        if self.config.behaviour == "evict":
            evicted = undeclared.choice(self.params.n_blocks, round(self.config.evict_fraction * self.params.n_blocks),
                                        replace=False)
            self.stuffing[evicted] = undeclared.integers(0, 1 << 63, size=(len(evicted), self.params.words),
                                                         dtype=np.uint64)
        elif self.config.behaviour == "recompute":
            self.stuffing[:] = undeclared.integers(0, 1 << 63, size=self.stuffing.shape, dtype=np.uint64)

    # ---- workload ------------------------------------------------------------------------------

    def run_workload(self) -> None:
        """Run declared steps until stopped, publishing each state into the arena (or where the cheat keeps it)."""
        interval = self.config.step_interval_ms / 1e3
        behaviour = self.config.behaviour
        if self.config.workload_nice:  # per thread on Linux: the server threads keep the process's priority
            tid = threading.get_native_id()
            os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid)
                                                     + self.config.workload_nice))
        while not self.stop_event.is_set():
            started = time.monotonic_ns()
            cpu0 = time.thread_time()
            step, state = self.workload.step()
            step_cpu_s = time.thread_time() - cpu0
            with self.lock:
                if behaviour == "far_state":
                    self.far[:] = state
                elif behaviour != "stale" or step % max(self.config.stale_every, 1) == 0:
                    self.state_view[:] = state
                self.current_step = step
                ended = time.monotonic_ns()  # after the write: from now on an answer must be this step's
            self.log.steps.append((step, started, ended))
            if behaviour in ("gaps", "fabricate"):
                t_a = time.monotonic_ns()
                undeclared_s = self.run_undeclared(step_cpu_s)
                if behaviour == "fabricate":
                    self.process_fabricate(round(undeclared_s / max(step_cpu_s, 1e-6)), t_a, time.monotonic_ns())
            rest = interval - (ended - started) / 1e9
            if rest > 0:
                self.stop_event.wait(rest)

    def run_undeclared(self, declared_cpu_s: float) -> float:
        """The gaps cheat: after a declared step, undeclared inference (unrecorded tokens) for its share of compute.

        What the review measured: declared steps keep every answer right and in time, while most of the
        device's compute (51–56 s of a 60 s run) goes to work nobody declared. Returns its CPU seconds.
        """
        f = self.config.gaps_fraction
        budget = declared_cpu_s * f / (1.0 - f)
        cpu0 = time.thread_time()
        rng = np.random.default_rng()
        vocab = int(self.model.config.vocab_size)
        while time.thread_time() - cpu0 < budget and not self.stop_event.is_set():
            with torch.inference_mode():
                self.model(input_ids=torch.as_tensor(rng.integers(0, vocab, size=(1, self.config.state_tokens))))
        spent = time.thread_time() - cpu0
        self.log.undeclared_s += spent
        return spent

    def process_fabricate(self, n: int, t_a: int, t_b: int) -> None:
        """The fabricate cheat: record n steps it never computed over [t_a, t_b], as if its compute were declared."""
        rng = np.random.default_rng()
        for i in range(n):
            with self.lock:
                step = self.workload.fabricate_step(rng)
                self.current_step = step  # its state is computed only if a state challenge asks for it
            self.log.steps.append((step, t_a + (t_b - t_a) * i // n, t_a + (t_b - t_a) * (i + 1) // n))

    def run_gc_pressure(self) -> None:
        """Make cyclic garbage and force full collections (an honest device's GC pauses, measured)."""
        while not self.stop_event.wait(0.5):
            junk: list[list[object]] = []
            for _ in range(20_000):
                node: list[object] = []
                node.append(node)
                junk.append(node)
            del junk
            t0 = time.perf_counter()
            gc.collect()
            self.log.gc_pauses_ms.append((time.perf_counter() - t0) * 1e3)

    # ---- challenges ----------------------------------------------------------------------------

    def compute_answer(self, challenge: Challenge) -> Answer:
        """Answer a challenge from what this device keeps (honestly or per its cheat)."""
        nonce = bytes.fromhex(challenge.nonce)
        if challenge.kind == "labels":
            indices = compute_challenge_indices(nonce, self.params.n_blocks, challenge.count)
            blocks = self.stuffing
            if self.config.behaviour == "recompute":
                blocks = np.empty_like(self.stuffing)
                compute_stuffing(self.seed, self.params, blocks)  # on demand: a whole fill per challenge
            return Answer(device_id=self.config.device_id, seq=challenge.seq, nonce=challenge.nonce, kind="labels",
                          digest=compute_labels_digest(nonce, indices, blocks))
        if self.config.behaviour == "far_state":
            time.sleep(self.config.far_delay_ms / 1e3)  # the state lives in a tier this far away
        with self.lock:
            source = self.far if self.config.behaviour == "far_state" else self.state_view
            state, step = source.copy(), self.current_step
        if self.config.behaviour == "fabricate":
            state = self.workload.compute_state_of(step)  # one step's compute, well inside X
        self.log.answered_states.setdefault(step, state)
        return Answer(device_id=self.config.device_id, seq=challenge.seq, nonce=challenge.nonce, kind="state",
                      step=step, sketch=compute_state_answer(state, nonce))

    def process_fresh_nonce(self, challenge: Challenge, now_ms: int) -> None:
        """Refuse an expired challenge or a nonce seen before; remember this one (expired ones are forgotten)."""
        age = now_ms - challenge.issued_ms
        if abs(age) > self.config.max_challenge_age_ms:
            raise ExpiredChallenge(f"challenge {challenge.seq} issued {age} ms ago", device=self.config.device_id)
        nonce = bytes.fromhex(challenge.nonce)
        with self.seen_lock:  # check-and-insert: two connections replaying one nonce get one answer
            if nonce in self.seen:
                raise ReplayedNonce(f"nonce {challenge.nonce[:16]}… seen before", device=self.config.device_id)
            self.seen[nonce] = challenge.issued_ms
            if len(self.seen) % PRUNE_EVERY == 0:
                oldest = now_ms - self.config.max_challenge_age_ms
                self.seen = {n: t for n, t in self.seen.items() if t >= oldest}

    def process_frame(self, item: bytes | OversizedMessage) -> Answer | ErrorReply:
        """Parse, authenticate, check and answer one frame; any bad input becomes a typed error reply."""
        seq: int | None = None
        try:
            if isinstance(item, OversizedMessage):
                raise item
            message = parse_message(item)
            if not isinstance(message, Challenge):
                raise MalformedMessage(f"a device accepts challenges, not {message.type}")
            seq = message.seq
            if message.device_id != self.config.device_id:
                raise UnknownDevice("challenge for another device", device=message.device_id)
            digest = verify_challenge(message, self.config.run_id, self.verifiers)  # before any work is spent
            self.process_fresh_nonce(message, time.time_ns() // 1_000_000)
            answer = sign_answer(self.operator, digest, self.compute_answer(message))
            self.log.answers += 1
            return answer
        except SpotcheckError as exc:
            self.log.refusals += 1
            log.warning("device %s refused a challenge: %s", self.config.device_id, exc)
            return ErrorReply(device_id=self.config.device_id, seq=seq, code=exc.code, message=str(exc)[:300])

    def serve_connection(self, conn: socket.socket) -> None:
        """Answer the frames of one connection until it closes or the device stops."""
        decoder = FrameDecoder()
        conn.settimeout(0.2)
        with conn:
            while not self.stop_event.is_set():
                try:
                    data = conn.recv(65536)
                except TimeoutError:
                    continue
                except OSError:
                    return
                if not data:
                    return
                t0 = time.perf_counter()
                for item in decoder.feed(data):
                    try:
                        conn.sendall(encode_frame(self.process_frame(item)))
                    except OSError:
                        return
                    self.log.serve_ms.append((time.perf_counter() - t0) * 1e3)

    def serve(self, server: socket.socket) -> None:
        """Accept connections (the pinger's, a test's) and serve each in its own thread."""
        server.settimeout(0.2)
        while not self.stop_event.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            thread = threading.Thread(target=self.serve_connection, args=(conn,), daemon=True)
            thread.start()
            self.threads.append(thread)

    def start(self, server: socket.socket) -> None:
        """Start the workload, the server and (if configured) the GC pressure threads."""
        targets = [self.run_workload, lambda: self.serve(server)]
        if self.config.gc_pressure:
            targets.append(self.run_gc_pressure)
        for target in targets:
            thread = threading.Thread(target=target, daemon=True)
            thread.start()
            self.threads.append(thread)

    def stop(self) -> DeviceLog:
        """Stop every thread and return the log."""
        self.stop_event.set()
        for thread in list(self.threads):
            thread.join(timeout=5)
        self.log.tokens = list(self.workload.tokens)
        return self.log


def run_device(config: DeviceConfig, control: Connection) -> None:
    """Worker process entry: prepare, report ready, run until told to stop, hand back the log."""
    torch.set_num_threads(1)
    sys.setswitchinterval(config.switch_interval_ms / 1e3)  # 5 ms by default: each GIL hand-off to a server thread
    logging.basicConfig(level=logging.WARNING)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(config.socket_path)
    server.listen(8)
    device = SimDevice(config)
    device.process_fill()
    if config.gc_freeze:
        gc.collect()
        gc.freeze()  # torch + transformers leave ~390k tracked objects; a full collection would scan them all
    device.start(server)
    while device.current_step < 0 and not device.stop_event.wait(0.01):
        pass  # ready means a state exists: a state challenge before the first step would have nothing to answer
    control.send(("ready", {"fill_s": device.log.fill_s, "n_blocks": device.params.n_blocks,
                            "state_bytes": device.log.state_bytes}))
    while not control.poll(0.5) or control.recv() != "stop":
        pass
    control.send(("log", device.stop()))
    server.close()

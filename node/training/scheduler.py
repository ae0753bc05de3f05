"""The auditor's scheduling of recomputations: the newest drawn audit preempts, as `compute_completed_audits` says.

`AuditSchedule` is the policy's state for one run (no I/O): it learns the drawn steps window by window
and answers which audits are still live — an audit of step t is interrupted once a newer audit is
drawn within k steps after it (k = recompute ÷ step time, measured). `CancellableWorker` runs one
recomputation at a time in a child process that the service kills when the schedule says its audit
was interrupted; a fresh child starts with the next audit. An audit that finished before the draw
that would interrupt it has finished: its verdict stands.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import multiprocessing.connection
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from node.engines.models import hold_file_lock
from node.protocol.ledger import InvalidTraining, TrainingReason
from node.protocol.lsh import compute_completed_audits

log = logging.getLogger(__name__)


@dataclass
class AuditSchedule:
    """One run's drawn audits and the policy's view of them: live, finished, interrupted."""

    k: int
    drawn: set[int] = field(default_factory=set)
    known_until: int = -1  # every step ≤ this has its draw known
    finished: set[int] = field(default_factory=set)
    interrupted: set[int] = field(default_factory=set)

    def on_draw(self, last_step: int, audited: list[int]) -> list[int]:
        """Take a window's draws (all steps up to last_step known); return the newly interrupted steps."""
        if last_step < self.known_until or any(t > last_step for t in audited):
            raise InvalidTraining(f"draws up to {last_step} after {self.known_until}, or a drawn step past the window",
                                  TrainingReason.LEDGER_STEP_GAP, last_step)
        self.drawn.update(audited)
        self.known_until = last_step
        live = set(self.get_completing())
        newly = sorted(t for t in self.drawn if t not in live and t not in self.finished | self.interrupted)
        self.interrupted.update(newly)
        return newly

    def get_completing(self) -> list[int]:
        """Return the drawn steps no newer drawn audit interrupts (the unknown future counts as not drawn)."""
        mask = [t in self.drawn for t in range(self.known_until + 1)]
        return compute_completed_audits(mask, self.k)

    def get_pending(self) -> list[int]:
        """Return the live audits not finished yet, oldest first (the prover's buffer drops the oldest first)."""
        return sorted(set(self.get_completing()) - self.finished - self.interrupted)

    def on_finished(self, step: int) -> None:
        """Mark an audit finished (its verdict stands even if a later draw would have interrupted it)."""
        self.finished.add(step)

    def is_live(self, step: int) -> bool:
        """Check whether an audit is still to be run or running."""
        return step in self.drawn and step not in self.interrupted and step not in self.finished


@contextlib.contextmanager
def hold_recompute_lock(path: Path | None) -> Iterator[None]:
    """Hold an exclusive flock on `path` for the block (no lock when None).

    Auditors sharing one machine (the devnet's three validators) take it around loading a response and
    re-executing the step, so at most one 135 M-parameter recomputation is in memory at a time. The kernel
    drops the lock when its holder dies, so an interrupted (killed) recomputation never leaves it held. In a
    real deployment every validator audits on its own machine and the lock guards nothing.
    """
    if path is None:
        yield
        return
    with hold_file_lock(path):
        yield


def _worker_main(conn: multiprocessing.connection.Connection, threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    while True:
        job = conn.recv()
        if job is None:
            return
        fn, args = job
        try:
            conn.send(("ok", fn(*args)))
        except Exception as e:  # the parent decides; a failing audit must not kill the worker silently
            conn.send(("error", repr(e)))


class CancellableWorker:
    """One child process running one job at a time; `cancel` kills it mid-job (a new child starts on demand)."""

    def __init__(self, threads: int = 1) -> None:
        self.threads = threads
        self.ctx = mp.get_context("spawn")
        self.process: Any = None
        self.conn: multiprocessing.connection.Connection | None = None
        self.running: Any = None  # the key of the running job

    def _ensure_started(self) -> multiprocessing.connection.Connection:
        if self.process is None or not self.process.is_alive() or self.conn is None:
            parent, child = self.ctx.Pipe()
            self.process = self.ctx.Process(target=_worker_main, args=(child, self.threads), daemon=True)
            self.process.start()
            child.close()
            self.conn = parent
        return self.conn

    def submit(self, key: Any, fn: Callable[..., Any], *args: Any) -> None:
        """Start fn(*args) in the child (picklable fn); only one job runs at a time."""
        if self.running is not None:
            raise RuntimeError(f"job {self.running} is still running")
        self._ensure_started().send((fn, args))
        self.running = key

    def poll(self, timeout_s: float = 0.0) -> tuple[Any, str, Any] | None:
        """Return (key, "ok" | "error", result) once the running job ended, else None."""
        if self.running is None or self.conn is None:
            return None
        try:
            if not self.conn.poll(timeout_s):
                if not self.process.is_alive():
                    key, self.running = self.running, None
                    self._stop()
                    return key, "error", f"worker exited with {self.process.exitcode}"
                return None
            status, result = self.conn.recv()
        except (EOFError, OSError) as e:
            key, self.running = self.running, None
            self._stop()
            return key, "error", repr(e)
        key, self.running = self.running, None
        return key, status, result

    def cancel(self) -> Any:
        """Kill the running job's child (a fresh one starts with the next job); return its key."""
        key, self.running = self.running, None
        if key is not None:
            self._stop()
            log.info("audit %s interrupted: recomputation abandoned", key)
        return key

    def _stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.join(timeout=10)
        if self.conn is not None:
            self.conn.close()
        self.process, self.conn = None, None

    def close(self) -> None:
        """Stop the child."""
        if self.conn is not None and self.running is None and self.process is not None and self.process.is_alive():
            try:
                self.conn.send(None)
                self.process.join(timeout=5)
            except (OSError, BrokenPipeError):
                pass
        self.running = None
        self._stop()

"""Batched validation: the prefills of concurrent checks of one model, grouped into one forward pass.

Checks of one model run concurrently (fetches, stage 1 and stage 2 overlap); each hands its prefill to
the model's batcher and awaits it. The batcher runs one pass at a time in a worker thread; whatever
queued while a pass ran (up to `max_batch`, after waiting `wait` seconds for company) is the next
pass. A batch that fails is retried one item at a time, so one bad input fails only its own check.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from node.engines.base import Prefill

log = logging.getLogger(__name__)
Item = tuple[Sequence[int], Sequence[int]]  # prompt ids, output ids


class PrefillBatcher:
    """Groups concurrent prefill requests for one engine into batched passes, one pass at a time."""

    def __init__(self, run: Callable[[list[Item]], list[Prefill]], max_batch: int, wait: float,
                 on_batch: Callable[[int], None] = lambda _: None) -> None:
        self._run = run  # blocking: called in a worker thread, one call at a time
        self.max_batch = max_batch
        self.wait = wait
        self._on_batch = on_batch  # told each pass's size (the daemon's histogram)
        self._pending: list[tuple[Item, asyncio.Future[Prefill]]] = []
        self._worker: asyncio.Task[None] | None = None
        self.batch_sizes: list[int] = []  # sizes of the passes run, for metrics and tests

    async def prefill(self, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> Prefill:
        """Return this pair's prefill, computed in a pass with whatever else is waiting."""
        future: asyncio.Future[Prefill] = asyncio.get_running_loop().create_future()
        self._pending.append(((prompt_ids, output_ids), future))
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._drain(), name="prefill-batcher")
        return await future

    async def _drain(self) -> None:
        while self._pending:
            if len(self._pending) < self.max_batch and self.wait > 0:
                await asyncio.sleep(self.wait)  # let concurrent checks join this pass
            batch = [(item, f) for item, f in self._pending[: self.max_batch] if not f.cancelled()]
            del self._pending[: self.max_batch]
            if batch:
                await self._run_batch(batch)

    async def _run_batch(self, batch: list[tuple[Item, asyncio.Future[Prefill]]]) -> None:
        self.batch_sizes.append(len(batch))
        self._on_batch(len(batch))
        try:
            results = await asyncio.to_thread(self._run, [item for item, _ in batch])
        except Exception as exc:
            if len(batch) == 1:
                _settle(batch[0][1], exc)
                return
            log.warning("batched prefill failed, retrying one at a time", extra={"size": len(batch), "error": str(exc)})
            for one in batch:
                await self._run_batch([one])
            return
        for (_, future), result in zip(batch, results, strict=True):
            _settle(future, result)


def _settle(future: asyncio.Future[Prefill], outcome: Prefill | BaseException) -> None:
    """Resolve a waiting check's future unless it was cancelled meanwhile."""
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)

"""The prefill batcher: concurrent checks share passes, a failing item fails alone, a cancelled one is dropped."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import numpy as np
import pytest

from node.engines.base import Prefill
from node.validator.batching import PrefillBatcher

Item = tuple[Sequence[int], Sequence[int]]


class Recorder:
    """A blocking 'engine' that records each pass and marks each result with its item (no model)."""

    def __init__(self, delay: float = 0.05) -> None:
        self.passes: list[list[Item]] = []
        self.delay = delay
        self.running = threading.Lock()

    def __call__(self, items: list[Item]) -> list[Prefill]:
        assert self.running.acquire(blocking=False), "one pass at a time"
        try:
            threading.Event().wait(self.delay)
            self.passes.append(items)
            if any(-1 in out for _, out in items):
                raise ValueError("token id outside the vocabulary")
            return [Prefill(np.full((len(out), 1), float(sum(out))), np.zeros((1, 1))) for _, out in items]
        finally:
            self.running.release()


def test_concurrent_checks_share_passes_of_at_most_max_batch() -> None:
    engine = Recorder()
    batcher = PrefillBatcher(engine, max_batch=4, wait=0.01)

    async def main() -> list[Prefill]:
        return await asyncio.gather(*(batcher.prefill([1], [i, i]) for i in range(10)))

    results = asyncio.run(main())
    assert [float(r.logits[0, 0]) for r in results] == [2.0 * i for i in range(10)], "each gets its own result"
    assert sum(batcher.batch_sizes) == 10 and max(batcher.batch_sizes) == 4 and len(batcher.batch_sizes) == 3


def test_a_bad_item_fails_only_its_own_check() -> None:
    engine = Recorder(delay=0.0)
    batcher = PrefillBatcher(engine, max_batch=8, wait=0.05)

    async def main() -> list[Prefill | BaseException]:
        return await asyncio.gather(batcher.prefill([1], [3]), batcher.prefill([1], [-1]), batcher.prefill([1], [5]),
                                    return_exceptions=True)

    good, bad, other = asyncio.run(main())
    assert isinstance(bad, ValueError)
    assert isinstance(good, Prefill) and isinstance(other, Prefill)
    assert float(good.logits[0, 0]) == 3.0 and float(other.logits[0, 0]) == 5.0
    assert batcher.batch_sizes == [3, 1, 1, 1], "the failed pass is retried one item at a time"


def test_a_cancelled_check_is_not_computed() -> None:
    engine = Recorder(delay=0.2)
    batcher = PrefillBatcher(engine, max_batch=2, wait=0.0)

    async def main() -> None:
        first = asyncio.create_task(batcher.prefill([1], [1]))
        await asyncio.sleep(0.05)  # the first pass runs
        doomed = asyncio.create_task(batcher.prefill([1], [7]))
        kept = asyncio.create_task(batcher.prefill([1], [8]))
        await asyncio.sleep(0)
        doomed.cancel()
        await first
        assert float((await kept).logits[0, 0]) == 8.0
        with pytest.raises(asyncio.CancelledError):
            await doomed

    asyncio.run(main())
    assert [[out for _, out in p] for p in engine.passes] == [[[1]], [[8]]]

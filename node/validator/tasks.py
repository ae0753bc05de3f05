"""Run a service's concurrent loops: return when `stop` is set, raise the first loop's failure."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence


async def wait_stop_or_failure(tasks: Sequence[asyncio.Task[None]], stop: asyncio.Event) -> None:
    """Return when `stop` is set or a task ends; re-raise the exception of a task that failed."""
    stopper = asyncio.create_task(stop.wait())
    try:
        done, _ = await asyncio.wait([*tasks, stopper], return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
    for task in done:
        if task is not stopper and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]

"""Background tasks' one way to end: cancel them all, then wait for each (its ``CancelledError`` swallowed; any
other exception it ends with still raises).

A cancellation can be lost: on Python 3.11, ``asyncio.wait_for`` returns its inner call's result, and drops the
cancellation, when the two arrive in the same loop iteration (fixed in 3.12). redis-py 8 calls it on every command
sent with a ``socket_timeout`` (its default), so a Redis exchange loop could lose its stop, run on, and waiting for it
would never end: a CI run hung on exactly this. Hence three rules: the project's own code uses ``asyncio.timeout``,
never ``wait_for``; a loop that calls such a library calls ``raise_if_cancelled()`` after it; and ``cancel()`` cancels
a task still running ``RECANCEL_S`` after its cancellation again, until it ends."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from typing import Any

logger = logging.getLogger(__name__)

RECANCEL_S = 1.0
"""How long a cancelled task may take to end (its own clean-up) before it is cancelled again."""


def raise_if_cancelled() -> None:
    """Raise the current task's cancellation if a library swallowed it: a task asked to stop counts it in
    ``cancelling()`` until the cancellation is raised (or ``uncancel()``-ed, as ``asyncio.timeout`` does)."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def cancel(tasks: Iterable[asyncio.Task[Any] | None], *, recancel_s: float = RECANCEL_S) -> None:
    live = [task for task in tasks if task is not None]
    for task in live:
        task.cancel()
    for task in live:
        while not (await asyncio.wait({task}, timeout=recancel_s))[0]:
            logger.warning("task %s is still running after its cancellation; cancelling it again", task.get_name())
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            task.result()

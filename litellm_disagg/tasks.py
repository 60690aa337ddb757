"""Background tasks' one way to end: cancel them all, then wait for each (its ``CancelledError`` swallowed; any
other exception it ends with still raises)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from typing import Any


async def cancel(tasks: Iterable[asyncio.Task[Any] | None]) -> None:
    live = [task for task in tasks if task is not None]
    for task in live:
        task.cancel()
    for task in live:
        with contextlib.suppress(asyncio.CancelledError):
            await task

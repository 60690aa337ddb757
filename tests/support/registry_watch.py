"""Waiting helpers shared by the registry tests."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

from litellm_disagg.discovery.registry import Registry
from litellm_disagg.runtime_config import RuntimeConfig


async def eventually(check: Callable[[], Awaitable[bool] | bool], timeout_s: float = 3.0, interval_s: float = 0.02) -> None:
    """Wait until ``check()`` (sync or async) is true, else fail."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if isinstance(result, Awaitable):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(interval_s)


class WatchCollector:
    """Runs ``registry.watch()`` in a task and queues what it yields."""

    def __init__(self, registry: Registry):
        self.queue: asyncio.Queue[list[RuntimeConfig]] = asyncio.Queue()
        self.task = asyncio.create_task(self._run(registry))

    async def _run(self, registry: Registry) -> None:
        async for configs in registry.watch():
            await self.queue.put(configs)

    async def next(self, timeout_s: float = 2.0) -> list[RuntimeConfig]:
        return await asyncio.wait_for(self.queue.get(), timeout_s)

    async def until(self, predicate: Any, timeout_s: float = 2.0) -> list[RuntimeConfig]:
        deadline = time.monotonic() + timeout_s
        while True:
            configs = await self.next(max(0.01, deadline - time.monotonic()))
            if predicate(configs):
                return configs

    async def stop(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task

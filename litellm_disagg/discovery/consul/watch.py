"""Following Consul with blocking queries: one loop on the service catalog, one loop per worker service.

Each loop keeps its own ``X-Consul-Index`` and follows Consul's rules for blocking queries:

- the first request (and the first after a reset) carries no index and returns at once; later ones carry
  ``?index=N&wait=Ws`` and return when the resource changes or the wait ends (a return is no proof of a change);
- an index of 0 or less is taken as 1, so a buggy index never turns blocking queries into a tight loop;
- an index that goes backwards (a restored or replaced cluster) means start over from 0;
- two requests of one loop are at least ``min_query_interval_s`` apart.

A loop that cannot reach Consul never ends: it backs off (``retry_min_s`` doubling to ``retry_max_s``) and tries
again, and the ``DiscoveryStatus`` logs the outage and the recovery once each. Meanwhile every service keeps its last
configs, so the merged snapshot does not change and ``snapshots()`` yields nothing new: routers keep what they had.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

from litellm_disagg.discovery.consul.codec import go_duration
from litellm_disagg.discovery.consul.http import ConsulError
from litellm_disagg.discovery.consul.reader import ConsulReader, ServiceConfigs, ServiceNames
from litellm_disagg.discovery.consul.settings import ConsulRegistrySettings
from litellm_disagg.discovery.status import DiscoveryStatus
from litellm_disagg.runtime_config import RuntimeConfig
from litellm_disagg.tasks import cancel

logger = logging.getLogger(__name__)

T = TypeVar("T", ServiceNames, ServiceConfigs)


class BlockingIndex:
    """The index of one blocking-query loop, with Consul's reset, sanity and rate-limit rules."""

    def __init__(self, wait_s: float, min_interval_s: float):
        self.wait_s = wait_s
        self.min_interval_s = min_interval_s
        self.index = 0
        self._last_start = float("-inf")

    def params(self) -> dict[str, str]:
        if self.index <= 0:
            return {}
        return {"index": str(self.index), "wait": go_duration(self.wait_s)}

    def advance(self, returned: int | None) -> None:
        if returned is None:
            self.index = 0  # the endpoint sent no index: nothing to block on, read again from scratch
            return
        returned = max(returned, 1)  # sanity first: a stuck 0 must block on 1, not look like a reset every time
        self.index = 0 if returned < self.index else returned  # went backwards: start over

    async def pace(self) -> None:
        delay = self._last_start + self.min_interval_s - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        self._last_start = time.monotonic()


class Backoff:
    def __init__(self, min_s: float, max_s: float):
        self.min_s = min_s
        self.max_s = max_s
        self._next = min_s

    def reset(self) -> None:
        self._next = self.min_s

    async def sleep(self) -> None:
        delay = self._next * random.uniform(0.8, 1.2)
        self._next = min(self._next * 2, self.max_s)
        await asyncio.sleep(delay)


class ConsulWatch:
    """The machinery behind one ``ConsulRegistry.watch()``: start with ``snapshots()``, end with ``close()``."""

    def __init__(self, reader: ConsulReader, settings: ConsulRegistrySettings, status: DiscoveryStatus):
        self.reader = reader
        self.settings = settings
        self.status = status
        self._configs: dict[str, list[RuntimeConfig] | None] = {}  # None: not read yet
        self._service_tasks: dict[str, asyncio.Task[None]] = {}
        self._catalog_task: asyncio.Task[None] | None = None
        self._catalog_read = False
        self._changed = asyncio.Event()
        self._closing = False
        # Consul adds up to wait/16 of jitter to a blocking query; give the request that long plus a normal timeout.
        self._blocking_timeout_s = settings.wait_s * (1 + 1 / 16) + settings.request_timeout_s

    async def snapshots(self) -> AsyncIterator[list[RuntimeConfig]]:
        """Yields the merged snapshot once every service has been read, then after each change to it."""
        self._catalog_task = asyncio.create_task(self._follow_catalog(), name="consul-watch-catalog")
        last: list[RuntimeConfig] | None = None
        try:
            while not self._closing:
                await self._changed.wait()
                self._changed.clear()
                current = self._current()
                if not self._closing and current is not None and current != last:
                    last = current
                    yield current
        finally:
            await self.close()

    async def close(self) -> None:
        self._closing = True
        self._changed.set()
        tasks = [task for task in (self._catalog_task, *self._service_tasks.values()) if task is not None]
        self._service_tasks.clear()
        await cancel(tasks)

    def _current(self) -> list[RuntimeConfig] | None:
        if not self._catalog_read:
            return None
        per_service: dict[str, list[RuntimeConfig]] = {}
        for name, configs in self._configs.items():
            if configs is None:
                return None
            per_service[name] = configs
        return self.reader.merge(per_service)

    # -- the loops --------------------------------------------------------------------------------------------------

    def _timeout(self, params: dict[str, str]) -> float | None:
        """A blocking request may take its whole wait; a first (non-blocking) one gets the normal timeout."""
        return self._blocking_timeout_s if "index" in params else None

    async def _follow_catalog(self) -> None:
        async def read(params: dict[str, str]) -> ServiceNames:
            return await self.reader.service_names(params, timeout_s=self._timeout(params))

        await self._follow(read, self._set_services)

    async def _follow_service(self, name: str) -> None:
        async def read(params: dict[str, str]) -> ServiceConfigs:
            return await self.reader.service_configs(name, params, timeout_s=self._timeout(params))

        def apply(result: ServiceConfigs) -> None:
            if name in self._service_tasks:
                self._configs[name] = result.configs
                self._changed.set()

        await self._follow(read, apply)

    async def _follow(self, read: Callable[[dict[str, str]], Awaitable[T]], apply: Callable[[T], None]) -> None:
        index = BlockingIndex(self.settings.wait_s, self.settings.min_query_interval_s)
        backoff = Backoff(self.settings.retry_min_s, self.settings.retry_max_s)
        while True:
            await index.pace()
            try:
                result = await read(index.params())
            except ConsulError as exc:
                self.status.failed(exc)
                await backoff.sleep()
                continue
            except Exception as exc:  # a bug or a malformed answer must not end the watch either
                logger.exception("consul watch: unexpected error, retrying")
                self.status.failed(exc)
                await backoff.sleep()
                continue
            self.status.ok()
            backoff.reset()
            index.advance(result.index)
            apply(result)

    def _set_services(self, result: ServiceNames) -> None:
        for name in result.names - self._service_tasks.keys():
            self._configs[name] = None
            self._service_tasks[name] = asyncio.create_task(self._follow_service(name), name=f"consul-watch-{name}")
        for name in self._service_tasks.keys() - result.names:
            self._service_tasks.pop(name).cancel()
            self._configs.pop(name, None)
        self._catalog_read = True
        self._changed.set()

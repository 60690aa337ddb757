"""Workers whose port refuses connections sit out new work until discovery drops or replaces their entry.

A crashed worker (its process killed: the kernel closed its port) stays in discovery until its heartbeat's TTL runs
out (``registry.ttl_s``, 10 s in the shipped config), longer than the failure cooldown (``failure_cooldown_s``,
5 s). Between the two, the dead worker looked like the idlest of all (nothing in flight) and drew a share of new
requests; each of them paid a prefill whose KV nobody read, a refused decode call and LiteLLM's retry (the soak:
about 90 requests per decode crash, ``docs/benchmarks.md``).

    FailureCooldown.failed(worker_id) ─► Liveness.suspect(worker_id): one TCP connect to the worker's port
        refused ─► held: every filter that prefers healthy workers passes it over (as the cooldown does, without
                   its time limit) until discovery drops the entry or shows a new registration (``started_at``),
                   or ``max_hold_s`` passes
        accepted, timed out, any other error ─► nothing more (the cooldown alone applies)

Only a refused connection counts: it says nothing listens on that port. A timeout (a host down, a full accept queue)
proves nothing, so a busy worker is never held.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from litellm_disagg.routing.pool import WorkerPool
from litellm_disagg.runtime_config import RuntimeConfig

logger = logging.getLogger(__name__)

Probe = Callable[[RuntimeConfig], Awaitable[bool]]
"""Whether the worker's port refuses connections now (True only for a refusal)."""


async def refuses_connections(worker: RuntimeConfig, *, timeout_s: float = 1.0) -> bool:
    """One TCP connect to ``worker``'s HTTP address: True when it is refused, False when it is accepted or when
    nothing could be concluded (a timeout, a name that does not resolve)."""
    address = urlsplit(worker.base_url)
    host = address.hostname or "127.0.0.1"
    port = address.port or (443 if address.scheme == "https" else 80)
    try:
        async with asyncio.timeout(timeout_s):
            _, writer = await asyncio.open_connection(host, port)
    except ConnectionRefusedError:
        return True
    except (TimeoutError, OSError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return False


@dataclass(frozen=True)
class _Hold:
    started_at: float
    """The registration held (a worker that registers again, restarted, is a new one)."""
    until: float


class Liveness:
    """The workers held out of new work for refusing connections (see the module docstring)."""

    def __init__(
        self,
        pool: Callable[[], WorkerPool],
        *,
        probe: Probe = refuses_connections,
        max_hold_s: float = 60.0,
    ):
        self._pool = pool
        self._probe = probe
        self.max_hold_s = max_hold_s
        """The longest a worker is held without discovery dropping it (then the next failure probes it again)."""
        self._held: dict[str, _Hold] = {}
        self._probing: dict[str, asyncio.Task[None]] = {}

    def suspect(self, worker_id: str) -> None:
        """A call to ``worker_id`` failed: probe its port once (not when a probe runs or it is held already)."""
        worker = self._pool().get(worker_id)
        if worker is None or worker_id in self._probing or self.held(worker):
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a synchronous caller): nothing to probe with
            return
        task = loop.create_task(self._check(worker), name=f"litellm-disagg-liveness-{worker_id}")
        self._probing[worker_id] = task
        task.add_done_callback(lambda _: self._probing.pop(worker_id, None))

    async def _check(self, worker: RuntimeConfig) -> None:
        try:
            refused = await self._probe(worker)
        except Exception:  # noqa: BLE001 (a probe that fails proves nothing)
            logger.debug("liveness probe of %s failed", worker.worker_id, exc_info=True)
            return
        if refused:
            self.hold(worker)

    def hold(self, worker: RuntimeConfig) -> None:
        """Hold ``worker``'s current registration out of new work."""
        if worker.worker_id not in self._held:
            logger.warning("worker %s refuses connections: no new work until discovery drops it", worker.worker_id)
        self._held[worker.worker_id] = _Hold(worker.started_at, time.monotonic() + self.max_hold_s)

    def held(self, worker: RuntimeConfig) -> bool:
        hold = self._held.get(worker.worker_id)
        if hold is None:
            return False
        if hold.started_at != worker.started_at or hold.until <= time.monotonic():
            del self._held[worker.worker_id]
            return False
        return True

    def sync(self, pool: WorkerPool) -> None:
        """Discovery changed: forget the holds of workers it no longer lists or lists with a new registration."""
        for worker_id, hold in list(self._held.items()):
            worker = pool.get(worker_id)
            if worker is None or worker.started_at != hold.started_at:
                del self._held[worker_id]

    async def probed(self) -> None:
        """Wait for the probes in flight (tests; routing never waits for one)."""
        await asyncio.gather(*list(self._probing.values()), return_exceptions=True)

    async def aclose(self) -> None:
        tasks = list(self._probing.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

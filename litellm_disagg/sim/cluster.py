"""Many simulated workers in one process and one event loop, each with its own HTTP port, all registered in one
registry. Workers can join, drain and crash at runtime.

    async with SimCluster(registry=FileRegistry(tmp_path), settings=SimSettings().with_speedup(100)) as cluster:
        await cluster.start(prefill=2, decode=2)
        decode = cluster.workers_with(WorkerRole.DECODE)[0]
        ... POST to decode.base_url + "/chat/completions" ...
        await cluster.crash(cluster.workers_with(WorkerRole.PREFILL)[0].worker_id)
        await cluster.add(WorkerRole.PREFILL)          # a new worker joins
"""

from __future__ import annotations

import asyncio
import itertools
from types import TracebackType

from litellm_disagg.discovery.registry import Registry
from litellm_disagg.runtime_config import WorkerRole
from litellm_disagg.sim.directory import DIRECTORY, EngineDirectory
from litellm_disagg.sim.settings import SimSettings
from litellm_disagg.sim.worker import SimWorker, SimWorkerState


class SimCluster:
    def __init__(
        self,
        *,
        registry: Registry | None = None,
        settings: SimSettings | None = None,
        name: str = "sim",
        heartbeat_interval_s: float = 2.0,
        host: str = "127.0.0.1",
        directory: EngineDirectory = DIRECTORY,
    ):
        self.registry = registry
        self.settings = settings or SimSettings()
        self.name = name
        self.heartbeat_interval_s = heartbeat_interval_s
        self.host = host
        self.directory = directory
        self.workers: dict[str, SimWorker] = {}
        self._counter = itertools.count()

    async def __aenter__(self) -> SimCluster:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def start(self, *, prefill: int = 0, decode: int = 0, both: int = 0) -> list[SimWorker]:
        roles = [WorkerRole.PREFILL] * prefill + [WorkerRole.DECODE] * decode + [WorkerRole.BOTH] * both
        return list(await asyncio.gather(*(self.add(role) for role in roles)))

    async def add(
        self, role: WorkerRole, *, worker_id: str | None = None, settings: SimSettings | None = None,
        switchable: bool = False,
    ) -> SimWorker:
        """Start one more worker (``settings`` overrides the cluster's for this one) and register it; a
        ``switchable`` one follows role requests (``docs/role-change.md``)."""
        worker_id = worker_id or f"{self.name}-{role.value}-{next(self._counter)}"
        if worker_id in self.workers:
            raise ValueError(f"worker id {worker_id!r} is taken")
        worker = SimWorker(
            worker_id,
            role,
            settings or self.settings,
            registry=self.registry,
            heartbeat_interval_s=self.heartbeat_interval_s,
            host=self.host,
            directory=self.directory,
            switchable=switchable,
        )
        self.workers[worker_id] = worker
        try:
            await worker.start()
        except BaseException:
            self.workers.pop(worker_id, None)
            await worker.crash()
            raise
        return worker

    def get(self, worker_id: str) -> SimWorker:
        return self.workers[worker_id]

    def workers_with(self, role: WorkerRole, *, live: bool = True) -> list[SimWorker]:
        """Workers of ``role`` (only those still serving when ``live``), in the order they joined."""
        return [
            w
            for w in self.workers.values()
            if w.role is role and (not live or w.state in (SimWorkerState.READY, SimWorkerState.DRAINING))
        ]

    async def drain(self, worker_id: str, *, timeout_s: float = 30.0, settle_s: float = 0.0) -> bool:
        return await self.workers[worker_id].drain(timeout_s=timeout_s, settle_s=settle_s)

    async def crash(self, worker_id: str) -> None:
        await self.workers[worker_id].crash()

    async def drain_all(self, *, timeout_s: float = 30.0, settle_s: float = 0.0) -> None:
        await asyncio.gather(*(w.drain(timeout_s=timeout_s, settle_s=settle_s) for w in self.workers.values()))

    async def close(self) -> None:
        """Stop every worker still running (withdrawn, not drained)."""
        await asyncio.gather(*(w.stop() for w in self.workers.values()), return_exceptions=True)

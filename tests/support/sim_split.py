"""A split of three switchable simulated workers behind the real LiteLLM proxy, for the planner's in-proxy tests.

``switchable_split(tmp_path, config_for, settings, name=...)`` starts ``p1`` (prefill), ``d1`` and ``d2`` (decode),
all ``--switchable``, in a file registry under ``tmp_path``, writes the proxy config ``config_for(registry_dir)``,
starts the proxy and waits until it serves the model; it yields a ``SimSplit`` and stops the proxy on the way out
(its log stays readable)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from litellm_disagg.discovery.file.registry import FileRegistry
from litellm_disagg.runtime_config import WorkerRole
from litellm_disagg.sim import SimCluster, SimSettings

from .procs import ProxyProc


@dataclass(frozen=True)
class SimSplit:
    workers: tuple[Any, ...]
    """``p1``, ``d1``, ``d2``: the simulated workers (their ``role`` is the one they publish)."""
    proxy: ProxyProc
    registry_dir: Path

    async def published(self) -> dict[str, WorkerRole]:
        """Each worker's role as discovery shows it now."""
        reader = FileRegistry(self.registry_dir, poll_interval_s=0.05)
        try:
            return {w.worker_id: w.role for w in await reader.snapshot()}
        finally:
            await reader.close()


@asynccontextmanager
async def switchable_split(tmp_path: Path, config_for: Callable[[Path], dict], settings: SimSettings, *,
                           name: str, model: str) -> AsyncIterator[SimSplit]:
    registry_dir = tmp_path / "registry"
    config_path = tmp_path / "proxy.yaml"
    config_path.write_text(yaml.safe_dump(config_for(registry_dir)))
    async with SimCluster(registry=FileRegistry(registry_dir, poll_interval_s=0.05), settings=settings,
                          heartbeat_interval_s=0.2, name=name) as cluster:
        p1 = await cluster.add(WorkerRole.PREFILL, switchable=True, worker_id="p1")
        d1 = await cluster.add(WorkerRole.DECODE, switchable=True, worker_id="d1")
        d2 = await cluster.add(WorkerRole.DECODE, switchable=True, worker_id="d2")
        proxy = ProxyProc(registry_dir, tmp_path, config=config_path).start()
        try:
            await asyncio.to_thread(proxy.wait_ready, model, 180)
            yield SimSplit((p1, d1, d2), proxy, registry_dir)
        finally:
            await asyncio.to_thread(proxy.stop)

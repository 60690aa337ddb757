"""The worker lifecycle as discovery sees it, written once for every worker (the vLLM wrapper, the simulated worker).

``WorkerLifecycle`` takes a registry, the worker's ``RuntimeConfig`` and a probe of its engine; the worker owns its
engine and calls, in order::

    announce()  publish the config as READY, then heartbeat every ``heartbeat_interval_s`` (errors logged, retried)
    drain()     publish DRAINING (routers send nothing new; heartbeats go on, so the entry stays visible), then poll
                the probe until the engine is idle and settled, the timeout passes, or the engine is gone
    leave()     stop heartbeating (after the one in flight), then withdraw; a failed withdraw is logged, not raised
    abandon()   stop heartbeating and withdraw nothing: a crash, whose entry ages out by the backend's TTL

Idle and settled: the probe reports the engine idle (nothing running or waiting) and its count of finished requests
has not moved for ``settle_s``. The window covers requests routed just before routers saw the drain, and prefills whose
KV a decode worker has yet to pull. The first probe of a drain is the baseline: a finished count that moves after it
restarts the window.

Registry calls never overlap (one lock), so a heartbeat in flight cannot land after the DRAINING publish or after the
withdraw it precedes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from litellm_disagg.discovery.registry import RegistryError
from litellm_disagg.runtime_config import RuntimeConfig, WorkerState

logger = logging.getLogger(__name__)


class RegistryWriter(Protocol):
    """The worker side of ``discovery.Registry`` (every registry is one): all a lifecycle calls."""

    async def publish(self, config: RuntimeConfig) -> None: ...

    async def heartbeat(self, worker_id: str) -> None: ...

    async def withdraw(self, worker_id: str) -> None: ...


@dataclass(frozen=True)
class EngineActivity:
    """What a drain needs to know about the engine, at one moment."""

    idle: bool
    """Nothing running or waiting (the simulator also counts KV it holds for a decode worker)."""
    finished: int
    """Requests finished since the engine started: a change means recent activity."""


ActivityProbe = Callable[[], Awaitable[EngineActivity | None]]
"""Asks the engine how busy it is; ``None`` when it cannot answer any more (exited, unreachable): nothing to wait for."""


@dataclass(frozen=True)
class DrainPolicy:
    timeout_s: float = 120.0
    """Longest a drain waits; past it the worker leaves with requests still in flight."""
    settle_s: float = 3.0
    """How long the engine must stay idle, with no request finishing, before the worker leaves."""
    poll_s: float = 0.25
    """Time between two probes."""


class DrainOutcome(StrEnum):
    SETTLED = "settled"
    """The engine went idle and stayed so for ``settle_s``."""
    TIMED_OUT = "timed_out"
    """``timeout_s`` passed first."""
    ENGINE_GONE = "engine_gone"
    """The probe stopped answering (the engine exited): nothing left to wait for."""


class WorkerLifecycle:
    def __init__(
        self,
        registry: RegistryWriter,
        config: RuntimeConfig,
        probe: ActivityProbe,
        *,
        heartbeat_interval_s: float = 2.0,
        drain: DrainPolicy | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        """``clock`` measures the drain's timeout and settle window (tests pass a fake one)."""
        self.registry = registry
        self.config = config.with_state(WorkerState.READY)
        self.probe = probe
        self.heartbeat_interval_s = heartbeat_interval_s
        self.drain_policy = drain or DrainPolicy()
        self.clock = clock
        self._lock = asyncio.Lock()
        self._stop_heartbeats = asyncio.Event()
        self._heartbeat_task: asyncio.Task[None] | None = None
        self._left = False

    @property
    def worker_id(self) -> str:
        return self.config.worker_id

    @property
    def heartbeating(self) -> bool:
        return self._heartbeat_task is not None and not self._heartbeat_task.done()

    async def announce(self) -> None:
        """Publish READY and start heartbeating. A failed publish raises ``RegistryError`` and starts nothing."""
        async with self._lock:
            await self.registry.publish(self.config)
        self._heartbeat_task = asyncio.create_task(self._heartbeats(), name=f"heartbeat-{self.worker_id}")

    async def drain(self, policy: DrainPolicy | None = None) -> DrainOutcome:
        """Publish DRAINING and wait for the engine to settle (``policy`` replaces the lifecycle's for this drain)."""
        policy = policy or self.drain_policy
        logger.info("draining %s", self.worker_id)
        self.config = self.config.with_state(WorkerState.DRAINING)
        try:
            async with self._lock:
                await self.registry.publish(self.config)
        except RegistryError as exc:
            logger.warning("worker %s: could not publish DRAINING (draining anyway): %s", self.worker_id, exc)
        outcome = await self._wait_settled(policy)
        if outcome is DrainOutcome.TIMED_OUT:
            logger.warning(
                "worker %s: drain timeout after %.1fs: leaving with requests still in flight", self.worker_id,
                policy.timeout_s,
            )
        logger.info("drained %s (%s)", self.worker_id, outcome.value)
        return outcome

    async def leave(self) -> None:
        """Stop heartbeating and withdraw (once; later calls do nothing)."""
        if self._left:
            return
        self._left = True
        self._stop_heartbeats.set()
        if self._heartbeat_task is not None:
            await self._heartbeat_task
        try:
            async with self._lock:
                await self.registry.withdraw(self.worker_id)
        except RegistryError as exc:
            logger.warning("worker %s: could not withdraw: %s", self.worker_id, exc)

    async def abandon(self) -> None:
        """Stop heartbeating at once and leave the entry to age out (a crash). Later calls to ``leave`` do nothing."""
        self._left = True
        task, self._heartbeat_task = self._heartbeat_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _heartbeats(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop_heartbeats.wait(), timeout=self.heartbeat_interval_s)
            if self._stop_heartbeats.is_set():
                return
            try:
                async with self._lock:
                    await self.registry.heartbeat(self.worker_id)
            except RegistryError as exc:
                logger.warning("worker %s: heartbeat failed (will retry): %s", self.worker_id, exc)

    async def _wait_settled(self, policy: DrainPolicy) -> DrainOutcome:
        deadline = self.clock() + policy.timeout_s
        idle_since: float | None = None
        last_finished: int | None = None
        while self.clock() < deadline:
            activity = await self.probe()
            if activity is None:
                return DrainOutcome.ENGINE_GONE
            now = self.clock()
            moved = last_finished is not None and activity.finished != last_finished
            last_finished = activity.finished
            if not activity.idle or moved:
                idle_since = None
            elif idle_since is None:
                idle_since = now
            if idle_since is not None and now - idle_since >= policy.settle_s:
                return DrainOutcome.SETTLED
            await asyncio.sleep(policy.poll_s)
        return DrainOutcome.TIMED_OUT

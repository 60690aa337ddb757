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

Role changes (``docs/role-change.md``). When the registry can tell the worker of role requests
(``Registry.role_requests``), ``announce()`` also follows them: a request for another role that the worker's launch can
serve (``RuntimeConfig.can_serve_role``) is applied at once by ``change_role``: the config is republished READY with
the new role (routers stop sending work of the old kind as soon as they see it), then the worker's ``on_role_change``
hook runs (the simulator switches its engine; vLLM launched ``kv_both`` needs nothing). Work of the old role already
in flight simply finishes: the engine serves both kinds at once, and a prefill's KV held for a decode stays until the
decode pulls it (or the engine's abort timeout releases it). A request the launch cannot serve, or one that arrives
while draining, is refused and logged; the worker keeps its role. A drain request (``litellm-disagg drain``) calls the
worker's ``on_drain_request``, once: the worker then drains and leaves as on SIGTERM, and exits or parks (its engine
stopped, the process waiting for SIGTERM) as the request says.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol, runtime_checkable

from litellm_disagg.discovery.registry import RegistryError
from litellm_disagg.discovery.roles import AfterDrain, RoleRequest
from litellm_disagg.runtime_config import RuntimeConfig, WorkerRole, WorkerState
from litellm_disagg.tasks import cancel

logger = logging.getLogger(__name__)


class RegistryWriter(Protocol):
    """The worker side of ``discovery.Registry`` (every registry is one): all a lifecycle calls."""

    async def publish(self, config: RuntimeConfig) -> None: ...

    async def heartbeat(self, worker_id: str) -> None: ...

    async def withdraw(self, worker_id: str) -> None: ...


@runtime_checkable
class RoleRequestSource(Protocol):
    """The part of ``discovery.Registry`` that tells a worker of role requests (every registry has it; the simulator's
    unlisted stand-in and test fakes may not, and then the worker keeps its launch role)."""

    def role_requests(self, worker_id: str) -> AsyncIterator[RoleRequest | None]: ...


RoleChangeHook = Callable[[WorkerRole, WorkerRole], Awaitable[None]]
"""Called with (old role, new role) right after the new role is published."""

DrainRequestHook = Callable[[AfterDrain], None]
"""Called once when a drain request arrives (``litellm-disagg drain``), with what to do after it (exit, or park until
SIGTERM): the worker starts its own way out, as on SIGTERM (``drain()`` then ``leave()``), outside the call: the call
returns at once."""


class RoleChangeRefused(Exception):
    """``change_role`` to a role the worker's launch cannot serve, or while it is not READY."""


@dataclass(frozen=True)
class RoleChange:
    """One applied role change, for logs and measurements."""

    old: WorkerRole
    new: WorkerRole
    published_at: float
    """Unix time the new role was published."""
    requested_at: float | None = None
    """Unix time of the request (the requester's clock), when it came through discovery."""


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


LATE_HEARTBEAT_INTERVALS = 3.0
"""A heartbeat written more than this many intervals after the previous one is logged (a stalled process)."""


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
        on_role_change: RoleChangeHook | None = None,
        on_drain_request: DrainRequestHook | None = None,
        role_retry_s: float = 1.0,
    ):
        """``clock`` measures the drain's timeout and settle window (tests pass a fake one). ``on_role_change`` runs
        after a role change is published; ``on_drain_request`` when a drain request arrives (without one, such a
        request is refused and logged); ``role_retry_s`` is the pause before following role requests again after
        the registry failed."""
        self.registry = registry
        self.config = config.with_state(WorkerState.READY)
        self.probe = probe
        self.heartbeat_interval_s = heartbeat_interval_s
        self.drain_policy = drain or DrainPolicy()
        self.clock = clock
        self.on_role_change = on_role_change
        self.on_drain_request = on_drain_request
        self.drain_requested = False
        """A drain request arrived (``on_drain_request`` was called)."""
        self.role_retry_s = role_retry_s
        self.role_changes: list[RoleChange] = []
        """Every role change applied, oldest first."""
        self._lock = asyncio.Lock()
        self._stop_heartbeats = asyncio.Event()
        self._heartbeat_task: asyncio.Task[None] | None = None
        self._role_task: asyncio.Task[None] | None = None
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
        if isinstance(self.registry, RoleRequestSource):
            self._role_task = asyncio.create_task(self._follow_roles(self.registry), name=f"roles-{self.worker_id}")

    async def change_role(self, role: WorkerRole, *, requested_at: float | None = None) -> RoleChange | None:
        """Publish the config with ``role`` (READY), then run the hook. ``None`` when ``role`` is already the worker's;
        ``RoleChangeRefused`` when its launch cannot serve ``role`` or it is not READY (draining, left). A failed
        publish raises ``RegistryError`` and changes nothing."""
        role = WorkerRole(role)
        async with self._lock:
            old = self.config.role
            if role is old:
                return None
            if self._left or self.config.state is not WorkerState.READY:
                raise RoleChangeRefused(f"worker {self.worker_id} is {self.config.state.value}: keeps role {old.value}")
            if not self.config.can_serve_role(role):
                raise RoleChangeRefused(
                    f"worker {self.worker_id} was not launched to serve {role.value!r} (start it with --switchable)"
                )
            new_config = self.config.with_role(role)
            await self.registry.publish(new_config)
            self.config = new_config
            change = RoleChange(old=old, new=role, published_at=time.time(), requested_at=requested_at)
            self.role_changes.append(change)
        waited = f" {1000 * (change.published_at - requested_at):.0f} ms after the request" if requested_at else ""
        logger.info("worker %s: role %s -> %s published%s", self.worker_id, old.value, role.value, waited)
        if self.on_role_change is not None:
            await self.on_role_change(old, role)
        return change

    async def drain(self, policy: DrainPolicy | None = None) -> DrainOutcome:
        """Publish DRAINING and wait for the engine to settle (``policy`` replaces the lifecycle's for this drain)."""
        policy = policy or self.drain_policy
        logger.info("draining %s", self.worker_id)
        await self._stop_following_roles()  # a draining worker changes role no more
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
        await self._stop_following_roles()
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
        await self._stop_following_roles()
        task, self._heartbeat_task = self._heartbeat_task, None
        await cancel([task])

    async def _stop_following_roles(self) -> None:
        task, self._role_task = self._role_task, None
        await cancel([task])

    async def _follow_roles(self, source: RoleRequestSource) -> None:
        """Apply each role request as it comes; survive registry failures (the worker keeps its role meanwhile)."""
        while not self._left:
            try:
                async for request in source.role_requests(self.worker_id):
                    if request is not None and request.drain:
                        if self._drain_requested(request.after_drain):
                            return  # the worker's drain stops this task; no role changes while it drains
                        continue
                    if request is None or request.role is self.config.role:
                        continue
                    try:
                        await self.change_role(request.role, requested_at=request.requested_at)
                    except RoleChangeRefused as exc:
                        logger.warning("role request refused: %s", exc)
                    except RegistryError as exc:
                        logger.warning("worker %s: could not publish role %s: %s", self.worker_id, request.role.value,
                                       exc)
                        break  # read the request again after the pause, and retry
                else:
                    return  # the registry closed
            except RegistryError as exc:
                logger.warning("worker %s: following role requests failed (will retry): %s", self.worker_id, exc)
            await asyncio.sleep(self.role_retry_s)

    def _drain_requested(self, then: AfterDrain) -> bool:
        """A drain request: hand it to the worker (True), or refuse it when the worker takes none (False)."""
        if self.on_drain_request is None:
            logger.warning("worker %s: drain request refused: this worker drains on SIGTERM only", self.worker_id)
            return False
        if not self.drain_requested:
            self.drain_requested = True
            logger.info("worker %s: drain requested through discovery (then %s)", self.worker_id, then.value)
            self.on_drain_request(then)
        return True

    async def _heartbeats(self) -> None:
        last = self.clock()
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.heartbeat_interval_s):
                    await self._stop_heartbeats.wait()
            if self._stop_heartbeats.is_set():
                return
            due = self.clock()
            try:
                async with self._lock:
                    await self.registry.heartbeat(self.worker_id)
            except RegistryError as exc:
                logger.warning("worker %s: heartbeat failed (will retry): %s", self.worker_id, exc)
                continue
            now = self.clock()
            if now - last > LATE_HEARTBEAT_INTERVALS * self.heartbeat_interval_s:
                # The process (its event loop, or the registry's I/O) stalled: past the registry's TTL, routers drop
                # the worker until the next heartbeat (seen once in CI: a decode worker gone from the proxy for 1 s).
                # The write's own time tells which: a slow write is the registry's I/O, the rest the event loop.
                logger.warning(
                    "worker %s: heartbeat written %.1f s after the previous one (every %g s; the write took %.1f s): "
                    "this process stalled",
                    self.worker_id, now - last, self.heartbeat_interval_s, now - due,
                )
            last = now

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

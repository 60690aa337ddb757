"""The planner loop: lock, collect, decide, act, report, every ``planner.interval_s``.

    PlannerLoop.tick()
        lock.acquire()  ── no ──► standby (leader gauge 0), nothing else
             │ yes
        registry.snapshot() ─► pending flips resolved ─► collector.collect() ─► Planner.step()
             ─► registry.request_role() per move ─► report (log line, metrics) ─► hook (desired sizes changed)

It runs in the proxy process (``start_in_proxy``: the controller's accounting and the proxy's own latency histograms)
or on its own (``litellm-disagg planner``: the workers' pages and the proxies' ``/metrics``). Either way it acts only
through ``Registry.request_role`` (the worker changes its own published role, ``docs/role-change.md``) and the hook.

Pending flips: after a request the worker counts for its new role (``WorkerSignals.pending_role``) until its
published role says so; a worker that has not followed within ``flip_timeout_s``, or that left discovery, is given up
(logged). A refused request (``UnknownWorker``, ``RoleNotServable``, the registry down) is logged and not pending.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from litellm_disagg.discovery.registry import RegistryError
from litellm_disagg.observability import metrics as m
from litellm_disagg.planner.collect import SignalCollector
from litellm_disagg.planner.hook import DesiredHook, HookCall
from litellm_disagg.planner.lock import PlannerLock, holder_name
from litellm_disagg.planner.policy import Planner, PlannerStep, RoleMove
from litellm_disagg.planner.report import PlannerReport
from litellm_disagg.planner.settings import PlannerSettings
from litellm_disagg.runtime_config import RuntimeConfig, WorkerRole
from litellm_disagg.tasks import cancel

if TYPE_CHECKING:
    from litellm_disagg.routing.controller import DisaggController

logger = logging.getLogger("litellm_disagg.planner")


class RoleRegistry(Protocol):
    """What the planner needs from discovery (every ``Registry`` has it)."""

    async def snapshot(self) -> list[RuntimeConfig]: ...

    async def request_role(self, worker_id: str, role: WorkerRole) -> None: ...


@dataclass(frozen=True)
class _Pending:
    role: WorkerRole
    requested_at: float


class PendingFlips:
    """Role requests this planner made that the workers have not published yet."""

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self._pending: dict[str, _Pending] = {}

    def requested(self, worker_id: str, role: WorkerRole, now: float) -> None:
        self._pending[worker_id] = _Pending(role, now)

    def resolve(self, workers: Sequence[RuntimeConfig], now: float) -> dict[str, WorkerRole]:
        """Drop the flips that are done, gone or too late; the rest, as worker id -> requested role."""
        live = {w.worker_id: w for w in workers}
        for worker_id, pending in list(self._pending.items()):
            worker = live.get(worker_id)
            if worker is None:
                logger.warning("planner: worker %s left discovery before taking role %s", worker_id, pending.role)
            elif worker.role is pending.role:
                logger.info("planner: worker %s now serves %s (%.1f s after the request)", worker_id,
                            pending.role, now - pending.requested_at)
            elif now - pending.requested_at > self.timeout_s:
                logger.warning("planner: worker %s has not taken role %s within %.0f s; giving up", worker_id,
                               pending.role, self.timeout_s)
            else:
                continue
            del self._pending[worker_id]
        return {worker_id: p.role for worker_id, p in self._pending.items()}


class PlannerLoop:
    def __init__(
        self,
        settings: PlannerSettings,
        registry: RoleRegistry,
        collector: SignalCollector,
        lock: PlannerLock,
        *,
        clock: Callable[[], float] = time.monotonic,
        hook: DesiredHook | None = None,
        dry_run: bool = False,
    ):
        self.settings = settings
        self.registry = registry
        self.collector = collector
        self.lock = lock
        self.planner = Planner(settings)
        self.pending = PendingFlips(settings.flip_timeout_s)
        self.report = PlannerReport()
        self.hook = hook if hook is not None else (
            DesiredHook(settings.hook_command, timeout_s=settings.hook_timeout_s) if settings.hook_command else None)
        self._clock = clock
        self.dry_run = dry_run
        """Decide, log and count, but never ask a worker to move (a move counts as pending until the flip timeout,
        as if the worker were slow to follow)."""
        self._leader = False
        self._warm = False
        self._task: asyncio.Task[None] | None = None
        self.last_step: PlannerStep | None = None
        self.steps = 0

    @property
    def leader(self) -> bool:
        return self._leader

    async def tick(self) -> PlannerStep | None:
        """One step; None when another planner holds the lock, discovery could not be read, or this is the first
        step since this planner took the lock (its signals are only a baseline then)."""
        leader = await self.lock.acquire()
        if leader != self._leader:
            logger.info("planner %s: %s", holder_name(), "acting (holds the planner lock)" if leader
                        else "standing by (another planner holds the lock)")
            self._leader = leader
            self._warm = False
        m.PLANNER_LEADER.set(1 if leader else 0)
        if not leader:
            return None
        try:
            workers = await self.registry.snapshot()
        except RegistryError as exc:
            logger.warning("planner: discovery unreadable, skipping this step: %s", exc)
            return None
        now = self._clock()
        pending = self.pending.resolve(workers, now)
        signals = await self.collector.collect(now, workers, pending)
        if not self._warm:  # the first collection is only a baseline: a window needs two snapshots
            self._warm = True
            return None
        step = self.planner.step(signals, now)
        for move in step.moves:
            await self._act(move, now)
        for decision in step.decisions:
            self.report.decided(decision, signals.model(decision.model))
            if self.hook is not None:
                self.hook.submit(HookCall(decision.desired, decision.drain))
        self.last_step = step
        self.steps += 1
        return step

    async def _act(self, move: RoleMove, now: float) -> None:
        if self.dry_run:  # counted as pending all the same, so the next steps plan as if it had been asked
            logger.info("planner (dry run): would ask %s to become %s", move.worker_id, move.to_role)
            self.pending.requested(move.worker_id, move.to_role, now)
            return
        try:
            await self.registry.request_role(move.worker_id, move.to_role)
        except RegistryError as exc:  # UnknownWorker, RoleNotServable, the backend down
            logger.warning("planner: role request %s -> %s refused: %s", move.worker_id, move.to_role, exc)
            return
        self.pending.requested(move.worker_id, move.to_role, now)

    async def run(self) -> None:
        m.PLANNER_ENABLED.set(1)
        try:
            while True:
                started = self._clock()
                try:
                    await self.tick()
                except asyncio.CancelledError:
                    raise
                except Exception:  # the planner must never take the proxy down
                    logger.exception("planner step failed; trying again next interval")
                await asyncio.sleep(max(0.0, self.settings.interval_s - (self._clock() - started)))
        finally:
            m.PLANNER_ENABLED.set(0)
            m.PLANNER_LEADER.set(0)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self.run(), name="litellm-disagg-planner")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel([task])
        if self.hook is not None:
            await self.hook.aclose()
        with contextlib.suppress(Exception):
            await self.lock.release()
        self._leader = False
        await self.collector.aclose()


def in_proxy(controller: DisaggController, settings: PlannerSettings, lock: PlannerLock) -> PlannerLoop:
    """The planner of a proxy: the controller's registry, accounting (queued prefill tokens) and, with KV routing,
    its fitted prefill rate; the proxy's own latency histograms."""
    from litellm_disagg.planner.collect import InProcessLatency

    kv = controller.kv
    rate: Callable[[], float | None] | None = None
    if kv is not None:
        def rate() -> float | None:
            return kv.decider.estimates().prefill.tokens_per_s

    collector = SignalCollector(settings, InProcessLatency(), queued_tokens=controller.accounting.prefill_tokens,
                                prefill_rate=rate)
    return PlannerLoop(settings, _ControllerView(controller), collector, lock)


class _ControllerView:
    """The proxy's view of discovery for its planner: the workers the controller admitted (``routing/admission.py``
    already skipped hostile entries), role requests through its registry."""

    def __init__(self, controller: DisaggController):
        self._controller = controller

    async def snapshot(self) -> list[RuntimeConfig]:
        return list(self._controller.pool.workers)

    async def request_role(self, worker_id: str, role: WorkerRole) -> None:
        await self._controller.registry.request_role(worker_id, role)

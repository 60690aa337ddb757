"""The controller: one per LiteLLM router. It wires discovery to routing and keeps both in step.

    registry.watch() -> WorkerPool snapshot -> router deployments (reconcile)
                                       \\-> strategy (picker -> orchestrator -> prefill) on each request

It runs two background loops: the discovery watch (rebuilds the pool on every change) and a keeper that, every
``sync_interval_s``, re-installs the strategy if LiteLLM reset it and re-applies the deployments if something else
(the proxy's own config reconciliation) removed them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from litellm_disagg.discovery.registry import Registry
from litellm_disagg.routing import deployments
from litellm_disagg.routing.kv.router import KVRouter
from litellm_disagg.routing.load import FailureCooldown, InflightTracker
from litellm_disagg.routing.orchestrator import Orchestrator
from litellm_disagg.routing.picker import make_picker
from litellm_disagg.routing.pool import WorkerPool
from litellm_disagg.routing.strategy import DECODE_KEY_PREFIX, DisaggRoutingStrategy
from litellm_disagg.settings import DisaggSettings
from litellm_disagg.transfer.prefill import PrefillClient

logger = logging.getLogger(__name__)


class DisaggController:
    def __init__(self, router: Any, settings: DisaggSettings, registry: Registry):
        self.router = router
        self.settings = settings
        self.registry = registry
        self.pool = WorkerPool()
        self.load = InflightTracker()
        self.cooldown = FailureCooldown(cooldown_s=settings.failure_cooldown_s)
        self.prefill_client = PrefillClient(
            timeout_s=settings.prefill_timeout_s, connect_timeout_s=settings.prefill_connect_timeout_s
        )
        self.orchestrator = Orchestrator(
            prefill_client=self.prefill_client,
            picker=make_picker(settings.picker),
            load=self.load,
            max_attempts=settings.max_prefill_attempts,
            aggregated_fallback=settings.aggregated_fallback,
            cooldown=self.cooldown,
        )
        self.kv = KVRouter(settings.kv_routing, inflight=self.load) if settings.kv_routing.enabled else None
        self.strategy = DisaggRoutingStrategy(
            router=router,
            pool=lambda: self.pool,
            picker=make_picker(settings.picker),
            orchestrator=self.orchestrator,
            load=self.load,
            cooldown=self.cooldown,
            kv=self.kv,
        )
        self._tasks: list[asyncio.Task[None]] = []
        self.pool_changed = asyncio.Event()

    async def start(self) -> None:
        if self.kv is not None:
            await self.kv.start()
        self.keep_installed()
        self._tasks = [asyncio.create_task(self._watch(), name="litellm-disagg-watch"),
                       asyncio.create_task(self._keep(), name="litellm-disagg-keeper")]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        if self.kv is not None:
            await self.kv.stop()
        await self.registry.close()
        await self.prefill_client.aclose()

    def keep_installed(self) -> None:
        if self.strategy.install():
            logger.info("litellm-disagg routing strategy installed on the router")

    def finished(self, call_id: str, *, worker_id: str | None = None, failed: bool = False) -> None:
        """A decode call on ``worker_id`` (when known) ended: LiteLLM's success or failure event. A worker whose call
        failed for the worker's own reasons cools down."""
        ended_on = self.load.finish(DECODE_KEY_PREFIX + call_id, worker_id)
        if self.kv is not None and ended_on is not None:
            self.kv.tokens.finish(DECODE_KEY_PREFIX + call_id)
        failed_worker = worker_id or ended_on
        if failed and failed_worker is not None and self.pool.get(failed_worker) is not None:
            self.cooldown.failed(failed_worker)

    def streamed(self, call_id: str, *, last: bool) -> None:
        """A chunk of a streaming decode call reached the proxy: the prompt is computed (its prefill tokens stop
        counting as queued on the worker); with ``last`` (the chunk with a finish reason) the call is over for the
        worker, before LiteLLM's success event (a background task) says so."""
        key = DECODE_KEY_PREFIX + call_id
        if last:
            self.finished(call_id)
        elif self.kv is not None:
            self.kv.tokens.prefill_done(key)

    def apply(self, pool: WorkerPool) -> None:
        self.pool = pool
        if self.kv is not None:
            self.kv.sync(pool)
        deployments.reconcile(self.router, deployments.desired_deployments(pool, self.settings.model_group))
        self.pool_changed.set()

    async def _watch(self) -> None:
        while True:
            try:
                async for configs in self.registry.watch():
                    self.apply(WorkerPool.of(configs))
                return
            except asyncio.CancelledError:
                raise
            except Exception:  # discovery trouble must never take the proxy down: keep the last snapshot, retry
                logger.exception("discovery watch failed; routing on the last known workers and retrying")
                await asyncio.sleep(1.0)

    async def _keep(self) -> None:
        while True:
            await asyncio.sleep(self.settings.sync_interval_s)
            try:
                self.keep_installed()
                deployments.reconcile(self.router, deployments.desired_deployments(self.pool, self.settings.model_group))
            except Exception:
                logger.exception("keeping the router in step failed; will retry")

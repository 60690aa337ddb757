"""The controller: one per LiteLLM router. It wires discovery to routing and keeps both in step.

    registry.watch() -> WorkerPool snapshot -> router deployments (reconcile)
                                       \\-> strategy (route planner -> orchestrator -> prefill) on each request

It runs two background loops: the discovery watch (rebuilds the pool on every change) and a keeper that, every
``sync_interval_s``, re-installs the strategy if LiteLLM reset it and re-applies the deployments if something else
(the proxy's own config reconciliation) removed them.
"""

from __future__ import annotations

import asyncio
import logging
import random
from typing import TYPE_CHECKING, Any

from litellm_disagg.discovery.registry import Registry
from litellm_disagg.observability.pool_metrics import PoolMetrics
from litellm_disagg.observability.requests import RequestMetrics
from litellm_disagg.routing import deployments
from litellm_disagg.routing.accounting import Accounting, FlightKey
from litellm_disagg.routing.admission import Admission
from litellm_disagg.routing.cooldown import FailureCooldown
from litellm_disagg.routing.kv_release import KVReleases
from litellm_disagg.routing.liveness import Liveness
from litellm_disagg.routing.orchestrator import Orchestrator
from litellm_disagg.routing.pipeline.pipeline import Pipeline
from litellm_disagg.routing.pipeline.profile import PICKER_PROFILES
from litellm_disagg.routing.pipeline.providers import ContextProvider, LoadProvider
from litellm_disagg.routing.pool import WorkerPool
from litellm_disagg.routing.route_plan import RoutePlanner
from litellm_disagg.routing.shared_inflight import SharedInflight
from litellm_disagg.routing.strategy import DisaggRoutingStrategy
from litellm_disagg.routing.worker_auth import load_worker_key
from litellm_disagg.runtime_config import RuntimeConfig
from litellm_disagg.settings import DisaggSettings
from litellm_disagg.tasks import cancel
from litellm_disagg.transfer.prefill import PrefillClient

if TYPE_CHECKING:
    from litellm_disagg.observability.tracing import RequestTracing
    from litellm_disagg.planner.loop import PlannerLoop
    from litellm_disagg.routing.kv.router import KVRouter
    from litellm_disagg.routing.kv.shared_estimates import SharedEstimates

logger = logging.getLogger(__name__)


class DisaggController:
    def __init__(self, router: Any, settings: DisaggSettings, registry: Registry):
        self.router = router
        self.settings = settings
        self.registry = registry
        self.pool = WorkerPool()
        self.worker_key = load_worker_key(settings.worker_auth)
        """The key every call to a worker carries (``routing/worker_auth.py``); never logged."""
        self.admission = Admission(
            settings.admission, model_groups=settings.model_groups, worker_key=bool(self.worker_key)
        )
        kv_settings = settings.kv_routing
        self.accounting = Accounting(max_age_s=kv_settings.load.inflight_max_age_s)
        self.shared_inflight = SharedInflight.for_router(settings.shared_inflight, router, self.accounting)
        """The other proxy replicas' in-flight counts, through Redis (``routing/shared_inflight.py``); None: off."""
        self.cooldown = FailureCooldown(cooldown_s=settings.failure_cooldown_s)
        self.liveness = Liveness(pool=lambda: self.pool)
        """Workers that refuse connections, held out of new work until discovery drops them (``routing/liveness.py``)."""
        self.cooldown.liveness = self.liveness
        self.prefill_client = PrefillClient(
            timeout_s=settings.prefill_timeout_s,
            connect_timeout_s=settings.prefill_connect_timeout_s,
            api_key=self.worker_key.value,
        )
        self.orchestrator = Orchestrator(
            prefill_client=self.prefill_client,
            accounting=self.accounting,
            cooldown=self.cooldown,
            max_attempts=settings.max_prefill_attempts,
            aggregated_fallback=settings.aggregated_fallback,
        )
        self.kv: KVRouter | None = None
        provider: ContextProvider
        if kv_settings.enabled:
            from litellm_disagg.routing.kv.router import KVRouter  # ZMQ and tokenizers only when KV routing is on

            # The worker key goes with the load scraper's pages (its own aiohttp session: a quarter of httpx's CPU per
            # page) and the /tokenize fallback's requests.
            self.kv = provider = KVRouter(
                kv_settings, accounting=self.accounting, worker_headers=self.worker_key.headers() if self.worker_key else None
            )
            prefill_profile, decode_profile = kv_settings.prefill, kv_settings.decode
        else:
            provider = LoadProvider(self.accounting)
            prefill_profile = decode_profile = PICKER_PROFILES[settings.picker]()
        rng = random.Random(kv_settings.seed)
        self.planner = RoutePlanner(
            provider=provider,
            decode=Pipeline(decode_profile, rng=rng),
            prefill=Pipeline(prefill_profile, rng=rng),
            cooldown=self.cooldown,
        )
        strategy_parts: dict[str, Any] = dict(
            router=router,
            pool=lambda: self.pool,
            planner=self.planner,
            orchestrator=self.orchestrator,
            accounting=self.accounting,
        )
        self.tracing: RequestTracing | None = None
        if settings.tracing.enabled:  # the strategy's traced twin (observability/traced.py); off: no tracing code runs
            from litellm_disagg.observability import tracing
            from litellm_disagg.observability.traced import traced_strategy

            self.tracing = tracing.RequestTracing.from_settings(settings.tracing)
            self.strategy = traced_strategy(self.tracing, **strategy_parts)
        else:
            self.strategy = DisaggRoutingStrategy(**strategy_parts)
        self.request_metrics = RequestMetrics(max_age_s=kv_settings.load.inflight_max_age_s)
        self.strategy.requests = self.request_metrics
        self.releases = KVReleases(sender=self.prefill_client, pool=lambda: self.pool, cooldown=self.cooldown)
        self.strategy.releases = self.releases
        self.pool_metrics = PoolMetrics()
        if self.kv is not None:  # the scraped NIXL counters feed the transfer metrics too
            self.kv.scraper.on_transfers = self.pool_metrics.also_count_transfers(self.kv.scraper.on_transfers)
        self.shared_estimates: SharedEstimates | None = None
        """The decision's measurements pooled with the other replicas' (``routing/kv/shared_estimates.py``)."""
        if self.shared_inflight is not None and self.kv is not None and settings.shared_inflight.estimates:
            from litellm_disagg.routing.kv.shared_estimates import SharedEstimates

            self.shared_estimates = SharedEstimates(self.kv.decider, self.shared_inflight.client,
                                                    settings.shared_inflight, replica=self.shared_inflight.replica)
        self._tasks: list[asyncio.Task[None]] = []
        self.pool_changed = asyncio.Event()
        self.planner_loop: PlannerLoop | None = None

    async def start(self) -> None:
        if self.kv is not None:
            await self.kv.start()
        self.keep_installed()
        if self.shared_inflight is not None:
            self.shared_inflight.start()
        if self.shared_estimates is not None:
            self.shared_estimates.start()
        self._tasks = [asyncio.create_task(self._watch(), name="litellm-disagg-watch"),
                       asyncio.create_task(self._keep(), name="litellm-disagg-keeper")]
        if self.settings.planner.enabled:  # the dynamic planner (planner/loop.py); one acts across proxies (its lock)
            from litellm_disagg.planner.lock import make_lock
            from litellm_disagg.planner.loop import in_proxy

            self.planner_loop = in_proxy(self, self.settings.planner,
                                         make_lock(self.settings.registry, self.settings.planner.lock))
            self.planner_loop.start()

    async def stop(self) -> None:
        await cancel(self._tasks)
        self._tasks = []
        if self.planner_loop is not None:
            await self.planner_loop.stop()
            self.planner_loop = None
        if self.shared_estimates is not None:  # before the in-flight exchange, which may close the client
            await self.shared_estimates.stop()
        if self.shared_inflight is not None:
            await self.shared_inflight.stop()
        if self.kv is not None:
            await self.kv.stop()
        await self.registry.close()
        await self.releases.aclose()
        await self.liveness.aclose()
        await self.prefill_client.aclose()
        if self.tracing is not None:
            await self.tracing.aclose()

    def keep_installed(self) -> None:
        if self.strategy.install():
            logger.info("litellm-disagg routing strategy installed on the router")

    def finished(self, call_id: str, *, worker_id: str | None = None, failed: bool = False) -> None:
        """A decode call on ``worker_id`` (when known) ended: LiteLLM's success or failure event. A worker whose call
        failed for the worker's own reasons cools down."""
        self.request_metrics.finished(call_id)
        if self.kv is not None:
            self.kv.decode_watch.ended(call_id)
            self.kv.prefill_seen.ended(call_id)
            self.kv.sessions.ended(call_id)
        ended_on = self.accounting.finish(FlightKey.decode(call_id), worker_id)
        failed_worker = worker_id or ended_on
        if failed and failed_worker is not None and self.pool.get(failed_worker) is not None:
            self.cooldown.failed(failed_worker)

    def call_ended(self, call_id: str, *, worker_id: str | None, failed: bool) -> None:
        """LiteLLM's success or failure event for one attempt of a call: a failed attempt's prefill KV, which no
        decode read, is released (``routing/kv_release.py``)."""
        self.releases.ended(call_id, worker_id=worker_id, failed=failed)

    def routed(self, call_id: str) -> bool:
        """Whether this router chose the worker of the call ``call_id`` (it is in flight under it)."""
        return self.accounting.worker_of(FlightKey.decode(call_id)) is not None

    def streamed(self, call_id: str, *, last: bool) -> None:
        """A chunk of a streaming decode call reached the proxy: the prompt is computed (its prefill tokens stop
        counting as queued on the worker); with ``last`` (the chunk with a finish reason) the call is over for the
        worker, before LiteLLM's success event (a background task) says so."""
        self.request_metrics.chunk(call_id, last=last)
        if self.kv is not None:
            self.kv.decode_watch.chunk(call_id)
            self.kv.prefill_seen.ended(call_id)  # its stream says the prefill is over: no need to see it in events
        self.releases.started(call_id)
        if last:
            self.finished(call_id)
        else:
            self.accounting.prefill_done(FlightKey.decode(call_id))

    def admit(self, configs: list[RuntimeConfig]) -> list[RuntimeConfig]:
        """The entries this router may route to (``routing/admission.py``): allowed models and hosts, and never a
        model group the operator configured by hand."""
        taken = deployments.operator_groups(self.router)
        group = self.settings.model_group
        return self.admission.admit(configs, operator_group=lambda worker: group(worker.model) in taken)

    def apply(self, pool: WorkerPool) -> None:
        self.pool = pool
        self.liveness.sync(pool)
        if self.kv is not None:
            self.kv.sync(pool)
        deployments.reconcile(
            self.router, deployments.desired_deployments(pool, self.settings.model_group, api_key=self.worker_key.value)
        )
        self.pool_metrics.pool_changed(pool)
        self.pool_changed.set()

    async def _watch(self) -> None:
        while True:
            try:
                async for configs in self.registry.watch():
                    self.apply(WorkerPool.of(self.admit(configs)))
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
                deployments.reconcile(
                    self.router,
                    deployments.desired_deployments(self.pool, self.settings.model_group, api_key=self.worker_key.value),
                )
                self.pool_metrics.refresh(self.accounting, self.cooldown, self.kv)
            except Exception:
                logger.exception("keeping the router in step failed; will retry")

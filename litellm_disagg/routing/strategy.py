"""The LiteLLM adapter: a ``CustomRoutingStrategyBase`` that runs a request's plan and returns its decode deployment.

It only translates between LiteLLM's call and our pipeline: LiteLLM's healthy deployments -> the route planner
(``route_plan.py``) -> accounting -> the orchestrator (``orchestrator.py``) -> the decode fields and headers in
LiteLLM's ``request_kwargs``. Model groups that litellm-disagg does not manage are handed back to LiteLLM's own
strategy.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from litellm.types.router import CustomRoutingStrategyBase

from litellm_disagg.log_limit import LogLimit, held_note
from litellm_disagg.routing.accounting import Accounting, FlightKey
from litellm_disagg.routing.deployments import worker_id_of
from litellm_disagg.routing.errors import client_error, passthrough_refused, unavailable
from litellm_disagg.routing.migration import TOKEN_ID_ENGINES
from litellm_disagg.routing.orchestrator import NoPrefillAvailable, Orchestrator
from litellm_disagg.routing.pool import WorkerPool
from litellm_disagg.routing.request import DisaggRequest, is_passthrough, strip_transfer_params
from litellm_disagg.routing.route_plan import NoDecodeWorker, RoutePlanner
from litellm_disagg.transfer.prefill import PrefillRejected

if TYPE_CHECKING:
    from litellm_disagg.observability.requests import RequestMetrics
    from litellm_disagg.routing.kv_release import KVReleases

logger = logging.getLogger(__name__)


class DisaggRoutingStrategy(CustomRoutingStrategyBase):
    def __init__(
        self,
        *,
        router: Any,
        pool: Callable[[], WorkerPool],
        planner: RoutePlanner,
        orchestrator: Orchestrator,
        accounting: Accounting,
    ):
        self._router = router
        self._pool = pool
        self._planner = planner
        self._orchestrator = orchestrator
        self._accounting = accounting
        self.requests: RequestMetrics | None = None
        """Per-request metrics (``observability/requests.py``); the controller sets it."""
        self.releases: KVReleases | None = None
        """Releases prefill KV no decode reads (``routing/kv_release.py``); the controller sets it."""
        self.replace_dead_decode = True
        """After a sequential prefill, decode on another worker when the chosen one died meanwhile
        (``RoutePlanner.replacement_decode``); the soak's before arm turns it off."""
        self.ask_token_ids = False
        """Ask vLLM decode workers for ``return_token_ids`` (request migration continues from them); the plugin sets
        it when migration is on."""
        self._dropped_lines = LogLimit()
        """One "dropped client-supplied" line per model each 30 s: a client can send it with every call."""

    # -- installation ------------------------------------------------------------------------------------------------

    def install(self) -> bool:
        """Install on the router unless already there. Returns True when it (re)installed."""
        if self.installed():
            return False
        self._router.set_custom_routing_strategy(self)
        return True

    def installed(self) -> bool:
        return self._router.__dict__.get("async_get_available_deployment") == self.async_get_available_deployment

    # -- LiteLLM's interface -----------------------------------------------------------------------------------------

    async def async_get_available_deployment(
        self,
        model: str,
        messages: list[dict[str, Any]] | None = None,
        input: str | list[Any] | None = None,
        specific_deployment: bool | None = False,
        request_kwargs: dict[str, Any] | None = None,
    ) -> Any:
        request_kwargs = request_kwargs if request_kwargs is not None else {}
        started = time.monotonic()
        # Whatever happens below, no client-supplied (or stale, on a retry) transfer metadata goes to a worker.
        found = strip_transfer_params(request_kwargs)
        if found and (held := self._dropped_lines.take(model)) is not None:
            logger.warning("dropped client-supplied %s for model %s%s", ", ".join(found), model, held_note(held))
        try:
            healthy = await self._router.async_get_healthy_deployments(
                model=model,
                request_kwargs=request_kwargs,
                messages=messages,
                input=input,
                specific_deployment=specific_deployment,
            )
        except Exception:
            # LiteLLM has every deployment of the group cooling down (after a crash, failures pile up on all of them
            # at once). For our groups the pool knows better: its ready workers, with our own failure cooldown
            # preferring the healthy ones, never refusing the last one.
            healthy = self._own_deployments(model)
            if not healthy:
                raise
        deployments = [healthy] if isinstance(healthy, dict) else list(healthy or [])
        ours = {wid: d for d in deployments if (wid := worker_id_of(d)) is not None}
        if not ours:
            # Not a disaggregated model group: LiteLLM's own strategy decides.
            return await type(self._router).async_get_available_deployment(
                self._router,
                model=model,
                messages=messages,
                input=input,
                specific_deployment=specific_deployment,
                request_kwargs=request_kwargs,
            )
        if is_passthrough(request_kwargs):
            # /vllm/{path}: a raw request to the worker that skips the pre-call hook (no metadata stripping) and
            # cannot be split; refused for disaggregated groups (clients use /v1/chat/completions, /v1/completions).
            raise passthrough_refused(model)
        pool = self._pool()
        candidates = [w for wid in ours if (w := pool.get(wid)) is not None]
        request = DisaggRequest.from_router_call(messages=messages, request_kwargs=request_kwargs)
        chose_at = time.perf_counter()
        try:
            plan = await self._planner.plan(request, pool, candidates)
        except NoDecodeWorker:
            raise unavailable(f"no ready decode worker for model {model!r}", model) from None
        selection_s = time.perf_counter() - chose_at
        decode = plan.decode
        # Counted in flight from the moment it is chosen (not after the prefill), so that requests selected
        # concurrently while prefills run see each other. LiteLLM keeps a call id it is given (else it makes one
        # after selection, too late for us): the success and failure events find this entry by it.
        call_id = request_kwargs.setdefault("litellm_call_id", str(uuid.uuid4()))
        key = FlightKey.decode(call_id)
        self._accounting.start(
            key, decode.worker_id, prefill_tokens=plan.local_prefill_tokens, decode_blocks=plan.decode_blocks,
            pull_tokens=plan.pull_tokens,
        )
        if self.requests is not None:
            self.requests.chosen(call_id, plan)
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "request %s: chosen in %.1f ms: %s",
                request.request_id, (time.perf_counter() - chose_at) * 1e3, plan.explain(),
            )
        try:
            outcome = await self._orchestrator.run(request, plan)
        except PrefillRejected as exc:
            self._accounting.finish(key)
            raise client_error(exc, model) from exc
        except NoPrefillAvailable as exc:
            self._accounting.finish(key)
            raise unavailable(f"no prefill worker could serve model {model!r}: {exc}", model) from exc
        except BaseException:
            self._accounting.finish(key)
            raise
        replacement = (
            self._planner.replacement_decode(plan, self._pool(), candidates, prefill_worker_id=outcome.prefill_worker_id)
            if self.replace_dead_decode
            else None
        )
        if replacement is not None:  # the decode worker died during the prefill: keep the prefill, not the worker
            logger.info("request %s: decode worker %s gone during its prefill; decoding on %s",
                        request.request_id, decode.worker_id, replacement.worker_id)
            plan, decode = replace(plan, decode=replacement), replacement
            self._accounting.finish(key)
            self._accounting.start(key, decode.worker_id, prefill_tokens=plan.local_prefill_tokens,
                                   decode_blocks=plan.decode_blocks, pull_tokens=plan.pull_tokens)
        self._planner.observe(plan, outcome.prefill_worker_id, outcome.prefill_seconds, call_id=call_id)
        if self.requests is not None:
            self.requests.routed(call_id, plan, outcome, started=started, selection_s=selection_s)
        if self.releases is not None:  # a decode that never reads this prefill's KV gets it released
            prefill = pool.get(outcome.prefill_worker_id) if outcome.prefill_worker_id is not None else None
            self.releases.attempt(call_id, decode=decode, prefill=prefill, handle=outcome.transfer)
        request_kwargs.update(outcome.decode_fields)
        if self.ask_token_ids and request_kwargs.get("stream") and decode.engine in TOKEN_ID_ENGINES:
            request_kwargs["return_token_ids"] = True
        headers = dict(request_kwargs.get("extra_headers") or {})
        headers["X-Request-Id"] = request.request_id
        request_kwargs["extra_headers"] = headers
        return ours[decode.worker_id]

    def _own_deployments(self, model: str) -> list[dict[str, Any]]:
        model_list = self._router.get_model_list(model_name=model) or []
        return [d for d in model_list if worker_id_of(d) is not None]

    def get_available_deployment(self, *args: Any, **kwargs: Any) -> Any:
        """Synchronous calls (the proxy makes none for completions) get LiteLLM's own selection, aggregated."""
        return type(self._router).get_available_deployment(self._router, *args, **kwargs)


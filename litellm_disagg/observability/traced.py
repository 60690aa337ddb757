"""The tracing wrappers: the routing strategy, the route planner and the orchestrator, each with its phase's span
around the unchanged original. The controller builds these instead of the plain strategy only when tracing is on, so
decision code carries no tracing and a router without tracing pays nothing.

    TracedRoutingStrategy   opens a trace slot per routing attempt (parent: LiteLLM's span from the call's metadata)
      └── TracedPlanner       route span around RoutePlanner.plan
      └── TracedOrchestrator  prefill span around Orchestrator.run; then the transfer (or decode) span starts
    TraceEvents             LiteLLM's success and failure events: the decode call's first chunk and end

The slot travels from the strategy to the planner and orchestrator it awaits in a ``ContextVar`` owned by this
strategy (one per controller): concurrent requests each see their own.
"""

from __future__ import annotations

import uuid
import weakref
from collections.abc import Sequence
from contextvars import ContextVar
from datetime import datetime
from typing import Any, ClassVar, cast

import litellm
from litellm.integrations.custom_logger import CustomLogger
from litellm.litellm_core_utils.core_helpers import get_parent_otel_span_from_kwargs

from litellm_disagg.observability.tracing import RequestTracing, TraceSlot
from litellm_disagg.routing.accounting import Accounting
from litellm_disagg.routing.orchestrator import Orchestrator, Outcome
from litellm_disagg.routing.pool import WorkerPool
from litellm_disagg.routing.request import DisaggRequest
from litellm_disagg.routing.route_plan import RoutePlan, RoutePlanner
from litellm_disagg.routing.strategy import DisaggRoutingStrategy
from litellm_disagg.runtime_config import RuntimeConfig

Slot = ContextVar[TraceSlot | None]


class TracedPlanner:
    """A ``RoutePlanner`` whose ``plan`` is the route span."""

    def __init__(self, inner: RoutePlanner, tracing: RequestTracing, current: Slot):
        self._inner, self._tracing, self._current = inner, tracing, current

    async def plan(self, request: DisaggRequest, pool: WorkerPool, candidates: Sequence[RuntimeConfig]) -> RoutePlan:
        slot = self._current.get()
        if slot is None:
            return await self._inner.plan(request, pool, candidates)
        self._tracing.route_started(slot, request.request_id)
        plan = await self._inner.plan(request, pool, candidates)
        self._tracing.route_done(slot, plan)
        return plan

    def __getattr__(self, name: str) -> Any:  # observe() and the rest: the planner's own
        return getattr(self._inner, name)


class TracedOrchestrator:
    """An ``Orchestrator`` whose ``run`` is the prefill span."""

    def __init__(self, inner: Orchestrator, tracing: RequestTracing, current: Slot):
        self._inner, self._tracing, self._current = inner, tracing, current

    async def run(self, request: DisaggRequest, plan: RoutePlan) -> Outcome:
        outcome = await self._inner.run(request, plan)
        slot = self._current.get()
        if slot is not None:
            self._tracing.prefill_done(slot, outcome, plan)
        return outcome

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class TraceEvents(CustomLogger):
    """LiteLLM's success and failure events, for the traces: its first-chunk time (``completion_start_time``) and end.

    LiteLLM keeps one callback per class, so one listener serves every live ``RequestTracing`` in the process (as the
    plugin does for its controllers); call ids are unique."""

    _tracings: ClassVar[weakref.WeakSet[RequestTracing]] = weakref.WeakSet()

    @classmethod
    def listen(cls, tracing: RequestTracing) -> None:
        cls._tracings.add(tracing)
        if not any(isinstance(cb, TraceEvents) for cb in litellm.callbacks):
            litellm.callbacks.append(cls())

    @classmethod
    def forget(cls, tracing: RequestTracing) -> None:
        cls._tracings.discard(tracing)
        if not cls._tracings:
            litellm.callbacks[:] = [cb for cb in litellm.callbacks if not isinstance(cb, TraceEvents)]

    async def async_log_success_event(
        self, kwargs: dict[str, Any], response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        call_id = kwargs.get("litellm_call_id")
        if isinstance(call_id, str):
            first, ended = _epoch(kwargs.get("completion_start_time")), _epoch(end_time)
            for tracing in list(self._tracings):
                tracing.finished(call_id, streamed=kwargs.get("stream") is True, first_token_at=first, ended_at=ended)

    async def async_log_failure_event(
        self, kwargs: dict[str, Any], response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        call_id = kwargs.get("litellm_call_id")
        if isinstance(call_id, str):
            error = type(kwargs.get("exception")).__name__ if kwargs.get("exception") is not None else "failed"
            for tracing in list(self._tracings):
                tracing.finished(call_id, ended_at=_epoch(end_time), error=error)


def _epoch(value: object) -> float | None:
    """LiteLLM's event times are naive local ``datetime.now()`` values; ``timestamp()`` reads them as such."""
    return value.timestamp() if isinstance(value, datetime) else None


class TracedRoutingStrategy(DisaggRoutingStrategy):
    """The routing strategy with a trace slot around each routing attempt; installing it also installs the listener
    of LiteLLM's events."""

    def __init__(self, tracing: RequestTracing, current: Slot, **parts: Any):
        super().__init__(**parts)
        self._tracing = tracing
        self._current = current

    def install(self) -> bool:
        TraceEvents.listen(self._tracing)  # back if something reset LiteLLM's callbacks
        return super().install()

    async def async_get_available_deployment(
        self,
        model: str,
        messages: list[dict[str, Any]] | None = None,
        input: str | list[Any] | None = None,
        specific_deployment: bool | None = False,
        request_kwargs: dict[str, Any] | None = None,
    ) -> Any:
        request_kwargs = request_kwargs if request_kwargs is not None else {}
        # The same id the plain strategy would set (setdefault): the stream hook and LiteLLM's events carry it.
        call_id = request_kwargs.setdefault("litellm_call_id", str(uuid.uuid4()))
        slot = self._tracing.slot(call_id, get_parent_otel_span_from_kwargs(request_kwargs))
        token = self._current.set(slot)
        try:
            deployment = await super().async_get_available_deployment(
                model, messages, input, specific_deployment, request_kwargs
            )
        except BaseException as exc:
            self._tracing.failed(slot, exc)
            raise
        finally:
            self._current.reset(token)
        self._tracing.routed(slot)
        return deployment


def traced_strategy(
    tracing: RequestTracing,
    *,
    router: Any,
    pool: Any,
    planner: RoutePlanner,
    orchestrator: Orchestrator,
    accounting: Accounting,
) -> DisaggRoutingStrategy:
    """``DisaggRoutingStrategy(...)``'s traced twin: same parts, the planner and orchestrator wrapped."""
    current: Slot = ContextVar("litellm_disagg_trace_slot", default=None)
    return TracedRoutingStrategy(
        tracing,
        current,
        router=router,
        pool=pool,
        planner=cast(RoutePlanner, TracedPlanner(planner, tracing, current)),
        orchestrator=cast(Orchestrator, TracedOrchestrator(orchestrator, tracing, current)),
        accounting=accounting,
    )

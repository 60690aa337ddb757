"""Traces of a request's phases through OpenTelemetry: off by default; nothing here is imported or run when off.

Per routing attempt (LiteLLM's retries each make a new one) one ``litellm_disagg.request`` span with four phases
under it::

    litellm_disagg.request      child of LiteLLM's proxy span when LiteLLM's ``otel`` callback made one, else a root
    ├── litellm_disagg.route    the route planner: chosen workers, cached tokens, remote-or-local decision
    ├── litellm_disagg.prefill  the orchestrator: the prefill call with failover (short when prefilled locally)
    ├── litellm_disagg.transfer prefill end -> the decode call's first streamed chunk (KV pull, queue, first token)
    └── litellm_disagg.decode   first chunk -> end of the call (no remote prefill: prefill end -> end, with an
                                event ``first_token``)

The decode call's first chunk and end are LiteLLM's own timestamps (``completion_start_time`` and the end time of its
success or failure event), so the spans end when that event arrives, with the times of what happened. A call that
does not stream has no first chunk: one decode span from the prefill's end, with ``litellm_disagg.streamed = false``.
Attributes name workers, roles, modes, token counts and reasons, never prompt data.

Where spans go (``TracingSettings``): with ``otlp_endpoint`` unset, to the process's global tracer provider, which
LiteLLM's own OpenTelemetry integration (``litellm_settings: callbacks: ["otel"]``, ``OTEL_EXPORTER``,
``OTEL_ENDPOINT``) sets up, so our spans land in the same traces as LiteLLM's; with it set, to that OTLP/HTTP endpoint
through a provider of our own. ``RequestTracing`` records; the wrappers that call it at the strategy, planner and
orchestrator boundaries, and the listener of LiteLLM's events, live in ``traced.py``; the controller installs them
only when tracing is on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer

    from litellm_disagg.routing.orchestrator import Outcome
    from litellm_disagg.routing.route_plan import RoutePlan

logger = logging.getLogger(__name__)

TRACER_NAME = "litellm_disagg"
PREFIX = "litellm_disagg."


class TracingSettings(BaseModel):
    """``litellm_disagg: tracing:`` in ``proxy_config.yaml``."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    otlp_endpoint: str | None = None
    """OTLP/HTTP traces URL (``http://collector:4318/v1/traces``). Unset: the global tracer provider, the one
    LiteLLM's ``otel`` callback configures from ``OTEL_EXPORTER``/``OTEL_ENDPOINT`` (recommended: one trace per
    request, LiteLLM's spans and ours)."""
    service_name: str = "litellm-disagg"
    """``service.name`` of our own provider (only with ``otlp_endpoint``; LiteLLM's uses ``OTEL_SERVICE_NAME``)."""
    max_open_s: float = Field(default=900.0, gt=0)
    """A trace whose call never reported its end is closed (status error) after this long."""


@dataclass
class _Trace:
    """One routing attempt's open spans."""

    request: Span
    context: Context
    opened: float
    route: Span | None = None
    prefill: Span | None = None
    waiting: Span | None = None
    """transfer (disaggregated) or decode (aggregated), open until the first chunk or the end."""
    decode: Span | None = None
    remote: bool = False
    """A prefill worker served the prefill (the open span is the transfer)."""
    attrs: dict[str, Any] = field(default_factory=dict)


@dataclass
class TraceSlot:
    """Where one strategy call's trace goes: the wrappers fill it in; empty when the group is not ours."""

    parent: Context | None
    call_id: str
    trace: _Trace | None = None


class RequestTracing:
    """Records the phase spans of routed requests, keyed by LiteLLM's call id between routing and the stream's end."""

    def __init__(self, tracer: Tracer, *, max_open_s: float = 900.0, provider: Any = None):
        from opentelemetry import trace
        from opentelemetry.trace import Status, StatusCode

        self._tracer = tracer
        self._provider = provider  # ours to shut down (only with otlp_endpoint)
        self._trace = trace
        self._error = lambda why: Status(StatusCode.ERROR, why)
        self._max_open_s = max_open_s
        self._open: dict[str, _Trace] = {}
        self._swept = time.monotonic()

    @classmethod
    def from_settings(cls, settings: TracingSettings) -> RequestTracing:
        from opentelemetry import trace

        if settings.otlp_endpoint:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor

            provider = TracerProvider(resource=Resource.create({"service.name": settings.service_name}))
            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=settings.otlp_endpoint)))
            return cls(provider.get_tracer(TRACER_NAME), max_open_s=settings.max_open_s, provider=provider)
        if type(trace.get_tracer_provider()).__name__ == "ProxyTracerProvider":
            logger.warning(
                "tracing is on but no OpenTelemetry tracer provider is set yet: turn on LiteLLM's otel callback "
                "or set litellm_disagg.tracing.otlp_endpoint (spans are dropped until a provider exists)"
            )
        return cls(trace.get_tracer(TRACER_NAME), max_open_s=settings.max_open_s)

    async def aclose(self) -> None:
        """End what is still open; flush and stop our own provider (its export blocks: off the event loop)."""
        from litellm_disagg.observability.traced import TraceEvents

        TraceEvents.forget(self)
        for call_id in list(self._open):
            self._close(self._open.pop(call_id), error="router stopped")
        if self._provider is not None:
            await asyncio.to_thread(self._provider.shutdown)

    # -- the strategy's boundary -------------------------------------------------------------------------------------

    def slot(self, call_id: str, parent_span: object | None) -> TraceSlot:
        """A routing attempt of LiteLLM call ``call_id`` begins; ``parent_span``: LiteLLM's span for it, if any."""
        superseded = self._open.pop(call_id, None)
        if superseded is not None:  # LiteLLM retries the call: the earlier attempt is over
            self._close(superseded, error="retried")
        parent = None
        if parent_span is not None:
            parent = self._trace.set_span_in_context(parent_span)  # type: ignore[arg-type]
        return TraceSlot(parent, call_id)

    def routed(self, slot: TraceSlot) -> None:
        """The strategy returned a deployment: the trace waits for LiteLLM's event of the decode call."""
        if slot.trace is not None:
            self._sweep()
            self._open[slot.call_id] = slot.trace

    def failed(self, slot: TraceSlot, exc: BaseException) -> None:
        """The strategy raised: the attempt ends here (the open phase, route or prefill, records the exception)."""
        t = slot.trace
        if t is None:
            return
        for span in (t.route, t.prefill):
            if span is not None:
                span.record_exception(exc)
        self._close(t, error=type(exc).__name__)

    # -- the planner's and orchestrator's boundaries -----------------------------------------------------------------

    def route_started(self, slot: TraceSlot, request_id: str) -> None:
        request = self._tracer.start_span(
            PREFIX + "request", context=slot.parent, attributes={PREFIX + "request_id": request_id}
        )
        context = self._trace.set_span_in_context(request)
        slot.trace = _Trace(request, context, time.monotonic())
        slot.trace.route = self._tracer.start_span(PREFIX + "route", context=context)

    def route_done(self, slot: TraceSlot, plan: RoutePlan) -> None:
        t = slot.trace
        if t is None or t.route is None:
            return
        decode = plan.decode
        attrs: dict[str, Any] = {
            PREFIX + "model": decode.model,
            PREFIX + "decode.worker_id": decode.worker_id,
            PREFIX + "decode.role": decode.role.value,
            PREFIX + "prefill.candidates": [p.worker_id for p in plan.prefill_order],
            PREFIX + "decision.reason": plan.reason,
            PREFIX + "decode.cached_tokens": plan.cached_tokens.get(decode.worker_id, 0),
        }
        if plan.local_reason is not None:
            attrs[PREFIX + "local_prefill.reason"] = plan.local_reason
        if plan.prefill_order:
            attrs[PREFIX + "prefill.cached_tokens"] = plan.cached_tokens.get(plan.prefill_order[0].worker_id, 0)
        if plan.prompt is not None:
            attrs[PREFIX + "prompt_tokens"] = plan.prompt.num_tokens
        t.route.set_attributes(attrs)
        t.request.set_attributes(attrs)
        t.route.end()
        t.route = None
        t.prefill = self._tracer.start_span(PREFIX + "prefill", context=t.context)

    def prefill_done(self, slot: TraceSlot, outcome: Outcome, plan: RoutePlan) -> None:
        t = slot.trace
        if t is None or t.prefill is None:
            return
        # The same three modes as the metrics' ``mode`` label: a remote prefill, a local one by choice, a fallback.
        if outcome.prefill_worker_id is not None:
            mode = "disaggregated"
        else:
            mode = "local_prefill" if plan.local_reason is not None else "aggregated"
        attrs: dict[str, Any] = {PREFIX + "mode": mode}
        if outcome.prefill_worker_id is not None:
            attrs[PREFIX + "prefill.worker_id"] = outcome.prefill_worker_id
            role = next((p.role.value for p in plan.prefill_order if p.worker_id == outcome.prefill_worker_id), None)
            if role is not None:
                attrs[PREFIX + "prefill.role"] = role
            attrs[PREFIX + "prefill.cached_tokens"] = plan.cached_tokens.get(outcome.prefill_worker_id, 0)
        elif plan.local_reason is None:
            attrs[PREFIX + "fallback.reason"] = outcome.reason
        t.prefill.set_attributes(attrs)
        t.request.set_attributes(attrs)
        t.attrs = {k: v for k, v in attrs.items() if k != PREFIX + "prefill.cached_tokens"} | {
            PREFIX + "decode.worker_id": plan.decode.worker_id,
            PREFIX + "decode.role": plan.decode.role.value,
        }
        t.prefill.end()
        t.prefill = None
        t.remote = outcome.prefill_worker_id is not None
        name = "transfer" if t.remote else "decode"
        t.waiting = self._tracer.start_span(PREFIX + name, context=t.context, attributes=t.attrs)

    # -- the decode call, as LiteLLM's success and failure events tell it (traced.TraceEvents) ------------------------

    def finished(
        self,
        call_id: str,
        *,
        streamed: bool = False,
        first_token_at: float | None = None,
        ended_at: float | None = None,
        error: str | None = None,
    ) -> None:
        """The decode call ended (LiteLLM's event, in the background: times are LiteLLM's, in seconds since the epoch):
        ``first_token_at`` its first streamed chunk, ``ended_at`` its end; ``error`` a failure."""
        t = self._open.pop(call_id, None)
        if t is None:
            return
        end_ns = _ns(ended_at)
        waiting = t.waiting
        if waiting is not None and error is None:
            first_ns = _ns(first_token_at) if streamed else None
            if first_ns is None:
                # Not streamed: one span from the prefill's end to the answer, named for the phase that ends it.
                waiting.update_name(PREFIX + "decode")
                waiting.set_attribute(PREFIX + "streamed", False)
            elif t.remote:
                waiting.end(end_time=max(first_ns, _start_ns(waiting)))  # the transfer ends at the first chunk
                t.waiting = None
                start = max(first_ns, _start_ns(waiting))
                t.decode = self._tracer.start_span(
                    PREFIX + "decode", context=t.context, attributes=t.attrs, start_time=start
                )
            else:
                waiting.add_event("first_token", timestamp=first_ns)
        self._close(t, error=error, end_ns=end_ns)

    def _close(self, t: _Trace, *, error: str | None = None, end_ns: int | None = None) -> None:
        for span in (t.route, t.prefill, t.waiting, t.decode, t.request):
            if span is None:
                continue
            if error is not None:
                span.set_status(self._error(error))
            span.end(end_time=None if end_ns is None else max(end_ns, _start_ns(span)))
        t.route = t.prefill = t.waiting = t.decode = None

    def _sweep(self) -> None:
        now = time.monotonic()
        if now - self._swept < 10.0:
            return
        self._swept = now
        stale = [call_id for call_id, t in self._open.items() if now - t.opened > self._max_open_s]
        for call_id in stale:
            self._close(self._open.pop(call_id), error="no end reported")

    def open_traces(self) -> int:
        return len(self._open)


def _ns(seconds: float | None) -> int | None:
    return None if seconds is None else int(seconds * 1e9)


def _start_ns(span: Span) -> int:
    """When ``span`` started (the SDK's spans say; 0 for a non-recording one)."""
    return getattr(span, "start_time", None) or 0

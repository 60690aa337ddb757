"""Per-request metrics: how a request was served (mode), how long its parts took, where it went.

One ``RequestMetrics`` per controller, keyed by LiteLLM's call id (the same across a call's retries)::

    strategy    routed(call_id, plan, outcome, ...)       after the prefill: mode, route time, workers chosen, tokens
    controller  chunk(call_id, last)                      every streamed chunk: TTFT on the first, ITL between
                finished(call_id, failed, cause)          LiteLLM's success/failure event (or the last chunk)

Times run from when the strategy was first asked for this call (after LiteLLM's auth and pre-call hooks, before the
prefill), so TTFT includes routing and the remote prefill. A non-streamed request has an end-to-end time only.
Entries are bounded by ``max_age_s`` (a lost end event cannot pin memory).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import httpx

from litellm_disagg.observability import metrics as m

if TYPE_CHECKING:
    from litellm_disagg.routing.orchestrator import Outcome
    from litellm_disagg.routing.route_plan import RoutePlan

_ANSWERED = re.compile(r"answered (\d{3})")


def mode_of(plan: RoutePlan, outcome: Outcome) -> str:
    """``disaggregated`` (remote prefill), ``local_prefill`` (the decode worker prefilled by choice) or
    ``aggregated`` (no prefill worker could serve it: a fallback)."""
    if outcome.prefill_worker_id is not None:
        return "disaggregated"
    return "local_prefill" if plan.local_reason is not None else "aggregated"


def local_reason_label(reason: str) -> str:
    """The bounded label (``metrics.LOCAL_REASONS``) for a route plan's free-text local-prefill reason."""
    from litellm_disagg.routing.route_plan import NOT_SPLITTABLE, ONLY_ITSELF

    if reason == NOT_SPLITTABLE:
        return "not_splittable"
    if reason == ONLY_ITSELF:
        return "aggregated_worker"
    if reason == "mode never":
        return "mode_never"
    if reason.startswith("override:"):
        return "threshold"
    if reason.startswith("local ") and "<= remote" in reason:
        return "cost_model"
    return "other"


def failover_cause(exc: BaseException) -> str:
    """The bounded label (``metrics.FAILOVER_CAUSES``) for a ``PrefillUnavailable``."""
    cause = exc.__cause__
    if isinstance(cause, httpx.TimeoutException):
        return "timeout"
    if isinstance(cause, httpx.TransportError):
        return "connection"
    found = _ANSWERED.search(str(exc))
    if found is not None:
        return "overloaded" if found.group(1) == "429" else "server_error"
    return "bad_response"


@dataclass(slots=True)
class _Call:
    model: str
    mode: str
    started: float
    first_chunk: float | None = None
    last_chunk: float | None = None


class RequestMetrics:
    def __init__(self, *, max_age_s: float = 900.0, clock: Callable[[], float] = time.monotonic):
        self.max_age_s = max_age_s
        self._clock = clock
        self._calls: dict[str, _Call] = {}

    def chosen(self, call_id: str, plan: RoutePlan) -> None:
        """A call's workers are chosen, before any prefill runs: its prompt tokens count as arrived (the demand;
        ``routed`` counts them again per worker once the prefill is over, which under a prefill backlog lags the
        arrivals by the queue's wait). A retry of a call that was routed and has not finished is not counted again (one
        whose earlier attempt failed before or after routing is)."""
        if call_id in self._calls or plan.prompt is None or not plan.prompt.num_tokens:
            return
        m.ARRIVED_PROMPT_TOKENS.labels(plan.decode.model).inc(plan.prompt.num_tokens)

    def routed(self, call_id: str, plan: RoutePlan, outcome: Outcome, *, started: float, selection_s: float) -> None:
        """A call's decode worker and prefill are settled. ``started``: this clock's reading when the strategy was
        asked; ``selection_s``: how long choosing the workers took."""
        now = self._clock()
        model = plan.decode.model
        mode = mode_of(plan, outcome)
        call = self._calls.get(call_id)
        if call is None:  # a retry keeps its first start
            self._expire(now)
            call = self._calls[call_id] = _Call(model, mode, started)
        else:
            call.mode = mode
        m.SELECTION.labels(model).observe(max(0.0, selection_s))
        m.ROUTE.labels(model, mode).observe(max(0.0, now - started))
        self._workers(plan, outcome, model)
        if plan.remote_cost_s is not None:
            m.COST_ESTIMATE.labels(model, "remote").observe(plan.remote_cost_s)
        if plan.local_cost_s is not None:
            m.COST_ESTIMATE.labels(model, "local").observe(plan.local_cost_s)
        inputs = plan.decision_inputs
        if inputs is not None and plan.remote_cost_s is not None:  # priced by the cost model: what it saw queued
            m.BACKLOG_TOKENS.labels(model, "remote").observe(inputs.prefill_queued_tokens)
            m.BACKLOG_TOKENS.labels(model, "local").observe(inputs.decode_queued_tokens)
        if mode == "local_prefill" and plan.local_reason is not None:
            m.LOCAL_PREFILLS.labels(model, local_reason_label(plan.local_reason)).inc()
        if outcome.prefill_worker_id is not None and outcome.prefill_seconds is not None:
            m.PREFILL_DURATION.labels(model, outcome.prefill_worker_id).observe(outcome.prefill_seconds)

    def chunk(self, call_id: str, *, last: bool) -> None:
        call = self._calls.get(call_id)
        if call is None:
            return
        now = self._clock()
        if call.first_chunk is None:
            call.first_chunk = now
            m.TTFT.labels(call.model, call.mode).observe(now - call.started)
        elif call.last_chunk is not None:
            m.ITL.labels(call.model, call.mode).observe(now - call.last_chunk)
        call.last_chunk = now
        if last:
            self.finished(call_id)

    def finished(self, call_id: str, *, failed: bool = False, worker_fault: bool = False) -> None:
        call = self._calls.pop(call_id, None)
        if call is None:
            return
        if failed:
            m.REQUEST_FAILURES.labels(call.model, call.mode, "worker" if worker_fault else "other").inc()
        else:
            m.REQUEST_DURATION.labels(call.model, call.mode).observe(self._clock() - call.started)

    def __len__(self) -> int:
        return len(self._calls)

    def _workers(self, plan: RoutePlan, outcome: Outcome, model: str) -> None:
        decode = plan.decode
        chosen = [("decode", decode.worker_id)]
        if outcome.prefill_worker_id is not None:
            chosen.append(("prefill", outcome.prefill_worker_id))
        prompt_tokens = 0 if plan.prompt is None else plan.prompt.num_tokens
        for role, worker_id in chosen:
            m.ROUTED.labels(model, role, worker_id).inc()
            if prompt_tokens:
                m.PROMPT_TOKENS.labels(model, role, worker_id).inc(prompt_tokens)
                cached = min(prompt_tokens, plan.cached_tokens.get(worker_id, 0))
                m.CACHED_PROMPT_TOKENS.labels(model, role, worker_id).inc(cached)

    def _expire(self, now: float) -> None:
        """Insertion order is start order: only the oldest entries can have expired."""
        calls, deadline = self._calls, now - self.max_age_s
        while calls:
            key, call = next(iter(calls.items()))
            if call.started >= deadline:
                return
            del calls[key]

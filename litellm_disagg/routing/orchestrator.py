"""Orchestration: walk one request's ``RoutePlan``: run the prefill with failover, or serve aggregated.

It chooses nothing: the plan's ``prefill_order`` is tried in order (skipping a worker that went into failure cooldown
since, unless only such workers remain) and its engine's transfer protocol builds the prefill request, parses the
answer into a typed handle and gives the fields the decode call carries.

Failure policy:

- prefill 4xx: the request itself is bad; ``PrefillRejected`` propagates so the client gets the error as is;
- prefill 429, 5xx, timeout, connection error, unusable response: the next prefill worker, up to ``max_attempts``;
- nothing left: aggregated (the decode worker computes the prompt itself), counted, unless that is turned off
  or the decode worker cannot compute a prompt (SGLang's decode mode: ``route_plan.serves_alone``), then
  ``NoPrefillAvailable`` (the client's 503; LiteLLM retries).

Concurrent protocols (SGLang's bootstrap rooms, vLLM's push connector: ``TransferProtocol.concurrent``). The decode's fields are known
before the prefill answers (``open_transfer``: the prefill worker's bootstrap address and a fresh room), so the
prefill runs as a background task, counted in ``Accounting`` as a prefill flight, while ``run`` returns at once and
LiteLLM's decode call proceeds; both workers then meet in the room. What a failure does:

- before the prefill starts (no worker left, or only ones in cooldown): as above (the first attempt that can start
  is the one sent; an attempt cannot fail before it is sent);
- the background prefill fails (4xx, 429, 5xx, timeout, connection error): the decode is already on its way with a
  room that no prefill will fill, and the engine would hold it until its own timeout (SGLang: 300 s). The
  orchestrator never lets it wait: it puts the worker in failure cooldown (not for a 4xx) and ends the decode through
  the engine (``abort_decode``: SGLang's ``/abort_request`` with the decode's ``rid``), repeated over
  ``abort_window_s`` because the decode may reach its worker only after the prefill failed (a refused connection
  fails in microseconds; an abort for a request the engine does not know yet is a no-op). The decode call then ends
  with an error, and LiteLLM's retry runs the selection again: a new prefill worker (the failed one sits in cooldown)
  with a new room. Without LiteLLM retries (``num_retries: 0``) the client gets that error.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from litellm_disagg.engines import transfer_for
from litellm_disagg.engines.base import TransferHandle, TransferProtocol
from litellm_disagg.log_limit import LogLimit, held_note
from litellm_disagg.observability import metrics
from litellm_disagg.observability.requests import failover_cause
from litellm_disagg.routing.accounting import Accounting, FlightKey
from litellm_disagg.routing.cooldown import FailureCooldown
from litellm_disagg.routing.request import DisaggRequest
from litellm_disagg.routing.route_plan import RoutePlan, serves_alone
from litellm_disagg.runtime_config import RuntimeConfig
from litellm_disagg.transfer.prefill import PrefillClient, PrefillError, PrefillUnavailable

logger = logging.getLogger(__name__)


class Mode(StrEnum):
    DISAGGREGATED = "disaggregated"
    AGGREGATED = "aggregated"


class NoPrefillAvailable(Exception):
    """Every prefill attempt failed (or none was possible) and aggregated fallback is turned off."""


@dataclass(frozen=True)
class Outcome:
    """What the plan came to: the decode call's mode and the fields it must carry."""

    mode: Mode
    decode: RuntimeConfig
    prefill_worker_id: str | None = None
    transfer: TransferHandle | None = None
    decode_fields: dict[str, Any] = field(default_factory=dict)
    """Keys to merge into LiteLLM's request for the decode call (vLLM: ``kv_transfer_params``)."""
    reason: str = ""
    prefill_seconds: float | None = None


class Orchestrator:
    def __init__(
        self,
        *,
        prefill_client: PrefillClient,
        accounting: Accounting,
        cooldown: FailureCooldown,
        max_attempts: int = 2,
        aggregated_fallback: bool = True,
        abort_window_s: float = 10.0,
        abort_interval_s: float = 0.25,
    ):
        self.prefill_client = prefill_client
        self.accounting = accounting
        self.cooldown = cooldown
        self.max_attempts = max_attempts
        self.aggregated_fallback = aggregated_fallback
        self.abort_window_s = abort_window_s
        """How long a failed concurrent prefill keeps ending its decode (the decode may arrive late)."""
        self.abort_interval_s = abort_interval_s
        self._background: set[asyncio.Task[None]] = set()
        self._fallback_lines = LogLimit()
        """One "serving aggregated" line per model and cause each 30 s: with an empty prefill pool every request falls
        back (``AGGREGATED_FALLBACKS`` counts each one)."""

    async def run(self, request: DisaggRequest, plan: RoutePlan) -> Outcome:
        decode = plan.decode
        if (plan.local_reason is not None or not plan.prefill_order) and not serves_alone(decode):
            # SGLang's decode mode cannot compute a prompt: no aggregated serving there (LiteLLM may retry).
            raise NoPrefillAvailable(f"{decode.worker_id} cannot serve aggregated: {plan.local_reason or plan.reason}")
        if plan.local_reason is not None:
            metrics.REQUESTS.labels(decode.model, "local_prefill").inc()
            logger.debug("prefilling locally on %s: %s", decode.worker_id, plan.local_reason)
            return Outcome(Mode.AGGREGATED, decode, reason=plan.local_reason)
        remaining = list(plan.prefill_order)
        reason = "no prefill worker available"
        cause = "no_prefill_worker"
        for _ in range(self.max_attempts):
            healthy = self.cooldown.prefer_healthy(remaining)
            if not healthy:
                break
            prefill = healthy[0]
            remaining.remove(prefill)
            protocol = transfer_for(prefill)
            if protocol.concurrent:
                return self._start_concurrent(request, plan, prefill, protocol)
            try:
                return await self._prefill(request, plan, prefill)
            except PrefillUnavailable as exc:
                metrics.PREFILL_FAILOVERS.labels(decode.model, prefill.worker_id, failover_cause(exc)).inc()
                cause = "prefill_failed"
                self.cooldown.failed(prefill.worker_id)
                logger.warning("request %s: %s; trying elsewhere", request.request_id, exc)
                reason = str(exc)
        if not self.aggregated_fallback or not serves_alone(decode):
            raise NoPrefillAvailable(reason)
        metrics.REQUESTS.labels(decode.model, Mode.AGGREGATED.value).inc()
        metrics.AGGREGATED_FALLBACKS.labels(decode.model, cause).inc()
        held = self._fallback_lines.take((decode.model, cause))
        if held is not None:
            logger.warning("serving aggregated on %s: %s%s", decode.worker_id, reason, held_note(held))
        return Outcome(Mode.AGGREGATED, decode, reason=reason)

    async def _prefill(self, request: DisaggRequest, plan: RoutePlan, prefill: RuntimeConfig) -> Outcome:
        protocol = transfer_for(prefill)
        body = protocol.prefill_body(
            request.endpoint, prefill.model, request.fields, prefill=prefill, decode=plan.decode
        )
        key = FlightKey.prefill(request.request_id)
        self.accounting.start(key, prefill.worker_id, prefill_tokens=plan.prefill_tokens_on(prefill.worker_id))
        started = time.monotonic()
        try:
            handle = await self.prefill_client.prefill(
                worker=prefill,
                protocol=protocol,
                endpoint=request.endpoint,
                body=body,
                request_id=request.request_id,
                prompt_tokens=plan.prompt.num_tokens if plan.prompt is not None else None,
            )
            self.accounting.prefill_done(key)  # its prompt is computed: seen over (``PrefillProgress``), then ended
        finally:
            self.accounting.finish(key)
        metrics.REQUESTS.labels(plan.decode.model, Mode.DISAGGREGATED.value).inc()
        return Outcome(
            Mode.DISAGGREGATED,
            plan.decode,
            prefill.worker_id,
            handle,
            protocol.decode_fields(handle),
            reason=plan.reason,
            prefill_seconds=time.monotonic() - started,
        )

    # -- concurrent protocols -----------------------------------------------------------------------------------------

    def _start_concurrent(
        self, request: DisaggRequest, plan: RoutePlan, prefill: RuntimeConfig, protocol: TransferProtocol
    ) -> Outcome:
        """Open the transfer, start the prefill in the background, return the decode's fields now."""
        handle = protocol.open_transfer(prefill=prefill, decode=plan.decode, request_id=request.request_id)
        if handle is None:
            raise TypeError(f"concurrent protocol {protocol.name} opened no transfer")
        body = protocol.prefill_body(
            request.endpoint, prefill.model, request.fields, prefill=prefill, decode=plan.decode, handle=handle
        )
        # One flight per attempt: a retry of the same request must not end this one's entry, nor this one the retry's.
        key = FlightKey.prefill(f"{request.request_id}/{uuid.uuid4().hex[:12]}")
        self.accounting.start(key, prefill.worker_id, prefill_tokens=plan.prefill_tokens_on(prefill.worker_id))
        task = asyncio.create_task(
            self._background_prefill(request, plan, prefill, protocol, body, handle, key),
            name=f"prefill-{request.request_id}",
        )
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        metrics.REQUESTS.labels(plan.decode.model, Mode.DISAGGREGATED.value).inc()
        return Outcome(
            Mode.DISAGGREGATED,
            plan.decode,
            prefill.worker_id,
            handle,
            protocol.decode_fields(handle),
            reason=plan.reason,
        )

    async def _background_prefill(
        self,
        request: DisaggRequest,
        plan: RoutePlan,
        prefill: RuntimeConfig,
        protocol: TransferProtocol,
        body: dict[str, Any],
        handle: TransferHandle,
        key: FlightKey,
    ) -> None:
        try:
            await self.prefill_client.prefill(
                worker=prefill,
                protocol=protocol,
                endpoint=request.endpoint,
                body=body,
                request_id=request.request_id,
                handle=handle,
            )
            self.accounting.prefill_done(key)
        except Exception as exc:  # PrefillError, or the client closing under it: either way no KV will come
            if isinstance(exc, PrefillUnavailable):
                metrics.PREFILL_FAILOVERS.labels(plan.decode.model, prefill.worker_id, failover_cause(exc)).inc()
                self.cooldown.failed(prefill.worker_id)
            level = logging.WARNING if isinstance(exc, PrefillError) else logging.ERROR
            logger.log(level, "request %s: concurrent prefill failed (%s); ending its decode", request.request_id, exc)
            self.accounting.finish(key)
            await self._abort_decode(plan.decode, protocol, handle)
        finally:
            self.accounting.finish(key)

    async def _abort_decode(self, decode: RuntimeConfig, protocol: TransferProtocol, handle: TransferHandle) -> None:
        abort = protocol.abort_decode(handle)
        if abort is None:
            return
        path, body = abort
        metrics.DECODE_ABORTS.labels(decode.worker_id).inc()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.abort_window_s
        while True:
            await self.prefill_client.post_control(decode, path, body)
            if loop.time() + self.abort_interval_s > deadline:
                return
            await asyncio.sleep(self.abort_interval_s)

    async def aclose(self) -> None:
        """Cancel the background prefills still running (the router is closing)."""
        tasks = list(self._background)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

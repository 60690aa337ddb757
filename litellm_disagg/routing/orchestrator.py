"""Orchestration: walk one request's ``RoutePlan``: run the prefill with failover, or serve aggregated.

It chooses nothing: the plan's ``prefill_order`` is tried in order (skipping a worker that went into failure cooldown
since, unless only such workers remain) and its engine's transfer protocol builds the prefill request, parses the
answer into a typed handle and gives the fields the decode call carries.

Failure policy:

- prefill 4xx: the request itself is bad; ``PrefillRejected`` propagates so the client gets the error as is;
- prefill 429, 5xx, timeout, connection error, unusable response: the next prefill worker, up to ``max_attempts``;
- nothing left: aggregated (the decode worker computes the prompt itself), counted, unless that is turned off
  (``NoPrefillAvailable``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from litellm_disagg.engines import engine_for
from litellm_disagg.engines.base import TransferHandle
from litellm_disagg.observability import metrics
from litellm_disagg.observability.requests import failover_cause
from litellm_disagg.routing.accounting import Accounting, FlightKey
from litellm_disagg.routing.cooldown import FailureCooldown
from litellm_disagg.routing.request import DisaggRequest
from litellm_disagg.routing.route_plan import RoutePlan
from litellm_disagg.runtime_config import RuntimeConfig
from litellm_disagg.transfer.prefill import PrefillClient, PrefillUnavailable

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
    ):
        self.prefill_client = prefill_client
        self.accounting = accounting
        self.cooldown = cooldown
        self.max_attempts = max_attempts
        self.aggregated_fallback = aggregated_fallback

    async def run(self, request: DisaggRequest, plan: RoutePlan) -> Outcome:
        decode = plan.decode
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
            try:
                return await self._prefill(request, plan, prefill)
            except PrefillUnavailable as exc:
                metrics.PREFILL_FAILOVERS.labels(decode.model, prefill.worker_id, failover_cause(exc)).inc()
                cause = "prefill_failed"
                self.cooldown.failed(prefill.worker_id)
                logger.warning("request %s: %s; trying elsewhere", request.request_id, exc)
                reason = str(exc)
        if not self.aggregated_fallback:
            raise NoPrefillAvailable(reason)
        metrics.REQUESTS.labels(decode.model, Mode.AGGREGATED.value).inc()
        metrics.AGGREGATED_FALLBACKS.labels(decode.model, cause).inc()
        logger.warning("serving aggregated on %s: %s", decode.worker_id, reason)
        return Outcome(Mode.AGGREGATED, decode, reason=reason)

    async def _prefill(self, request: DisaggRequest, plan: RoutePlan, prefill: RuntimeConfig) -> Outcome:
        protocol = engine_for(prefill).transfer
        body = protocol.prefill_body(
            request.endpoint, prefill.model, request.fields, prefill=prefill, decode=plan.decode
        )
        key = FlightKey.prefill(request.request_id)
        self.accounting.start(key, prefill.worker_id, prefill_tokens=plan.prefill_tokens_on(prefill.worker_id))
        started = time.monotonic()
        try:
            handle = await self.prefill_client.prefill(
                worker=prefill, protocol=protocol, endpoint=request.endpoint, body=body, request_id=request.request_id
            )
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

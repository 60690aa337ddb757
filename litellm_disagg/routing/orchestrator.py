"""Orchestration of one request: pick a prefill worker, run the prefill, return what the decode call needs.

Failure policy:

- prefill 4xx: the request itself is bad; ``PrefillRejected`` propagates so the client gets the error as is;
- prefill 5xx, timeout, connection error, unusable response: the next prefill worker, up to ``max_attempts``;
- nothing left: aggregated (the decode worker computes the prompt itself), counted, unless that is turned off.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from prometheus_client import Counter

from litellm_disagg.routing.load import FailureCooldown, InflightTracker
from litellm_disagg.routing.picker import Picker
from litellm_disagg.routing.pool import WorkerPool
from litellm_disagg.routing.request import DisaggRequest
from litellm_disagg.runtime_config import RuntimeConfig
from litellm_disagg.transfer.prefill import PrefillClient, PrefillUnavailable
from litellm_disagg.transfer.vllm import KVTransferParams, build_prefill_body

logger = logging.getLogger(__name__)

ROUTED = Counter("litellm_disagg_requests_total", "Requests routed, by mode", ["model", "mode"])
PREFILL_FAILURES = Counter("litellm_disagg_prefill_failures_total", "Prefill attempts that failed over", ["worker_id"])


class Mode(StrEnum):
    DISAGGREGATED = "disaggregated"
    AGGREGATED = "aggregated"


class NoPrefillAvailable(Exception):
    """Every prefill attempt failed (or none was possible) and aggregated fallback is turned off."""


@dataclass(frozen=True)
class DecodePlan:
    mode: Mode
    decode: RuntimeConfig
    prefill_worker_id: str | None = None
    transfer: KVTransferParams | None = None
    reason: str = ""
    prefill_seconds: float | None = None


class Orchestrator:
    def __init__(
        self,
        *,
        prefill_client: PrefillClient,
        picker: Picker,
        load: InflightTracker,
        max_attempts: int = 2,
        aggregated_fallback: bool = True,
        cooldown: FailureCooldown | None = None,
    ):
        self.prefill_client = prefill_client
        self.picker = picker
        self.load = load
        self.max_attempts = max_attempts
        self.aggregated_fallback = aggregated_fallback
        self.cooldown = cooldown or FailureCooldown()

    async def plan(
        self,
        pool: WorkerPool,
        request: DisaggRequest,
        decode: RuntimeConfig,
        *,
        prefill_order: Sequence[RuntimeConfig] | None = None,
        local_reason: str | None = None,
    ) -> DecodePlan:
        """``prefill_order``: prefill workers to try, best first (default: the picker's choice each attempt).
        ``local_reason``: prefill locally by choice (conditional disaggregation decided so), not as a fallback."""
        if not request.splittable:
            return self._aggregated(decode, "request has several prompts or completions")
        if local_reason is not None:
            ROUTED.labels(decode.model, Mode.AGGREGATED.value).inc()
            logger.debug("prefilling locally on %s: %s", decode.worker_id, local_reason)
            return DecodePlan(Mode.AGGREGATED, decode, reason=local_reason)
        ranked = list(prefill_order) if prefill_order is not None else None
        tried: list[str] = [decode.worker_id]  # a worker never prefills for itself: that is just aggregated serving
        reason = "no prefill worker available"
        for _ in range(self.max_attempts):
            candidates = self.cooldown.prefer_healthy(pool.prefill_candidates(decode.model, exclude=tried))
            if ranked is not None:
                allowed = {c.worker_id for c in candidates}
                prefill = next((w for w in ranked if w.worker_id in allowed), None)
            else:
                prefill = self.picker.pick(candidates, self.load)
            if prefill is None:
                break
            tried.append(prefill.worker_id)
            body = build_prefill_body(request.endpoint, prefill.model, request.fields)
            key = f"{request.request_id}:prefill"
            self.load.start(key, prefill.worker_id)
            started = time.monotonic()
            try:
                transfer = await self.prefill_client.prefill(
                    worker_id=prefill.worker_id,
                    base_url=prefill.base_url,
                    endpoint=request.endpoint,
                    body=body,
                    request_id=request.request_id,
                )
            except PrefillUnavailable as exc:
                PREFILL_FAILURES.labels(prefill.worker_id).inc()
                self.cooldown.failed(prefill.worker_id)
                logger.warning("request %s: %s; trying elsewhere", request.request_id, exc)
                reason = str(exc)
                continue
            finally:
                self.load.finish(key)
            ROUTED.labels(decode.model, Mode.DISAGGREGATED.value).inc()
            return DecodePlan(Mode.DISAGGREGATED, decode, prefill.worker_id, transfer,
                              prefill_seconds=time.monotonic() - started)
        if not self.aggregated_fallback:
            raise NoPrefillAvailable(reason)
        return self._aggregated(decode, reason)

    def _aggregated(self, decode: RuntimeConfig, reason: str) -> DecodePlan:
        ROUTED.labels(decode.model, Mode.AGGREGATED.value).inc()
        logger.warning("serving aggregated on %s: %s", decode.worker_id, reason)
        return DecodePlan(Mode.AGGREGATED, decode, reason=reason)

"""Routing in the simulation: the product's own selection pipeline, fed the simulated loads.

Per request, as ``litellm_disagg.routing.route_plan.RoutePlanner.plan`` does it with KV routing off:

- decode pool: ``filters.routable`` + ``filters.role(DECODE)`` (decode and both workers), then the
  ``least_inflight`` profile (``load`` scorer: fewest requests in flight, ties rotate): least-loaded decode;
- prefill pool: ``filters.role(PREFILL)`` (prefill and both) minus the decode worker, then the KV prefill profile
  (``kv_cost`` with only its prefill term: fewest prompt blocks queued there): least-queued prefill;
- remote or local: a ``both`` decode worker serves the whole request itself (aggregated serving, as
  ``disaggregation.mode: never`` or the cost model choosing local); a ``decode`` worker gets its prompt from the
  chosen prefill worker, or computes it itself when no prefill worker exists (the product's aggregated fallback).

The loads are ``WorkerLoad`` snapshots built from the simulation's exact in-flight figures (what one router's
``Accounting`` holds: requests in flight, prompt tokens queued for prefill, decode blocks), not scraped metrics.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from litellm_disagg.routing.kv.load_scraper import NOT_SCRAPED
from litellm_disagg.routing.pipeline import filters
from litellm_disagg.routing.pipeline.context import ScoringContext, WorkerLoad
from litellm_disagg.routing.pipeline.pipeline import Pipeline
from litellm_disagg.routing.pipeline.profile import kv_prefill_profile, least_inflight_profile
from litellm_disagg.runtime_config import RuntimeConfig, VllmNixlTransfer, WorkerRole, WorkerState

MODEL = "sim-model"


def runtime_config(worker_id: str, role: WorkerRole, index: int, capacity_blocks: int, block_size: int) -> RuntimeConfig:
    """What a simulated worker would publish (its address is never used: nothing here speaks HTTP)."""
    return RuntimeConfig(
        worker_id=worker_id,
        model=MODEL,
        role=role,
        base_url=f"http://127.0.0.1:{9000 + index}/v1",
        transfer=VllmNixlTransfer(host="127.0.0.1", port=19000 + index),
        kv_capacity_blocks=capacity_blocks,
        block_size=block_size,
        state=WorkerState.READY,
        started_at=0.0,
    )


@dataclass(frozen=True)
class Route:
    decode: str
    prefill: str | None
    """None: the decode worker computes the prompt itself."""


class Router:
    def __init__(self, seed: int = 0):
        self.decode = Pipeline(least_inflight_profile(), rng=random.Random(seed))
        self.prefill = Pipeline(kv_prefill_profile(), rng=random.Random(seed + 1))
        self._decode_role = filters.role(WorkerRole.DECODE)
        self._prefill_role = filters.role(WorkerRole.PREFILL)

    def route(self, prompt_tokens: int, workers: Sequence[RuntimeConfig], loads: Mapping[str, WorkerLoad]) -> Route | None:
        """``workers``: the routable workers (a flipping worker is left out by the caller). None: nobody can decode."""
        ctx = ScoringContext(prompt_tokens=prompt_tokens, cached_tokens={}, loads=loads)
        decode_candidates = self._decode_role(workers)
        if not decode_candidates:
            return None
        chosen = self.decode.select(ctx, decode_candidates).worker or decode_candidates[0]
        if chosen.role is WorkerRole.BOTH:
            return Route(chosen.worker_id, None)
        prefill_candidates = filters.excluded((chosen.worker_id,))(self._prefill_role(workers))
        picked = self.prefill.select(ctx, prefill_candidates).worker
        return Route(chosen.worker_id, picked.worker_id if picked is not None else None)


def load(worker_id: str, capacity: int, requests: int, prefill_tokens: int, decode_blocks: int) -> WorkerLoad:
    return WorkerLoad(worker_id, capacity, requests, prefill_tokens, decode_blocks, NOT_SCRAPED)

"""``kv_cost``: a Dynamo-style additive cost in blocks, relative (``(lowest + 1) / (cost + 1)``).

    prefill * (uncached blocks of this prompt + blocks queued for prefill there)
      + decode * KV blocks in use there + active * requests running or queued there

The weights of the three terms (``CostWeights``) come from the pool's profile. ``costs()`` keeps the terms, so a
selection can explain itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

from litellm_disagg.routing.pipeline.context import ScoringContext, WorkerLoad
from litellm_disagg.routing.pipeline.profile import CostWeights
from litellm_disagg.routing.pipeline.scorers.base import relative
from litellm_disagg.runtime_config import RuntimeConfig


class CostTerms(NamedTuple):
    uncached_blocks: int
    queued_prefill_blocks: int
    used_blocks: float
    active_requests: float
    total: float


def kv_cost(ctx: ScoringContext, worker: RuntimeConfig, weights: CostWeights) -> CostTerms:
    size = worker.block_size
    wid = worker.worker_id
    load = ctx.loads.get(wid) or WorkerLoad(wid, worker.kv_capacity_blocks)
    uncached = -(-max(0, ctx.prompt_tokens - ctx.cached_tokens.get(wid, 0)) // size)
    queued = -(-load.inflight_prefill_tokens // size)
    used = load.used_blocks
    active = load.active_requests
    total = weights.prefill * (uncached + queued) + weights.decode * used + weights.active * active
    return CostTerms(uncached, queued, used, active, total)


class KVCostScorer:
    name = "kv_cost"

    def __init__(self, weights: CostWeights):
        self.weights = weights

    def costs(self, ctx: ScoringContext, candidates: Sequence[RuntimeConfig]) -> dict[str, CostTerms]:
        """``{worker_id: kv_cost(ctx, worker, weights)}``, written out (the same arithmetic in the same order; no call
        and no Python-level named-tuple constructor per candidate: dozens run per decision)."""
        weights = self.weights
        w_prefill, w_decode, w_active = weights.prefill, weights.decode, weights.active
        prompt_tokens = ctx.prompt_tokens
        cached = ctx.cached_tokens.get
        loads = ctx.loads.get
        make = tuple.__new__
        out: dict[str, CostTerms] = {}
        for worker in candidates:
            wid = worker.worker_id
            size = worker.block_size
            load = loads(wid) or WorkerLoad(wid, worker.kv_capacity_blocks)
            left = prompt_tokens - cached(wid, 0)
            uncached = -(-(left if left > 0 else 0) // size)  # max(0, left), ceil-divided
            queued = -(-load.inflight_prefill_tokens // size)
            used = load.used_blocks
            active = load.active_requests
            total = w_prefill * (uncached + queued) + w_decode * used + w_active * active
            out[wid] = make(CostTerms, (uncached, queued, used, active, total))
        return out

    def score(self, ctx: ScoringContext, candidates: Sequence[RuntimeConfig]) -> dict[str, float]:
        return self.scores_of(self.costs(ctx, candidates))

    @staticmethod
    def scores_of(costs: Mapping[str, CostTerms]) -> dict[str, float]:
        return relative({wid: terms.total for wid, terms in costs.items()})

"""``kv_cost``: a Dynamo-style additive cost in blocks, relative (``(lowest + 1) / (cost + 1)``).

    prefill * (uncached blocks of this prompt + blocks queued for prefill there)
      + decode * KV blocks in use there + active * requests running or queued there

Blocks queued for prefill are the worker's in-flight prefill tokens, less those estimated computed already where the
context carries that estimate (``ScoringContext.prefill_computed``, ``kv_routing.load.prefill_progress``). The
weights of the three terms (``CostWeights``) come from the pool's profile. ``costs()`` keeps the terms, so a
selection can explain itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

from litellm_disagg.routing.pipeline.context import Figures, ScoringContext, WorkerLoad
from litellm_disagg.routing.pipeline.profile import CostWeights
from litellm_disagg.routing.pipeline.scorers.base import relative, relative_values
from litellm_disagg.runtime_config import RuntimeConfig


class CostTerms(NamedTuple):
    uncached_blocks: int
    queued_prefill_blocks: int
    used_blocks: float
    active_requests: float
    total: float


class CostColumns(NamedTuple):
    """``CostTerms`` of many candidates, one list per term, in candidate order."""

    uncached_blocks: list[int]
    queued_prefill_blocks: list[int]
    used_blocks: list[float]
    active_requests: list[float]
    total: list[float]


def kv_cost(ctx: ScoringContext, worker: RuntimeConfig, weights: CostWeights) -> CostTerms:
    size = worker.block_size
    wid = worker.worker_id
    load = ctx.loads.get(wid) or WorkerLoad(wid, worker.kv_capacity_blocks)
    uncached = -(-max(0, ctx.prompt_tokens - ctx.cached_tokens.get(wid, 0)) // size)
    queued = -(-ctx.queued_prefill_tokens(wid, load.inflight_prefill_tokens) // size)
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
        queued_of = ctx.queued_prefill_tokens
        make = tuple.__new__
        out: dict[str, CostTerms] = {}
        for worker in candidates:
            wid = worker.worker_id
            size = worker.block_size
            load = loads(wid) or WorkerLoad(wid, worker.kv_capacity_blocks)
            left = prompt_tokens - cached(wid, 0)
            uncached = -(-(left if left > 0 else 0) // size)  # max(0, left), ceil-divided
            queued = -(-queued_of(wid, load.inflight_prefill_tokens) // size)
            used = load.used_blocks
            active = load.active_requests
            total = w_prefill * (uncached + queued) + w_decode * used + w_active * active
            out[wid] = make(CostTerms, (uncached, queued, used, active, total))
        return out

    def columns(
        self, ctx: ScoringContext, candidates: Sequence[RuntimeConfig], figures: Sequence[Figures]
    ) -> CostColumns:
        """``costs()`` as five lists in candidate order (``figures``: ``ctx.figures_of(candidates)``): the same
        arithmetic in the same order, no tuple per candidate."""
        weights = self.weights
        w_prefill, w_decode, w_active = weights.prefill, weights.decode, weights.active
        prompt_tokens = ctx.prompt_tokens
        cached = ctx.cached_tokens.get
        computed = ctx.prefill_computed or {}
        uncached_l: list[int] = []
        queued_l: list[int] = []
        total_l: list[float] = []
        for worker, (active, used, _free, queued_tokens) in zip(candidates, figures, strict=True):
            size = worker.block_size
            wid = worker.worker_id
            left = prompt_tokens - cached(wid, 0)
            uncached = -(-(left if left > 0 else 0) // size)  # max(0, left), ceil-divided
            if queued_tokens and computed:
                queued_tokens -= computed.get(wid, 0)
                if queued_tokens < 0:
                    queued_tokens = 0
            queued = -(-queued_tokens // size)
            uncached_l.append(uncached)
            queued_l.append(queued)
            total_l.append(w_prefill * (uncached + queued) + w_decode * used + w_active * active)
        return CostColumns(uncached_l, queued_l, [f[1] for f in figures], [f[0] for f in figures], total_l)

    def values(
        self, ctx: ScoringContext, candidates: Sequence[RuntimeConfig], figures: Sequence[Figures]
    ) -> list[float]:
        return relative_values(self.columns(ctx, candidates, figures).total)

    def score(self, ctx: ScoringContext, candidates: Sequence[RuntimeConfig]) -> dict[str, float]:
        return self.scores_of(self.costs(ctx, candidates))

    @staticmethod
    def scores_of(costs: Mapping[str, CostTerms]) -> dict[str, float]:
        return relative({wid: terms.total for wid, terms in costs.items()})

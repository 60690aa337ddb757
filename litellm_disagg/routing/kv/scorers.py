"""Scorers: each rates every candidate worker for one request, 1 best, 0 worst. Stateless and without I/O.

    Scorer.score(ctx, candidates) -> {worker_id: float in [0, 1]}

The selection (``selection.py``) clamps each score to [0, 1] and sums ``score * weight`` with weights from the pool's
profile, so one scorer can weigh differently for prefill and for decode workers.

| name               | score                                                          | reads              |
|--------------------|----------------------------------------------------------------|--------------------|
| ``prefix_overlap`` | cached prompt tokens / prompt tokens                           | prefix index       |
| ``load``           | ``(fewest + 1) / (active + 1)``: requests running or queued     | in-flight, scraped |
| ``kv_free``        | fraction of the worker's KV cache not in use                   | in-flight, scraped |
| ``kv_cost``        | ``(lowest + 1) / (cost + 1)`` of the additive cost below       | all of the above   |

The cost, in blocks (``CostWeights`` from the profile)::

    prefill * (uncached blocks of this prompt + blocks queued for prefill there)
      + decode * KV blocks in use there + active * requests running or queued there

``load`` and ``kv_cost`` are relative (the best candidate scores 1, others by ratio), so they mean the same whatever
the cluster's size; ``prefix_overlap`` and ``kv_free`` are absolute.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from litellm_disagg.routing.kv.settings import CostWeights, ProfileSettings, ScorerName
from litellm_disagg.routing.kv.worker_load import WorkerLoad
from litellm_disagg.runtime_config import RuntimeConfig


@dataclass(frozen=True)
class ScoringContext:
    """What the scorers know about one request and the candidates' state."""

    prompt_tokens: int
    cached_tokens: Mapping[str, int]
    """Per worker: leading prompt tokens its prefix cache can serve (``usable_cached_tokens``); absent means 0."""
    loads: Mapping[str, WorkerLoad]

    def cached(self, worker_id: str) -> int:
        return self.cached_tokens.get(worker_id, 0)

    def load(self, worker: RuntimeConfig) -> WorkerLoad:
        found = self.loads.get(worker.worker_id)
        return found if found is not None else WorkerLoad(worker.worker_id, worker.kv_capacity_blocks)

    def loads_of(self, candidates: Sequence[RuntimeConfig]) -> list[WorkerLoad]:
        """``[load(w) for w in candidates]``, in one pass."""
        get = self.loads.get
        return [
            found if (found := get(w.worker_id)) is not None else WorkerLoad(w.worker_id, w.kv_capacity_blocks)
            for w in candidates
        ]


def usable_cached_tokens(cached_blocks: int, block_size: int, prompt_tokens: int) -> int:
    """Tokens a worker holding ``cached_blocks`` leading blocks can skip: vLLM computes at least the last prompt
    token, so a hit never covers the prompt's last block when the prompt fills it exactly."""
    if prompt_tokens <= 0:
        return 0
    limit = (prompt_tokens - 1) // block_size
    return (limit if limit < cached_blocks else cached_blocks) * block_size  # min(cached_blocks, limit)


class Scorer(Protocol):
    name: ScorerName

    def score(self, ctx: ScoringContext, candidates: Sequence[RuntimeConfig]) -> dict[str, float]: ...


class PrefixOverlapScorer:
    name: ScorerName = "prefix_overlap"

    def score(self, ctx: ScoringContext, candidates: Sequence[RuntimeConfig]) -> dict[str, float]:
        prompt_tokens = ctx.prompt_tokens
        if prompt_tokens <= 0:
            return {w.worker_id: 0.0 for w in candidates}
        cached = ctx.cached_tokens.get
        return {w.worker_id: cached(w.worker_id, 0) / prompt_tokens for w in candidates}


class LoadScorer:
    name: ScorerName = "load"

    def score(self, ctx: ScoringContext, candidates: Sequence[RuntimeConfig]) -> dict[str, float]:
        active = {
            w.worker_id: load.active_requests for w, load in zip(candidates, ctx.loads_of(candidates), strict=True)
        }
        return _relative(active)


class KVFreeScorer:
    name: ScorerName = "kv_free"

    def score(self, ctx: ScoringContext, candidates: Sequence[RuntimeConfig]) -> dict[str, float]:
        return {
            w.worker_id: load.free_kv_fraction for w, load in zip(candidates, ctx.loads_of(candidates), strict=True)
        }


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
    name: ScorerName = "kv_cost"

    def __init__(self, weights: CostWeights):
        self.weights = weights

    def costs(self, ctx: ScoringContext, candidates: Sequence[RuntimeConfig]) -> dict[str, CostTerms]:
        weights = self.weights
        return {w.worker_id: kv_cost(ctx, w, weights) for w in candidates}

    def score(self, ctx: ScoringContext, candidates: Sequence[RuntimeConfig]) -> dict[str, float]:
        return self.scores_of(self.costs(ctx, candidates))

    @staticmethod
    def scores_of(costs: Mapping[str, CostTerms]) -> dict[str, float]:
        return _relative({wid: terms.total for wid, terms in costs.items()})


def _relative(costs: Mapping[str, float]) -> dict[str, float]:
    """Lowest cost scores 1, the others ``(lowest + 1) / (cost + 1)``."""
    if not costs:
        return {}
    top = min(costs.values()) + 1.0
    return {wid: top / (cost + 1.0) for wid, cost in costs.items()}


def make_scorer(name: ScorerName, profile: ProfileSettings) -> Scorer:
    if name == "prefix_overlap":
        return PrefixOverlapScorer()
    if name == "load":
        return LoadScorer()
    if name == "kv_free":
        return KVFreeScorer()
    if name == "kv_cost":
        return KVCostScorer(profile.cost)
    raise ValueError(f"unknown scorer {name!r}")

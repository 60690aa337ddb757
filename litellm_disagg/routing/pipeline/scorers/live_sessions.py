"""``live_sessions``: the work a worker is expected to be asked to continue, for a request no cache can serve.

Instantaneous load cannot see that a worker already holds many live conversations, each of which will come back
with its next turn (and be routed there by its cache). For a request without a cache hit (no candidate caches
``min_hit_fraction`` of the prompt more than another: a new conversation, a cold document) this scores
``(fewest + 1) / (live + 1)`` over the candidates' live sessions (``ScoringContext.live_sessions``), so new
conversations spread by how many each worker is serving, as an oracle that balances conversations would. With a
cache hit it is neutral (1 everywhere): the cache and the load decide.
"""

from __future__ import annotations

from collections.abc import Sequence

from litellm_disagg.routing.pipeline.context import Figures, ScoringContext
from litellm_disagg.routing.pipeline.profile import SessionSettings
from litellm_disagg.routing.pipeline.scorers.base import relative, relative_values
from litellm_disagg.runtime_config import RuntimeConfig


class LiveSessionsScorer:
    name = "live_sessions"

    def __init__(self, settings: SessionSettings):
        self.min_hit_fraction = settings.min_hit_fraction

    def has_cache_hit(self, ctx: ScoringContext, candidates: Sequence[RuntimeConfig]) -> bool:
        if ctx.prompt_tokens <= 0 or not ctx.cached_tokens:
            return False
        get = ctx.cached_tokens.get
        cached = [get(w.worker_id, 0) for w in candidates]
        return (max(cached) - min(cached)) >= self.min_hit_fraction * ctx.prompt_tokens

    # The cache hit is checked first: the next-turn expectation (``sessions.expect: next_turns``) is computed on
    # first use, and only a request no worker has cached needs it.
    def score(self, ctx: ScoringContext, candidates: Sequence[RuntimeConfig]) -> dict[str, float]:
        if self.has_cache_hit(ctx, candidates) or not ctx.live_sessions:
            return dict.fromkeys((w.worker_id for w in candidates), 1.0)
        live = ctx.live_sessions.get
        return relative({w.worker_id: float(live(w.worker_id, 0)) for w in candidates})

    def values(
        self, ctx: ScoringContext, candidates: Sequence[RuntimeConfig], figures: Sequence[Figures]
    ) -> list[float]:
        if self.has_cache_hit(ctx, candidates) or not ctx.live_sessions:
            return [1.0] * len(candidates)
        live = ctx.live_sessions.get
        return relative_values([float(live(w.worker_id, 0)) for w in candidates])

"""``live_sessions``: the work a worker is expected to be asked to continue, for a request no cache can serve.

Instantaneous load cannot see that a worker already holds many live conversations, each of which will come back
with its next turn (and be routed there by its cache). For a request without a cache hit (no candidate caches
``min_hit_fraction`` of the prompt more than another: a new conversation, a cold document) this scores
``(fewest + 1) / (live + 1)`` over the candidates' live sessions (``ScoringContext.live_sessions``), so new
conversations spread by how many each worker is serving, as an oracle that balances conversations would. With a
cache hit it is neutral (1 everywhere): the cache and the load decide.

With ``sessions.expect: next_turns`` the order is by the next turns each candidate is expected to get while the new
prompt would be computed there (``ScoringContext.next_turns``), so a cold prompt keeps off workers whose
conversations were just answered; the count stays as a bound: a candidate holding more than the candidates' mean +
``count_bound`` sessions scores below every candidate within it (by how far over), also when no next turn is expected
anywhere (none answered lately, or no gap between turns measured yet: single questions); all candidates alike is
neutral.
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
        self.count_bound = settings.count_bound

    def has_cache_hit(self, ctx: ScoringContext, candidates: Sequence[RuntimeConfig]) -> bool:
        if ctx.prompt_tokens <= 0 or not ctx.cached_tokens:
            return False
        get = ctx.cached_tokens.get
        cached = [get(w.worker_id, 0) for w in candidates]
        return (max(cached) - min(cached)) >= self.min_hit_fraction * ctx.prompt_tokens

    def costs(self, ctx: ScoringContext, candidates: Sequence[RuntimeConfig]) -> list[float] | None:
        """Per candidate, in order: what ``relative`` ranks (fewer is better); None: neutral. The cache hit is checked
        first: the next-turn expectation is computed on first read, and only a request no worker has cached needs
        it."""
        if self.has_cache_hit(ctx, candidates):
            return None
        soon, live = ctx.next_turns, ctx.live_sessions
        if soon is None:
            if not live:
                return None
            return [float(live.get(w.worker_id, 0)) for w in candidates]
        slack = self.count_bound if live else None
        if not soon and slack is None:
            return None
        # no next turn expected anywhere (none answered lately, or no gap measured yet) still leaves the bound: on
        # real workers most decisions see none, and without it conversations went 6 / 3 / 3
        order = [soon.get(w.worker_id, 0.0) for w in candidates] if soon else [0.0] * len(candidates)
        if slack is not None:
            counts = [float(live.get(w.worker_id, 0)) for w in candidates]
            bound = sum(counts) / len(counts) + slack
            within = [e for e, c in zip(order, counts, strict=True) if c <= bound]
            worst = max(within, default=0.0) + 1.0
            order = [e if c <= bound else worst + c - bound for e, c in zip(order, counts, strict=True)]
        return None if min(order) == max(order) else order

    def score(self, ctx: ScoringContext, candidates: Sequence[RuntimeConfig]) -> dict[str, float]:
        costs = self.costs(ctx, candidates)
        if costs is None:
            return dict.fromkeys((w.worker_id for w in candidates), 1.0)
        return relative({w.worker_id: c for w, c in zip(candidates, costs, strict=True)})

    def values(
        self, ctx: ScoringContext, candidates: Sequence[RuntimeConfig], figures: Sequence[Figures]
    ) -> list[float]:
        costs = self.costs(ctx, candidates)
        return [1.0] * len(candidates) if costs is None else relative_values(costs)

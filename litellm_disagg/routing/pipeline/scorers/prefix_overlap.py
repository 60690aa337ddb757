"""``prefix_overlap``: the fraction of the prompt the worker's prefix cache holds (absolute)."""

from __future__ import annotations

from collections.abc import Sequence

from litellm_disagg.routing.pipeline.context import Figures, ScoringContext
from litellm_disagg.runtime_config import RuntimeConfig


class PrefixOverlapScorer:
    name = "prefix_overlap"

    def score(self, ctx: ScoringContext, candidates: Sequence[RuntimeConfig]) -> dict[str, float]:
        prompt_tokens = ctx.prompt_tokens
        if prompt_tokens <= 0:
            return {w.worker_id: 0.0 for w in candidates}
        cached = ctx.cached_tokens.get
        return {w.worker_id: cached(w.worker_id, 0) / prompt_tokens for w in candidates}

    def values(
        self, ctx: ScoringContext, candidates: Sequence[RuntimeConfig], figures: Sequence[Figures]
    ) -> list[float]:
        prompt_tokens = ctx.prompt_tokens
        if prompt_tokens <= 0:
            return [0.0] * len(candidates)
        cached = ctx.cached_tokens.get
        return [cached(w.worker_id, 0) / prompt_tokens for w in candidates]

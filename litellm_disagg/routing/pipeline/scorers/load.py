"""``load``: requests running or queued there, relative (``(fewest + 1) / (active + 1)``).

With the router's own in-flight counts only (no scraped metrics), the candidates with the fewest requests in flight
score 1: the ``least_inflight`` profile is this scorer alone, ties rotating.
"""

from __future__ import annotations

from collections.abc import Sequence

from litellm_disagg.routing.pipeline.context import Figures, ScoringContext
from litellm_disagg.routing.pipeline.scorers.base import relative, relative_values
from litellm_disagg.runtime_config import RuntimeConfig


class LoadScorer:
    name = "load"

    def score(self, ctx: ScoringContext, candidates: Sequence[RuntimeConfig]) -> dict[str, float]:
        active = {
            w.worker_id: load.active_requests for w, load in zip(candidates, ctx.loads_of(candidates), strict=True)
        }
        return relative(active)

    def values(
        self, ctx: ScoringContext, candidates: Sequence[RuntimeConfig], figures: Sequence[Figures]
    ) -> list[float]:
        return relative_values([f[0] for f in figures])

"""``kv_free``: the fraction of the worker's KV cache not in use (absolute)."""

from __future__ import annotations

from collections.abc import Sequence

from litellm_disagg.routing.pipeline.context import Figures, ScoringContext
from litellm_disagg.runtime_config import RuntimeConfig


class KVFreeScorer:
    name = "kv_free"

    def score(self, ctx: ScoringContext, candidates: Sequence[RuntimeConfig]) -> dict[str, float]:
        return {
            w.worker_id: load.free_kv_fraction for w, load in zip(candidates, ctx.loads_of(candidates), strict=True)
        }

    def values(
        self, ctx: ScoringContext, candidates: Sequence[RuntimeConfig], figures: Sequence[Figures]
    ) -> list[float]:
        return [f[2] for f in figures]

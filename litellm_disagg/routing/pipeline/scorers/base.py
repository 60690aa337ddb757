"""The scorer interface. A scorer rates every candidate for one request, 1 best, 0 worst; stateless, no I/O.

    Scorer.score(ctx, candidates) -> {worker_id: float in [0, 1]}

The built-in scorers also have ``values(ctx, candidates, figures)``: the same scores as a list in candidate order
(``figures``: ``ctx.figures_of(candidates)``), which the pipeline uses when the candidates are distinct.

The pipeline clamps each score to [0, 1] and sums ``score * weight`` with weights from the pool's profile, so one
scorer can weigh differently for prefill and for decode workers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from litellm_disagg.routing.pipeline.context import ScoringContext
from litellm_disagg.runtime_config import RuntimeConfig


class Scorer(Protocol):
    name: str

    def score(self, ctx: ScoringContext, candidates: Sequence[RuntimeConfig]) -> dict[str, float]: ...


def relative(costs: Mapping[str, float]) -> dict[str, float]:
    """Lowest cost scores 1, the others ``(lowest + 1) / (cost + 1)``: the same meaning whatever the cluster's size."""
    if not costs:
        return {}
    top = min(costs.values()) + 1.0
    return {wid: top / (cost + 1.0) for wid, cost in costs.items()}


def relative_values(costs: Sequence[float]) -> list[float]:
    """``relative`` over a list (distinct candidates, in order): the same values."""
    if not costs:
        return []
    top = min(costs) + 1.0
    return [top / (cost + 1.0) for cost in costs]

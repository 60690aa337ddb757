"""Selector: one pool's choice among candidates from weighted scorer totals. No I/O; randomness from an injected RNG.

    total(worker) = sum over the profile's scorers of weight * clamp(score, 0, 1)

- temperature 0: the highest total wins; candidates within ``TIE_EPSILON`` of it are tied, and ties go to the
  fewest active requests, then to a random one (so equal workers share the work);
- temperature T > 0: a worker is drawn with probability proportional to ``exp((total - best) / T)``.

``Selection`` carries the winner and, for every candidate, the breakdown (each scorer's score, the total, the cost
terms when ``kv_cost`` is weighted, cached tokens, active requests) for logs and benchmarks. ``select`` changes no
state except the RNG's: it answers "which worker would you pick"; recording the choice is the caller's next step.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from litellm_disagg.routing.kv.scorers import CostTerms, KVCostScorer, Scorer, ScoringContext, make_scorer
from litellm_disagg.routing.kv.settings import ProfileSettings
from litellm_disagg.runtime_config import RuntimeConfig

TIE_EPSILON = 1e-9

How = Literal["none", "only", "best", "tie_load", "tie_random", "sampled"]


@dataclass(frozen=True)
class WorkerBreakdown:
    total: float
    scores: dict[str, float]
    cached_tokens: int
    active_requests: float
    cost: CostTerms | None = None


@dataclass(frozen=True)
class Selection:
    worker: RuntimeConfig | None
    how: How
    breakdown: dict[str, WorkerBreakdown]

    @property
    def worker_id(self) -> str | None:
        return None if self.worker is None else self.worker.worker_id

    def describe(self) -> str:
        """One line for a log: the winner, how, and every candidate's total and scores."""
        parts = []
        for wid, b in sorted(self.breakdown.items(), key=lambda item: -item[1].total):
            scores = ",".join(f"{name}={value:.3f}" for name, value in b.scores.items())
            parts.append(f"{wid}:{b.total:.3f}[{scores};cached={b.cached_tokens};active={b.active_requests:g}]")
        return f"picked {self.worker_id} ({self.how}) " + " ".join(parts)


class Selector:
    def __init__(self, profile: ProfileSettings, *, rng: random.Random | None = None):
        self.profile = profile
        self.rng = rng or random.Random()
        self.scorers: list[tuple[Scorer, float]] = [
            (make_scorer(name, profile), weight) for name, weight in profile.weights.items() if weight > 0
        ]

    def select(self, ctx: ScoringContext, candidates: Sequence[RuntimeConfig]) -> Selection:
        if not candidates:
            return Selection(None, "none", {})
        per_scorer = [(scorer, weight, scorer.score(ctx, candidates)) for scorer, weight in self.scorers]
        costs = next((s.costs(ctx, candidates) for s, _ in self.scorers if isinstance(s, KVCostScorer)), None)
        breakdown: dict[str, WorkerBreakdown] = {}
        for worker in candidates:
            wid = worker.worker_id
            scores = {scorer.name: _clamp(values.get(wid, 0.0)) for scorer, _, values in per_scorer}
            total = sum(weight * scores[scorer.name] for scorer, weight, _ in per_scorer)
            breakdown[wid] = WorkerBreakdown(
                total=total,
                scores=scores,
                cached_tokens=ctx.cached(wid),
                active_requests=ctx.load(worker).active_requests,
                cost=None if costs is None else costs[wid],
            )
        if len(candidates) == 1:
            return Selection(candidates[0], "only", breakdown)
        if self.profile.temperature > 0:
            return Selection(self._sample(candidates, breakdown), "sampled", breakdown)
        best = max(b.total for b in breakdown.values())
        tied = [w for w in candidates if best - breakdown[w.worker_id].total <= TIE_EPSILON]
        if len(tied) == 1:
            return Selection(tied[0], "best", breakdown)
        fewest = min(breakdown[w.worker_id].active_requests for w in tied)
        least = [w for w in tied if breakdown[w.worker_id].active_requests == fewest]
        if len(least) == 1:
            return Selection(least[0], "tie_load", breakdown)
        return Selection(self.rng.choice(least), "tie_random", breakdown)

    def _sample(self, candidates: Sequence[RuntimeConfig], breakdown: dict[str, WorkerBreakdown]) -> RuntimeConfig:
        best = max(b.total for b in breakdown.values())
        temperature = self.profile.temperature
        weights = [math.exp((breakdown[w.worker_id].total - best) / temperature) for w in candidates]
        return self.rng.choices(list(candidates), weights=weights, k=1)[0]


def _clamp(value: float) -> float:
    if value != value:  # NaN
        return 0.0
    return 0.0 if value < 0.0 else 1.0 if value > 1.0 else value

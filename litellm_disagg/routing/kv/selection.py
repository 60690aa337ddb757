"""Selector: one pool's choice among candidates from weighted scorer totals. No I/O; randomness from an injected RNG.

    total(worker) = sum over the profile's scorers of weight * clamp(score, 0, 1)

- temperature 0: the highest total wins; candidates within ``TIE_EPSILON`` of it are tied, and ties go to the
  fewest active requests, then to a random one (so equal workers share the work);
- temperature T > 0: a worker is drawn with probability proportional to ``exp((total - best) / T)``.

``Selection`` carries the winner, every candidate's total, and on demand every candidate's breakdown (each scorer's
score, the total, the cost terms when ``kv_cost`` is weighted, cached tokens, active requests) for logs and
benchmarks. ``select`` changes no
state except the RNG's: it answers "which worker would you pick"; recording the choice is the caller's next step.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Sequence
from typing import Literal, NamedTuple

from litellm_disagg.routing.kv.scorers import CostTerms, KVCostScorer, Scorer, ScoringContext, make_scorer
from litellm_disagg.routing.kv.settings import ProfileSettings
from litellm_disagg.runtime_config import RuntimeConfig

TIE_EPSILON = 1e-9

_ZEROS = itertools.repeat(0.0)
"""The default of every ``values.get`` (an endless iterator: ``map`` stops with the worker ids)."""

How = Literal["none", "only", "best", "tie_load", "tie_random", "sampled"]


class WorkerBreakdown(NamedTuple):
    total: float
    scores: dict[str, float]
    """Each scorer's score, clamped to [0, 1], before its weight."""
    cached_tokens: int
    active_requests: float
    cost: CostTerms | None = None


class Selection:
    """The winner, how it won, and (built on first use, so an unlogged decision does not pay for it) the per-worker
    breakdown."""

    __slots__ = ("_breakdown", "_costs", "_ctx", "_scores", "how", "totals", "worker")

    def __init__(
        self,
        worker: RuntimeConfig | None,
        how: How,
        totals: dict[str, float] | None = None,
        *,
        scores: dict[str, dict[str, float]] | None = None,
        ctx: ScoringContext | None = None,
        costs: dict[str, CostTerms] | None = None,
    ):
        self.worker = worker
        self.how = how
        self.totals = totals or {}
        """Weighted total per candidate."""
        self._scores = scores or {}
        self._ctx = ctx
        self._costs = costs
        self._breakdown: dict[str, WorkerBreakdown] | None = None

    @property
    def worker_id(self) -> str | None:
        return None if self.worker is None else self.worker.worker_id

    def detail(self, worker_id: str) -> WorkerBreakdown:
        """One candidate's breakdown."""
        ctx = self._ctx
        return WorkerBreakdown(
            self.totals[worker_id],
            {name: values[worker_id] for name, values in self._scores.items()},
            0 if ctx is None else ctx.cached(worker_id),
            0.0 if ctx is None or worker_id not in ctx.loads else ctx.loads[worker_id].active_requests,
            None if self._costs is None else self._costs.get(worker_id),
        )

    @property
    def breakdown(self) -> dict[str, WorkerBreakdown]:
        """Every candidate's breakdown."""
        if self._breakdown is None:
            self._breakdown = {wid: self.detail(wid) for wid in self.totals}
        return self._breakdown

    def ranking(self) -> list[str]:
        """Worker ids, the chosen one first, then by descending total: the order to fail over in."""
        totals = self.totals
        rest = sorted((wid for wid in totals if wid != self.worker_id), key=lambda wid: -totals[wid])
        return ([self.worker_id] if self.worker_id is not None else []) + rest

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
            return Selection(None, "none")
        ids = [w.worker_id for w in candidates]
        totals = dict.fromkeys(ids, 0.0)
        scores: dict[str, dict[str, float]] = {}
        costs: dict[str, CostTerms] | None = None
        for scorer, weight in self.scorers:
            if isinstance(scorer, KVCostScorer):  # keep the cost terms for the breakdown; compute them once
                costs = scorer.costs(ctx, candidates)
                values = scorer.scores_of(costs)
            else:
                values = scorer.score(ctx, candidates)
            clamped: dict[str, float] = {}
            for wid, value in zip(ids, map(values.get, ids, _ZEROS), strict=False):
                if not 0.0 <= value <= 1.0:
                    value = 1.0 if value > 1.0 else 0.0  # NaN -> 0
                clamped[wid] = value
                totals[wid] += weight * value
            scores[scorer.name] = clamped

        def selection(worker: RuntimeConfig, how: How) -> Selection:
            return Selection(worker, how, totals, scores=scores, ctx=ctx, costs=costs)

        if len(candidates) == 1:
            return selection(candidates[0], "only")
        if self.profile.temperature > 0:
            return selection(self._sample(candidates, totals), "sampled")
        best = max(totals.values())
        tied = [w for w in candidates if best - totals[w.worker_id] <= TIE_EPSILON]
        if len(tied) == 1:
            return selection(tied[0], "best")
        active = {w.worker_id: load.active_requests for w, load in zip(tied, ctx.loads_of(tied), strict=True)}
        fewest = min(active.values())
        least = [w for w in tied if active[w.worker_id] == fewest]
        if len(least) == 1:
            return selection(least[0], "tie_load")
        return selection(self.rng.choice(least), "tie_random")

    def _sample(self, candidates: Sequence[RuntimeConfig], totals: dict[str, float]) -> RuntimeConfig:
        best = max(totals.values())
        temperature = self.profile.temperature
        weights = [math.exp((totals[w.worker_id] - best) / temperature) for w in candidates]
        return self.rng.choices(list(candidates), weights=weights, k=1)[0]

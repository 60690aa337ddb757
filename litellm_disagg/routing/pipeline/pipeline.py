"""Pipeline: one pool's selection, the same code for every request, KV-aware routing on or off.

    candidates (already through ``filters.py``) ─► scorers (weighted, clamped to [0, 1], summed)
        ─► bounded load (``bounded_load.py``, when the profile sets it: who may be picked) ─► picker ─► Selection

The scoring context (prompt length, cached tokens, loads) comes from a context provider (``providers.py``); the
pipeline itself does no I/O and changes no state but its picker's RNG and rotation: it answers "which worker would
you pick"; recording the choice is the caller's next step.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from litellm_disagg.routing.pipeline.bounded_load import within_bound
from litellm_disagg.routing.pipeline.context import ScoringContext
from litellm_disagg.routing.pipeline.picker import Picker
from litellm_disagg.routing.pipeline.profile import ProfileSettings
from litellm_disagg.routing.pipeline.scorers import KVCostScorer, Scorer, make_scorer
from litellm_disagg.routing.pipeline.scorers.base import relative_values
from litellm_disagg.routing.pipeline.scorers.kv_cost import CostColumns
from litellm_disagg.routing.pipeline.selection import Selection
from litellm_disagg.runtime_config import RuntimeConfig


class Pipeline:
    def __init__(self, profile: ProfileSettings, *, rng: random.Random | None = None):
        self.profile = profile
        self.picker = Picker(profile, rng=rng)
        self.scorers: list[tuple[Scorer, float]] = [
            (make_scorer(name, profile), weight) for name, weight in profile.weights.items() if weight > 0
        ]

    def select(self, ctx: ScoringContext, candidates: Sequence[RuntimeConfig]) -> Selection:
        """Score and pick among ``candidates`` (already filtered)."""
        if not candidates:
            return Selection(None, "none")
        ids = [w.worker_id for w in candidates]
        if len(set(ids)) != len(ids):  # a worker listed twice is one candidate (the route planner's never repeat)
            first: dict[str, RuntimeConfig] = {}
            for w in candidates:
                first.setdefault(w.worker_id, w)
            candidates = list(first.values())
            ids = [w.worker_id for w in candidates]
        # Every scorer's values as a list in candidate order, from each worker's load figures computed once per
        # snapshot (``ctx.figures_of``); tests/kv/test_scoring.py holds them equal to a by-worker-id reference.
        figures = ctx.figures_of(candidates)
        totals_l = [0.0] * len(ids)
        columns: dict[str, list[float]] = {}
        cost_columns: CostColumns | None = None
        for scorer, weight in self.scorers:
            if isinstance(scorer, KVCostScorer):  # keep the cost terms for the breakdown; compute them once
                cost_columns = scorer.columns(ctx, candidates, figures)
                values = relative_values(cost_columns.total)
            elif (as_list := getattr(scorer, "values", None)) is not None:  # the built-in scorers
                values = as_list(ctx, candidates, figures)
            else:
                by_id = scorer.score(ctx, candidates)
                values = [by_id.get(wid, 0.0) for wid in ids]
            values = [v if 0.0 <= v <= 1.0 else 1.0 if v > 1.0 else 0.0 for v in values]  # NaN -> 0
            totals_l = [total + weight * v for total, v in zip(totals_l, values, strict=True)]
            columns[scorer.name] = values
        totals = dict(zip(ids, totals_l, strict=True))
        table = (ids, columns, cost_columns)
        bounded = self.profile.bounded_load
        if bounded is None or len(candidates) == 1:
            worker, how = self.picker.pick(ctx, candidates, totals)
            return Selection(worker, how, totals, ctx=ctx, columns=table)
        eligible, over = within_bound(ctx, candidates, bounded, [f[0] for f in figures])
        if not over:
            worker, how = self.picker.pick(ctx, candidates, totals)
        else:
            worker, how = self.picker.pick(ctx, eligible, {w.worker_id: totals[w.worker_id] for w in eligible})
        return Selection(worker, how, totals, ctx=ctx, columns=table, over_bound=over)

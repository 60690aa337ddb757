"""Selection: one pool's choice, how it was made, and (on demand) every candidate's breakdown for logs and benchmarks.

``Selection`` carries the winner, every candidate's weighted total, and on first use every candidate's breakdown
(each scorer's score, the total, the cost terms when ``kv_cost`` is weighted, cached tokens, active requests), so an
unlogged decision does not pay for it. ``ranking()`` is the failover order.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

from litellm_disagg.routing.pipeline.context import ScoringContext
from litellm_disagg.routing.pipeline.scorers.kv_cost import CostColumns, CostTerms
from litellm_disagg.runtime_config import RuntimeConfig

How = Literal["none", "only", "best", "tie_load", "tie_random", "tie_spread", "tie_rotate", "sampled"]


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

    __slots__ = (
        "_breakdown",
        "_columns",
        "_cost_columns",
        "_costs",
        "_ctx",
        "_ids",
        "_position",
        "_scores",
        "how",
        "over_bound",
        "totals",
        "worker",
    )

    def __init__(
        self,
        worker: RuntimeConfig | None,
        how: How,
        totals: dict[str, float] | None = None,
        *,
        ctx: ScoringContext | None = None,
        over_bound: frozenset[str] = frozenset(),
        columns: tuple[list[str], dict[str, list[float]], CostColumns | None] | None = None,
    ):
        """``columns``: the distinct candidates' ids, each scorer's scores and the cost terms as lists in the same
        order (made into ``scores`` and ``costs`` by worker id only when asked)."""
        self.worker = worker
        self.how = how
        self.totals = totals or {}
        """Weighted total per candidate."""
        self._ctx = ctx
        self._ids, self._columns, self._cost_columns = columns if columns is not None else ([], {}, None)
        self._scores: dict[str, dict[str, float]] | None = None
        self._costs: dict[str, CostTerms] | None = None
        self._position: dict[str, int] | None = None
        self._breakdown: dict[str, WorkerBreakdown] | None = None
        self.over_bound = over_bound
        """Candidates the profile's bounded load kept from being chosen (``bounded_load.py``)."""

    @property
    def worker_id(self) -> str | None:
        return None if self.worker is None else self.worker.worker_id

    @property
    def scores(self) -> dict[str, dict[str, float]]:
        """Each scorer's score (clamped, before its weight) per candidate."""
        if self._scores is None:
            ids = self._ids
            self._scores = {name: dict(zip(ids, values, strict=True)) for name, values in self._columns.items()}
        return self._scores

    @property
    def costs(self) -> dict[str, CostTerms] | None:
        """``kv_cost``'s terms per candidate, when it is weighted."""
        if self._costs is None and self._cost_columns is not None:
            make = tuple.__new__
            self._costs = {
                wid: make(CostTerms, terms)
                for wid, terms in zip(self._ids, zip(*self._cost_columns, strict=True), strict=True)
            }
        return self._costs

    def detail(self, worker_id: str) -> WorkerBreakdown:
        """One candidate's breakdown."""
        ctx = self._ctx
        if self._position is None:  # read this candidate's entries only
            self._position = {wid: i for i, wid in enumerate(self._ids)}
        i = self._position[worker_id]
        scores = {name: values[i] for name, values in self._columns.items()}
        terms = self._cost_columns
        cost = None if terms is None else tuple.__new__(CostTerms, [column[i] for column in terms])
        return WorkerBreakdown(
            self.totals[worker_id],
            scores,
            0 if ctx is None else ctx.cached(worker_id),
            0.0 if ctx is None or worker_id not in ctx.loads else ctx.loads[worker_id].active_requests,
            cost,
        )

    @property
    def breakdown(self) -> dict[str, WorkerBreakdown]:
        """Every candidate's breakdown."""
        if self._breakdown is None:
            self._breakdown = {wid: self.detail(wid) for wid in self.totals}
        return self._breakdown

    def ranking(self) -> list[str]:
        """Worker ids, the chosen one first, then by descending total (those over the load bound last): the order to
        fail over in."""
        totals, over = self.totals, self.over_bound
        rest = sorted((wid for wid in totals if wid != self.worker_id), key=lambda wid: (wid in over, -totals[wid]))
        return ([self.worker_id] if self.worker_id is not None else []) + rest

    def describe(self) -> str:
        """One line for a log: the winner, how, and every candidate's total and scores."""
        parts = []
        for wid, b in sorted(self.breakdown.items(), key=lambda item: -item[1].total):
            scores = ",".join(f"{name}={value:.3f}" for name, value in b.scores.items())
            parts.append(f"{wid}:{b.total:.3f}[{scores};cached={b.cached_tokens};active={b.active_requests:g}]")
        bounded = f" over the load bound: {','.join(sorted(self.over_bound))}" if self.over_bound else ""
        return f"picked {self.worker_id} ({self.how}){bounded} " + " ".join(parts)

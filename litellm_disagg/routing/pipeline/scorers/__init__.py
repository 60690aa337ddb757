"""Scorers, one file each, and the table that names them (the keys of a profile's ``weights``).

| name               | score                                                          | reads              |
|--------------------|----------------------------------------------------------------|--------------------|
| ``prefix_overlap`` | cached prompt tokens / prompt tokens                           | prefix index       |
| ``load``           | ``(fewest + 1) / (active + 1)``: requests running or queued     | in-flight, scraped |
| ``kv_free``        | fraction of the worker's KV cache not in use                   | in-flight, scraped |
| ``kv_cost``        | ``(lowest + 1) / (cost + 1)`` of an additive cost in blocks    | all of the above   |
| ``live_sessions``  | ``(fewest + 1) / (live + 1)`` of recently served prefixes, for | live sessions      |
|                    | a request without a cache hit (else 1)                         |                    |

Adding a scorer: one file with a class that has ``name`` and ``score(ctx, candidates)`` (``base.Scorer``), plus one
line in ``SCORERS``. A factory receives the pool's profile (for scorer parameters such as ``kv_cost``'s weights).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

from litellm_disagg.routing.pipeline.scorers.base import Scorer
from litellm_disagg.routing.pipeline.scorers.kv_cost import CostTerms, KVCostScorer, kv_cost
from litellm_disagg.routing.pipeline.scorers.kv_free import KVFreeScorer
from litellm_disagg.routing.pipeline.scorers.live_sessions import LiveSessionsScorer
from litellm_disagg.routing.pipeline.scorers.load import LoadScorer
from litellm_disagg.routing.pipeline.scorers.prefix_overlap import PrefixOverlapScorer

if TYPE_CHECKING:
    from litellm_disagg.routing.pipeline.profile import ProfileSettings

SCORERS: Mapping[str, Callable[[ProfileSettings], Scorer]] = MappingProxyType({
    "prefix_overlap": lambda profile: PrefixOverlapScorer(),
    "load": lambda profile: LoadScorer(),
    "kv_free": lambda profile: KVFreeScorer(),
    "kv_cost": lambda profile: KVCostScorer(profile.cost),
    "live_sessions": lambda profile: LiveSessionsScorer(profile.sessions),
})


def make_scorer(name: str, profile: ProfileSettings) -> Scorer:
    try:
        factory = SCORERS[name]
    except KeyError:
        raise ValueError(f"unknown scorer {name!r}; choose from {sorted(SCORERS)}") from None
    return factory(profile)


__all__ = [
    "SCORERS",
    "CostTerms",
    "KVCostScorer",
    "KVFreeScorer",
    "LiveSessionsScorer",
    "LoadScorer",
    "PrefixOverlapScorer",
    "Scorer",
    "kv_cost",
    "make_scorer",
]

"""Bounded load: a hot prefix must not pile onto one worker (consistent hashing with bounded loads, Mirrokni et al.).

    bound = factor * mean(active requests over the pool's candidates) + slack
    a candidate above the bound is not chosen, however much of the prompt it caches

The pipeline scores every candidate, then picks among those within the bound (the worker with the fewest active
requests is always within it, since ``factor >= 1``). When the holder of a hot prefix is over the bound, the next
best worker takes the request and computes the prefix: the prefix now lives on two workers, the prefix index sees
both, and later requests spread over the replicas as each one's load allows. When the heat passes nobody is over
the bound any more, requests go back to following the cache, and the engine's LRU eviction frees the replica that
stops being used. Nothing here holds state.
"""

from __future__ import annotations

from collections.abc import Sequence

from litellm_disagg.routing.pipeline.context import ScoringContext
from litellm_disagg.routing.pipeline.profile import BoundedLoadSettings
from litellm_disagg.runtime_config import RuntimeConfig


def load_bound(active: Sequence[float], settings: BoundedLoadSettings) -> float:
    """The most active requests a candidate may have and still be chosen."""
    mean = sum(active) / len(active) if active else 0.0
    return settings.factor * mean + settings.slack


def within_bound(
    ctx: ScoringContext,
    candidates: Sequence[RuntimeConfig],
    settings: BoundedLoadSettings,
    active: Sequence[float] | None = None,
) -> tuple[list[RuntimeConfig], frozenset[str]]:
    """The candidates that may be chosen, and the ids of those over the bound. Never empty when ``candidates`` is
    not (the least loaded one is at or below the mean). ``active``: the candidates' active requests when the caller
    has them already (``kv_cost``'s terms), else read from ``ctx``."""
    if active is None:
        active = [load.active_requests for load in ctx.loads_of(candidates)]
    bound = load_bound(active, settings)
    kept: list[RuntimeConfig] = []
    over: set[str] = set()
    for worker, count in zip(candidates, active, strict=True):
        if count > bound:
            over.add(worker.worker_id)
        else:
            kept.append(worker)
    if not kept:  # only reachable with NaN loads
        return list(candidates), frozenset()
    return kept, frozenset(over)

"""The picker: the last stage of the pipeline, one winner from the candidates' weighted totals.

- temperature 0: the highest total wins; candidates within ``TIE_EPSILON`` of it are tied. Ties (profile's
  ``tie_break``): ``least_loaded`` goes to the fewest active requests, then to a random one (so equal workers share
  the work); ``rotate`` takes turns in candidate order (round robin, and least-inflight's ties).
- temperature T > 0: a worker is drawn with probability proportional to ``exp((total - best) / T)``.

Its only state is the RNG and the rotation counter.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Mapping, Sequence

from litellm_disagg.routing.pipeline.context import ScoringContext
from litellm_disagg.routing.pipeline.profile import ProfileSettings
from litellm_disagg.routing.pipeline.selection import How
from litellm_disagg.routing.replica_slot import offset, share
from litellm_disagg.runtime_config import RuntimeConfig

TIE_EPSILON = 1e-9


class Picker:
    def __init__(self, profile: ProfileSettings, *, rng: random.Random | None = None):
        self.temperature = profile.temperature
        self.tie_break = profile.tie_break
        self.rng = rng or random.Random()
        self._turn = itertools.count()

    def pick(
        self, ctx: ScoringContext, candidates: Sequence[RuntimeConfig], totals: Mapping[str, float]
    ) -> tuple[RuntimeConfig, How]:
        """``candidates`` is not empty."""
        if len(candidates) == 1:
            return candidates[0], "only"
        if self.temperature > 0:
            return self._sample(candidates, totals), "sampled"
        best = max(totals.values())
        tied = [w for w in candidates if best - totals[w.worker_id] <= TIE_EPSILON]
        if len(tied) == 1:
            return tied[0], "best"
        slot = ctx.replica
        if self.tie_break == "rotate":
            if slot is not None:  # every replica's turns in the same order, each starting at its own share
                tied = sorted(tied, key=_worker_id)
            return tied[(next(self._turn) + offset(len(tied), slot)) % len(tied)], "tie_rotate"
        active = {w.worker_id: load.active_requests for w, load in zip(tied, ctx.loads_of(tied), strict=True)}
        fewest = min(active.values())
        least = [w for w in tied if active[w.worker_id] == fewest]
        if len(least) == 1:
            return least[0], "tie_load"
        if slot is not None:
            mine = share(sorted(least, key=_worker_id), slot)
            return self.rng.choice(mine), "tie_spread" if len(mine) < len(least) else "tie_random"
        return self.rng.choice(least), "tie_random"

    def _sample(self, candidates: Sequence[RuntimeConfig], totals: Mapping[str, float]) -> RuntimeConfig:
        best = max(totals.values())
        weights = [math.exp((totals[w.worker_id] - best) / self.temperature) for w in candidates]
        return self.rng.choices(list(candidates), weights=weights, k=1)[0]


def _worker_id(worker: RuntimeConfig) -> str:
    return worker.worker_id

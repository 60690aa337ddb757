"""``decode_time_weight`` measured: how much a decode worker's local prefill stretches its running requests' decoding.

The cost model charges a local prefill ``decode_time_weight x (1 + running) x its compute`` (``disagg_decision.py``):
each request decoding there is delayed by ``decode_time_weight`` seconds per second of prefill. That is measurable
from the inter-token gaps the proxy already sees. A running request's gap while its worker also prefills a prompt
(``during``) against its gap while it does not (``base``): over a prefill of ``P`` seconds it gets ``P / during``
tokens instead of ``P / base``, a delay of ``P x (1 - base / during)``. So::

    decode_time_weight = 1 - base / during        (0 when prefills do not slow decoding; near 1 when they stop it)

``base`` and ``during`` are exponentially weighted means of the gaps (``halflife_gaps``); until each rests on
``min_gaps`` gaps the weight is the configured prior. Through several proxy replicas, each adds the others' gaps
(``others``): a replica sees a gap "during" a prefill only when both the stream and the prefill are its own, so alone
each of 4 replicas saw 10-32 such gaps in a run where one proxy saw 372-434. Pure: gaps in, a weight out; the caller classifies each gap
(``decode_watch.py``: did the worker prefill a prompt locally at any time within the gap?).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from litellm_disagg.routing.kv.moments import add_fields


@dataclass(frozen=True, slots=True)
class GapMoments:
    """The fit's sums: per kind of gap, its decayed weight, weighted total and count. What a proxy replica publishes
    to the others (``shared_estimates.py``); sums of several replicas' are the moments of all their gaps."""

    base_weight: float = 0.0
    base_total: float = 0.0
    base_count: int = 0
    during_weight: float = 0.0
    during_total: float = 0.0
    during_count: int = 0

    __add__ = add_fields


@dataclass(frozen=True)
class StallEstimate:
    """The fitted weight (None until both kinds of gap are observed enough) and what it rests on."""

    weight: float | None
    base_gap_s: float | None
    during_gap_s: float | None
    base_gaps: int
    during_gaps: int


class _Ewma:
    __slots__ = ("count", "decay", "mean", "weight")

    def __init__(self, decay: float):
        self.decay = decay
        self.mean = 0.0
        self.weight = 0.0
        self.count = 0

    def add(self, value: float) -> None:
        self.weight = self.weight * self.decay + 1.0
        self.mean += (value - self.mean) / self.weight
        self.count += 1


class StallFit:
    def __init__(self, *, halflife_gaps: float = 200.0, min_gaps: int = 10):
        self.min_gaps = min_gaps
        self._decay = 0.5 ** (1.0 / halflife_gaps)
        self._base = _Ewma(self._decay)
        self._during = _Ewma(self._decay)
        self.others: GapMoments | None = None
        """The other proxy replicas' gaps (``shared_estimates.py``), added to this fit's own in ``estimate``."""

    def moments(self) -> GapMoments:
        """This replica's own gaps (never the others')."""
        b, d = self._base, self._during
        return GapMoments(b.weight, b.mean * b.weight, b.count, d.weight, d.mean * d.weight, d.count)

    def observe(self, gap_s: float, *, during_prefill: bool) -> None:
        """One inter-token gap of a running request; ``during_prefill``: its worker prefilled a prompt meanwhile."""
        if not (gap_s >= 0.0 and math.isfinite(gap_s)):
            return
        (self._during if during_prefill else self._base).add(gap_s)

    def reset(self) -> None:
        self._base = _Ewma(self._decay)
        self._during = _Ewma(self._decay)

    @property
    def observations(self) -> int:
        return self._base.count + self._during.count

    def estimate(self) -> StallEstimate:
        m = self.moments() if self.others is None else self.moments() + self.others
        base = m.base_total / m.base_weight if m.base_count and m.base_weight > 0.0 else None
        during = m.during_total / m.during_weight if m.during_count and m.during_weight > 0.0 else None
        weight = None
        if m.base_count >= self.min_gaps and m.during_count >= self.min_gaps and base is not None and during:
            weight = min(1.0, max(0.0, 1.0 - base / during))
        return StallEstimate(weight, base, during, m.base_count, m.during_count)

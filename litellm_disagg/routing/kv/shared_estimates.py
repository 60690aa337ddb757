"""The local-or-remote prefill decision's measurements, pooled between proxy replicas through Redis.

Each replica fits its cost lines (``disagg_decision.py``) on what it observes itself: its own remote prefills, its own
requests' first tokens, the inter-token gaps of its own streams (the transfer line is fitted from the decode
workers' own counters, which every replica scrapes: each has all of it, and it is not pooled). Behind one address, N replicas each see 1/N of
that, and the stall fit far less: a gap counts as "during a prefill" only when the stream and the prefill are the same
replica's (measured on 4 replicas: 10-32 such gaps per replica in a run where one proxy saw 372-434, and fitted
weights of 0.01-0.22 against one proxy's 0.06-0.08). A line on a few observations stays near its prior or swings with
their noise.

So every ``estimates_interval_s`` each replica publishes its own moments (``DisaggDecider.moments``: the prefill,
local and remote-tail lines' weighted sums, the stall fit's gap sums) and reads the other live replicas' (``redis_exchange.py``, under
``estimates_key``, dropped after ``estimates_ttl_s``); their sum goes to ``DisaggDecider.set_others``, and every
estimate adds it to the replica's own. Least squares on summed moments is least squares on all the replicas'
observations. Each replica's own observations keep their forgetting, aging and expiry; the others' count as they
last published them.

Another replica's entry is never trusted: one that does not parse, holds a figure that is not finite or negative,
more weight than the configured half-lives allow a fit to hold (``1 / (1 - decay)``), or a mean beyond any real
prefill (``MAX_MEAN_TOKENS``, ``MAX_MEAN_SECONDS``) is skipped whole and logged. Without Redis, or with no other
replica, each replica fits on its own observations as before.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from typing import Any

from litellm_disagg.routing.kv.disagg_decision import DeciderMoments, DisaggDecider, LineMoments
from litellm_disagg.routing.kv.settings import DisaggDecisionSettings
from litellm_disagg.routing.kv.stall_fit import GapMoments
from litellm_disagg.routing.redis_exchange import ExchangeLoop, RedisExchange
from litellm_disagg.routing.shared_inflight import SharedInflightSettings

logger = logging.getLogger(__name__)

LINES = ("prefill", "local", "remote_tail")
"""The lines pooled: each replica's own requests' (the transfer line is scraped from the workers by every replica)."""
MAX_MEAN_TOKENS = 1e8
MAX_MEAN_SECONDS = 3600.0
MAX_COUNT = 1 << 40
_SLACK = 1.0 + 1e-6


def encode(moments: DeciderMoments) -> str:
    out: dict[str, list[float | int]] = {}
    for name in LINES:
        line: LineMoments = getattr(moments, name)
        out[name] = [line.w, line.x, line.y, line.xx, line.xy, line.yy, line.observations]
    g = moments.stall
    out["stall"] = [g.base_weight, g.base_total, g.base_count, g.during_weight, g.during_total, g.during_count]
    return json.dumps(out, separators=(",", ":"))


class Limits:
    """The most weight a fit can hold under these settings: ``1 / (1 - decay)`` per line and per kind of gap."""

    def __init__(self, settings: DisaggDecisionSettings):
        self.line_weight = _SLACK / (1.0 - 0.5 ** (1.0 / settings.halflife_observations))
        self.gap_weight = _SLACK / (1.0 - 0.5 ** (1.0 / settings.stall_halflife_gaps))


def _count(value: Any) -> int | None:
    return value if type(value) is int and 0 <= value <= MAX_COUNT else None


def _number(value: Any) -> float | None:
    if type(value) not in (int, float) or not math.isfinite(value) or value < 0:
        return None
    return float(value)


def _line(value: Any, limits: Limits) -> LineMoments | None:
    if not isinstance(value, list) or len(value) != 7:
        return None
    sums = [_number(v) for v in value[:6]]
    n = _count(value[6])
    if n is None or any(v is None for v in sums):
        return None
    w, x, y, xx, xy, yy = sums  # type: ignore[misc]
    if w > limits.line_weight or (n == 0) != (w == 0.0):
        return None
    if w and (x / w > MAX_MEAN_TOKENS or y / w > MAX_MEAN_SECONDS or xx * w < x * x / _SLACK or yy * w < y * y / _SLACK):
        return None
    return LineMoments(w, x, y, xx, xy, yy, n)


def _gaps(value: Any, limits: Limits) -> GapMoments | None:
    if not isinstance(value, list) or len(value) != 6:
        return None
    kinds = []
    for weight, total, count in (value[0:3], value[3:6]):
        w, t, n = _number(weight), _number(total), _count(count)
        if w is None or t is None or n is None or w > limits.gap_weight or (n == 0) != (w == 0.0):
            return None
        if w and t / w > MAX_MEAN_SECONDS:
            return None
        kinds.append((w, t, n))
    (bw, bt, bn), (dw, dt, dn) = kinds
    return GapMoments(bw, bt, bn, dw, dt, dn)


def parse(payload: str, limits: Limits) -> DeciderMoments | None:
    """One replica's entry, or None when any part of it is not what a replica publishes."""
    try:
        data = json.loads(payload)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    lines = {name: _line(data.get(name), limits) for name in LINES}
    stall = _gaps(data.get("stall"), limits)
    if stall is None or any(line is None for line in lines.values()):
        return None
    return DeciderMoments(stall=stall, **lines)  # type: ignore[arg-type]


def parse_others(entries: list[tuple[str, str]], limits: Limits) -> tuple[DeciderMoments | None, int, list[str]]:
    """The other replicas' entries -> their moments summed (None when there is none), how many counted, and the
    fields skipped."""
    summed: DeciderMoments | None = None
    counted = 0
    bad: list[str] = []
    for field, payload in entries:
        moments = parse(payload, limits)
        if moments is None:
            bad.append(field)
            continue
        summed = moments if summed is None else summed + moments
        counted += 1
    return summed, counted, bad


class SharedEstimates(ExchangeLoop):
    """One replica's side of the pooling (see the module's docstring)."""

    what = "shared estimates"
    fallback = "deciding on this replica's own measurements"

    def __init__(
        self,
        decider: DisaggDecider,
        client: Callable[[], Any | None],
        settings: SharedInflightSettings,
        *,
        replica: str,
        clock: Callable[[], float] = time.monotonic,
    ):
        hash_ = RedisExchange(client, key=settings.estimates_key, replica=replica, ttl_s=settings.estimates_ttl_s,
                              timeout_s=settings.estimates_interval_s)
        super().__init__(hash_, interval_s=settings.estimates_interval_s, logger=logger, clock=clock)
        self.decider = decider
        self.settings = settings
        self.limits = Limits(decider.settings)
        self.replicas = 0
        """Other replicas whose measurements counted in the last exchange."""

    def payload(self) -> str:
        return encode(self.decider.moments())

    def take(self, entries: list[tuple[str, str]]) -> list[str]:
        others, counted, bad = parse_others(entries, self.limits)
        self._pooled(others, counted)
        return bad

    def forget(self) -> None:
        self._pooled(None, 0)

    def _pooled(self, others: DeciderMoments | None, counted: int) -> None:
        self.decider.set_others(others)
        if counted != self.replicas:
            logger.info("shared estimates: the decision now pools the measurements of %d other replica(s)", counted)
            self.replicas = counted

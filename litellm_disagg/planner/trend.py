"""The prefill queue's trend: how fast it grows, and how many prefill workers the demand behind it needs. No I/O.

The queue term of the prefill pressure (queued prompt tokens over the pool's throughput) is a stock: a pool a worker
short fills its queue at (demand - capacity) tokens/s, and the wait passes the TTFT SLO only seconds later. The growth
is the flow behind it and shows the shortfall at once: while the queue grows, the serving workers compute at their
full rate, so the demand is ``serving x rate + growth`` and the pool needs ``ceil((demand + backlog / horizon) /
rate)`` workers to keep up and clear what queued within ``horizon`` (the planner's ``window_s``).

    QueueHistory.observe(model, now, horizon_s) -> QueueTrend | None     (one history per model, kept by the planner)

The samples hold one layout only: when the set of workers serving prefill changes (a flip completes, a worker joins
or leaves), the history starts again, so a trend always describes the layout that is serving now and never predates
the last move.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from litellm_disagg.planner.signals import ModelSignals


@dataclass(frozen=True)
class QueueSample:
    t: float
    queued_tokens: int


@dataclass(frozen=True)
class QueueTrend:
    """The prefill queue's growth over the samples since the serving layout last changed (growth > 0 only)."""

    growth_tokens_per_s: float
    span_s: float
    rising_steps: int
    """Trailing samples over which the queue rose at every step (the first of them counts: 2 = it rose once)."""
    queued_tokens: int
    serving: int
    """Workers computing prefills now (published role can prefill, not flipping)."""
    rate_tokens_per_s: float
    """One worker's prefill throughput."""

    @property
    def demand_tokens_per_s(self) -> float:
        return self.serving * self.rate_tokens_per_s + self.growth_tokens_per_s

    def needed(self, horizon_s: float) -> int:
        """Workers able to prefill that keep up with the demand and clear the backlog within ``horizon_s``."""
        backlog = self.queued_tokens / horizon_s if horizon_s > 0 else 0.0
        return max(1, math.ceil((self.demand_tokens_per_s + backlog) / self.rate_tokens_per_s - 1e-9))

    def projected_wait_s(self, horizon_s: float, pool_size: int) -> float:
        """The queue wait ``horizon_s`` from now at the measured demand, on ``pool_size`` workers (the pool after the
        flips in progress: what they add is taken off the growth)."""
        capacity = max(1, pool_size) * self.rate_tokens_per_s
        growth = max(0.0, self.demand_tokens_per_s - capacity)
        return (self.queued_tokens + growth * horizon_s) / capacity


@dataclass
class QueueHistory:
    """One model's queue samples since its serving prefill layout last changed."""

    serving: frozenset[str] = frozenset()
    samples: list[QueueSample] = field(default_factory=list)

    def observe(self, model: ModelSignals, now: float, horizon_s: float) -> QueueTrend | None:
        """Record this step's queue and return the trend (None: unknown rate, too few samples, or not growing)."""
        serving = frozenset(w.worker_id for w in model.active if w.role.can_prefill and not w.flipping)
        if serving != self.serving:
            self.serving, self.samples = serving, []
        self.samples.append(QueueSample(now, model.prefill_pool.queued_prefill_tokens))
        self.samples = [s for s in self.samples if now - s.t <= horizon_s]
        rate = model.prefill_tokens_per_s
        if not rate or not serving or len(self.samples) < 2:
            return None
        first, last = self.samples[0], self.samples[-1]
        span = last.t - first.t
        if span <= 0 or last.queued_tokens <= first.queued_tokens:
            return None
        rising = 1
        for older, newer in zip(reversed(self.samples[:-1]), reversed(self.samples[1:]), strict=True):
            if newer.queued_tokens <= older.queued_tokens:
                break
            rising += 1
        return QueueTrend((last.queued_tokens - first.queued_tokens) / span, span, rising, last.queued_tokens,
                          len(serving), rate)

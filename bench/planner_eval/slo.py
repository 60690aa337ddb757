"""SLO targets and attainment. A request meets its SLO when its TTFT and its mean inter-token latency (DistServe's
TPOT) are both within target; a request still unfinished when the run ends misses.

Targets, for the 70B-class H100 timing model of ``litellm_disagg/sim/settings.py`` (prefill 20,000 tokens/s, a lone
sequence's decode step 20 ms, a batch of 64 32 ms):

- TTFT 1.0 s: a 6,000-token prompt computes in 0.3 s on an idle worker; the target leaves room for queueing and the
  transfer but not for a prefill backlog.
- ITL 40 ms: twice a lone sequence's step, 1.25x a batch-64 step; a decode batch that shares its steps with
  2,048-token prefill chunks (0.1 s each) misses it once more than about a fifth of its steps carry a chunk.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from bench.planner_eval.engine import Req


@dataclass(frozen=True)
class Slo:
    ttft_s: float = 1.0
    itl_s: float = 0.040
    attainment: float = 0.90
    """Goodput's bar: the share of requests that must meet both targets."""

    def met(self, req: Req) -> bool:
        ttft, itl = req.ttft, req.itl
        return ttft is not None and itl is not None and ttft <= self.ttft_s and itl <= self.itl_s


def attainment(slo: Slo, requests: Iterable[Req]) -> float:
    reqs = list(requests)
    if not reqs:
        return 1.0
    return sum(slo.met(r) for r in reqs) / len(reqs)


@dataclass(frozen=True)
class WindowPoint:
    t: float
    """Window start (arrival time), simulated seconds."""
    attainment: float
    requests: int


def over_time(slo: Slo, requests: Sequence[Req], window_s: float, end_s: float) -> list[WindowPoint]:
    """Attainment of the requests arriving in each ``window_s`` window (by arrival)."""
    buckets: dict[int, list[Req]] = {}
    for r in requests:
        buckets.setdefault(int(r.arrival // window_s), []).append(r)
    out = []
    for i in range(int(end_s // window_s) + 1):
        reqs = buckets.get(i, [])
        if reqs:
            out.append(WindowPoint(i * window_s, attainment(slo, reqs), len(reqs)))
    return out


def recovery_s(points: Sequence[WindowPoint], shift_t: float, until_t: float, bar: float) -> float | None:
    """Seconds from ``shift_t`` until the first window that meets ``bar`` and after which every window up to
    ``until_t`` does too; 0 when no window after the shift missed; None when it never recovered."""
    after = [p for p in points if shift_t <= p.t < until_t]
    if not after:
        return None
    last_miss = None
    for i, p in enumerate(after):
        if p.attainment < bar:
            last_miss = i
    if last_miss is None:
        return 0.0
    if last_miss == len(after) - 1:
        return None
    return after[last_miss + 1].t - shift_t

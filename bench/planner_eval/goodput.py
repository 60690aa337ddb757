"""Goodput as DistServe defines it: the highest request rate at which at least ``slo.attainment`` (90%) of requests
meet both the TTFT and the ITL target.

For one phase and one arm: a seeded Poisson schedule of the phase at rate r for ``duration_s``; attainment counts the
requests arriving after ``warmup_s`` (the planner starts from its initial split and has the warm-up to adapt; static
arms get the same window). The rate is searched by doubling to bracket the bar, then bisection to ``rel_tol``.
Attainment is not perfectly monotone in the rate (one seed's schedule), so the search reports the bracket's low end:
a rate that was measured to pass.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from bench.planner_eval.cluster import Cluster, ClusterConfig, RolePolicy
from bench.planner_eval.slo import Slo, attainment
from bench.planner_eval.workload import PhaseName, PhaseShape, Segment, schedule


@dataclass(frozen=True)
class SearchSettings:
    duration_s: float = 90.0
    warmup_s: float = 30.0
    start_rate: float = 4.0
    rel_tol: float = 0.03
    max_rate: float = 400.0
    ramp_s: float = 0.0
    """Arrivals ramp from 0 to the probed rate over the first ``ramp_s`` seconds (0, the headline protocol: the
    full rate from the first second). ``startup.py`` uses it for the ramped-start measurement."""


@dataclass(frozen=True)
class Probe:
    rate: float
    attainment: float


@dataclass(frozen=True)
class Goodput:
    rate: float
    """Requests/s; 0 when even the lowest rate tried missed the bar."""
    probes: tuple[Probe, ...]


def measure(
    phase: PhaseName,
    rate: float,
    make_policy: Callable[[], RolePolicy],
    config: ClusterConfig,
    slo: Slo,
    search: SearchSettings,
    seed: int,
    shape: PhaseShape | None = None,
) -> float:
    """Attainment of one probe. ``shape``: request sizes other than the phase's own (``sweep.py``)."""
    arrivals = schedule([Segment(phase, rate, search.duration_s, shape, search.ramp_s)], seed=seed)
    result = Cluster(config, make_policy()).run(arrivals)
    return attainment(slo, (r for r in result.requests if r.arrival >= search.warmup_s))


def goodput(
    phase: PhaseName,
    make_policy: Callable[[], RolePolicy],
    config: ClusterConfig,
    slo: Slo,
    search: SearchSettings = SearchSettings(),
    seed: int = 0,
    shape: PhaseShape | None = None,
) -> Goodput:
    probes: list[Probe] = []

    def ok(rate: float) -> bool:
        att = measure(phase, rate, make_policy, config, slo, search, seed, shape)
        probes.append(Probe(rate, att))
        return att >= slo.attainment

    lo, hi = 0.0, search.start_rate
    while ok(hi):
        lo, hi = hi, hi * 2
        if hi > search.max_rate:
            return Goodput(lo, tuple(probes))
    if lo == 0.0:
        lo_try = hi / 2
        while lo_try >= search.start_rate / 64:
            if ok(lo_try):
                lo = lo_try
                break
            hi, lo_try = lo_try, lo_try / 2
        if lo == 0.0:
            return Goodput(0.0, tuple(probes))
    while (hi - lo) / lo > search.rel_tol:
        mid = (lo + hi) / 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return Goodput(lo, tuple(probes))

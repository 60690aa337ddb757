"""The evaluation's two experiments, as pure functions of their settings (the same seeds give the same figures).

- ``goodput_table``: per phase, per arm, per seed: goodput (goodput.py).
- ``shift_timeline``: the phases back to back at fixed rates; per arm, SLO attainment in 5 s windows, the time back
  within SLO after each shift, the planner's pool sizes over time.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from bench.planner_eval.arms import all_arms
from bench.planner_eval.cluster import Cluster, ClusterConfig, PoolSample
from bench.planner_eval.goodput import SearchSettings, goodput
from bench.planner_eval.slo import Slo, WindowPoint, attainment, over_time, recovery_s
from bench.planner_eval.workload import PhaseName, Segment, schedule


@dataclass(frozen=True)
class GoodputCell:
    phase: PhaseName
    arm: str
    seed: int
    rate: float
    probes: int


def _one_cell(args: tuple[PhaseName, str, int, Slo, ClusterConfig, SearchSettings]) -> GoodputCell:
    phase, arm_name, seed, slo, config, search = args
    arm = next(a for a in all_arms(slo, config) if a.name == arm_name)
    g = goodput(phase, arm.make, arm.config, slo, search, seed=seed)
    return GoodputCell(phase, arm_name, seed, g.rate, len(g.probes))


def goodput_table(
    phases: Sequence[PhaseName],
    arm_names: Sequence[str],
    seeds: Sequence[int],
    slo: Slo,
    config: ClusterConfig,
    search: SearchSettings,
    jobs: int = 1,
) -> list[GoodputCell]:
    work = [(p, a, s, slo, config, search) for s in seeds for p in phases for a in arm_names]
    if jobs <= 1:
        return [_one_cell(w) for w in work]
    with ProcessPoolExecutor(jobs) as pool:
        return list(pool.map(_one_cell, work))


@dataclass(frozen=True)
class Timeline:
    arm: str
    seed: int
    points: list[WindowPoint]
    pools: list[PoolSample]
    phase_attainment: dict[str, float]
    recovery_s: dict[str, float | None]
    """Per shift (the phase shifted to): seconds until back within SLO for good; None: never in that phase."""
    moves: int


WINDOW_S = 5.0


def _one_timeline(args: tuple[str, Sequence[Segment], int, Slo, ClusterConfig]) -> Timeline:
    arm_name, segments, seed, slo, config = args
    arm = next(a for a in all_arms(slo, config) if a.name == arm_name)
    arrivals = schedule(segments, seed=seed)
    result = Cluster(arm.config, arm.make()).run(arrivals)
    end = sum(s.duration_s for s in segments)
    points = over_time(slo, result.requests, WINDOW_S, end)
    phase_att: dict[str, float] = {}
    recovery: dict[str, float | None] = {}
    start = 0.0
    for i, seg in enumerate(segments):
        stop = start + seg.duration_s
        phase_att[seg.phase] = attainment(slo, (r for r in result.requests if start <= r.arrival < stop))
        if i > 0:
            recovery[seg.phase] = recovery_s(points, start, stop, slo.attainment)
        start = stop
    return Timeline(arm.name, seed, points, result.pools, phase_att, recovery, len(result.moves))


def shift_timeline(
    arm_names: Sequence[str], segments: Sequence[Segment], seeds: Sequence[int], slo: Slo, config: ClusterConfig,
    jobs: int = 1,
) -> list[Timeline]:
    work = [(name, segments, seed, slo, config) for seed in seeds for name in arm_names]
    if jobs <= 1:
        return [_one_timeline(w) for w in work]
    with ProcessPoolExecutor(jobs) as pool:
        return list(pool.map(_one_timeline, work))

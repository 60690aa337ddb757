"""The prompt-heavy probe's start-up: what any policy that starts at 4P4D can reach, and a ramped-start measurement
beside the headline one. A side study; the headline protocol (``goodput.py``: full rate from the first second, the
planner at 4P4D, static splits already in their final layout) and its figures are unchanged.

    .venv/bin/python -m bench.planner_eval.startup          # both tables in docs/planner-evaluation.md

1. **Scripted single moves** (one seed, a few rates near the best split's goodput): a policy that moves two of
   4P4D's four decode workers to prefill at a fixed time (every time and every pair), so 6P2D from then on; per cell
   the attainment of the counted requests and the run's preemptions (decode workers out of KV blocks recompute their
   newest request). It bounds what a planner can do under the headline protocol, whatever its rule.
2. **Ramped start**: prompt-heavy goodput of aggregated, the splits around the best one and the planner, with the
   headline protocol and with the arrivals ramped from 0 to the probed rate over ``--ramp-s`` (the same schedule
   for every arm; the first ``warmup_s`` still not counted). A ramp is how load grows when it grows rather than
   jumps; it gives a dynamic policy the seconds to move that the headline protocol gives only the static splits.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from bench.planner_eval.arms import all_arms
from bench.planner_eval.cluster import Cluster, ClusterConfig, Move
from bench.planner_eval.goodput import SearchSettings, goodput
from bench.planner_eval.policies import Static
from bench.planner_eval.slo import Slo, attainment
from bench.planner_eval.workload import Segment, schedule
from litellm_disagg.planner.signals import ClusterSignals
from litellm_disagg.runtime_config import WorkerRole


class ScriptedMove(Static):
    """4P4D (``prefill``/``decode`` of the cluster's halves) that moves ``workers`` to prefill at ``at_s``."""

    def __init__(self, workers: Sequence[str], at_s: float, start: tuple[int, int] = (4, 4)):
        super().__init__(*start)
        self.workers = tuple(workers)
        self.at_s = at_s
        self.interval_s = 0.5

    def decide(self, signals: ClusterSignals, now: float) -> Sequence[Move]:
        if abs(now - self.at_s) > 1e-9:
            return ()
        return tuple(Move(w, WorkerRole.PREFILL) for w in self.workers)


@dataclass(frozen=True)
class MoveCell:
    rate: float
    at_s: float
    workers: tuple[str, ...]
    attainment: float
    preemptions: int


def scripted_move(rate: float, at_s: float, workers: Sequence[str], seed: int, slo: Slo, config: ClusterConfig,
                  search: SearchSettings) -> MoveCell:
    arrivals = schedule([Segment("prompt-heavy", rate, search.duration_s)], seed=seed)
    result = Cluster(config, ScriptedMove(workers, at_s, (config.workers // 2, config.workers - config.workers // 2))
                     ).run(arrivals)
    att = attainment(slo, (r for r in result.requests if r.arrival >= search.warmup_s))
    return MoveCell(rate, at_s, tuple(workers), att, sum(r.preemptions for r in result.requests))


def _one_move(args: tuple[float, float, tuple[str, ...], int, Slo, ClusterConfig, SearchSettings]) -> MoveCell:
    return scripted_move(*args)


def move_table(rates: Sequence[float], times: Sequence[float], seed: int, slo: Slo, config: ClusterConfig,
               search: SearchSettings, jobs: int = 1) -> list[MoveCell]:
    half = config.workers // 2
    decode = [f"w{i}" for i in range(half, config.workers)]
    pairs = list(itertools.combinations(decode, 2))
    work = [(r, t, p, seed, slo, config, search) for r in rates for t in times for p in pairs]
    if jobs <= 1:
        return [_one_move(w) for w in work]
    with ProcessPoolExecutor(jobs) as pool:
        return list(pool.map(_one_move, work))


def move_markdown(cells: Sequence[MoveCell], bar: float) -> str:
    pairs = list(dict.fromkeys(c.workers for c in cells))
    lines = ["| rate | move at | " + " | ".join("+".join(p) for p in pairs) + " | pairs passing |",
             "|---|---|" + "---|" * (len(pairs) + 1)]
    for rate, at in dict.fromkeys((c.rate, c.at_s) for c in cells):
        row = {c.workers: c for c in cells if c.rate == rate and c.at_s == at}
        text = [f"{row[p].attainment:.2f} ({row[p].preemptions})" for p in pairs]
        passing = sum(row[p].attainment >= bar for p in pairs)
        lines.append(f"| {rate:g} | {at:g} s | " + " | ".join(text) + f" | {passing} of {len(pairs)} |")
    lines.append("")
    lines.append("Attainment of the requests arriving after the warm-up (preemptions in the run); the pair names the "
                 "decode workers moved to prefill.")
    return "\n".join(lines)


def _one_goodput(args: tuple[str, int, float, Slo, ClusterConfig, SearchSettings]) -> tuple[str, int, float, float]:
    arm_name, seed, ramp_s, slo, config, search = args
    arm = next(a for a in all_arms(slo, config) if a.name == arm_name)
    ramped = SearchSettings(search.duration_s, search.warmup_s, search.start_rate, search.rel_tol, search.max_rate,
                            ramp_s)
    return arm_name, seed, ramp_s, goodput("prompt-heavy", arm.make, arm.config, slo, ramped, seed=seed).rate


def ramp_table(arms: Sequence[str], seeds: Sequence[int], ramps: Sequence[float], slo: Slo, config: ClusterConfig,
               search: SearchSettings, jobs: int = 1) -> list[tuple[str, int, float, float]]:
    work = [(a, s, r, slo, config, search) for r in ramps for a in arms for s in seeds]
    if jobs <= 1:
        return [_one_goodput(w) for w in work]
    with ProcessPoolExecutor(jobs) as pool:
        return list(pool.map(_one_goodput, work))


def ramp_markdown(rows: Sequence[tuple[str, int, float, float]], arms: Sequence[str], ramps: Sequence[float]) -> str:
    seeds = sorted({s for _, s, _, _ in rows})
    by = {(a, s, r): g for a, s, r, g in rows}

    def head(r: float) -> str:
        return "full rate from t = 0 (headline protocol)" if r == 0 else f"ramped over {r:g} s"

    lines = ["| arm | " + " | ".join(head(r) for r in ramps) + " |", "|---|" + "---|" * len(ramps)]
    for a in arms:
        cells = []
        for r in ramps:
            vals = [by[(a, s, r)] for s in seeds]
            cells.append(", ".join(f"{v:g}" for v in vals))
        lines.append(f"| {a} | " + " | ".join(cells) + " |")
    statics = [a for a in arms if a != "aggregated" and not a.startswith("planner")]
    planners = [a for a in arms if a.startswith("planner")]
    for p in planners:
        cells = []
        for r in ramps:
            ratios = [by[(p, s, r)] / max(by[(a, s, r)] for a in statics) if statics else float("nan")
                      for s in seeds]
            cells.append(", ".join(f"{x:.2f}" for x in ratios))
        lines.append(f"| {p} / best static split | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(f"Goodput (req/s) on prompt-heavy, per seed {seeds}; the ratio rows: each seed's planner over that "
                 "seed's best of the static splits in the table.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.planner_eval.startup", description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2", help="seeds of the ramped-start table")
    ap.add_argument("--move-seed", type=int, default=0, help="the seed of the scripted-move table")
    ap.add_argument("--move-rates", default="22.5,23,24")
    ap.add_argument("--move-times", default="1,2,3,4", help="move times, seconds")
    ap.add_argument("--ramp-s", type=float, default=10.0)
    ap.add_argument("--arms", default="aggregated,5P3D,6P2D,7P1D,planner")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--duration-s", type=float, default=60.0)
    ap.add_argument("--warmup-s", type=float, default=20.0)
    ap.add_argument("--tol", type=float, default=0.03)
    ap.add_argument("--no-moves", action="store_true")
    ap.add_argument("--no-ramp", action="store_true")
    args = ap.parse_args(argv)
    slo, config = Slo(), ClusterConfig()
    search = SearchSettings(duration_s=args.duration_s, warmup_s=args.warmup_s, rel_tol=args.tol)
    started = time.monotonic()
    if not args.no_moves:
        cells = move_table([float(r) for r in args.move_rates.split(",")],
                           [float(t) for t in args.move_times.split(",")], args.move_seed, slo, config, search,
                           args.jobs)
        print(f"## Scripted moves 4P4D -> 6P2D on prompt-heavy (seed {args.move_seed}, {search.duration_s:g} s "
              f"probes, the first {search.warmup_s:g} s not counted)\n")
        print(move_markdown(cells, slo.attainment))
        print()
    if not args.no_ramp:
        arms = args.arms.split(",")
        seeds = [int(s) for s in args.seeds.split(",")]
        rows = ramp_table(arms, seeds, [0.0, args.ramp_s], slo, config, search, args.jobs)
        print(f"## Prompt-heavy goodput: the headline protocol and a ramped start (bisection to "
              f"{search.rel_tol:.0%})\n")
        print(ramp_markdown(rows, arms, [0.0, args.ramp_s]))
    print(f"\n({time.monotonic() - started:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

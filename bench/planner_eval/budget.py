"""Does disaggregation pay against an aggregated engine tuned for the ITL SLO? Aggregated goodput per phase over the
step token budget (``max_num_batched_tokens``, chunked prefill), beside the best static split at the same budgets. A
side study; the headline runs at vLLM's default budget (2,048).

    .venv/bin/python -m bench.planner_eval.budget --seeds 0,1,2 --jobs 2     # the table in docs/planner-evaluation.md

Why the budget matters in this cost model (``litellm_disagg/sim/timing.py``): a step costs ``max(weight read,
prefill tokens / rate) + decode sequences x per-sequence``, so a step carrying up to ``weight read x rate`` prefill
tokens (396 with the default timing: 19.8 ms at 20,000 tokens/s) costs no more than a decode-only step. A budget near
that ridge lets an aggregated worker prefill at nearly its full rate while every decode step stays near 20-30 ms;
at 2,048 a mixed step takes ~100 ms and the ITL SLO caps how often a worker may take one. Below the ridge each step
pays the weight read for fewer prompt tokens and the prefill rate falls. Simulated time: the figures do not depend
on the machine.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from bench.planner_eval.cluster import ClusterConfig
from bench.planner_eval.goodput import SearchSettings, goodput
from bench.planner_eval.policies import Static
from bench.planner_eval.slo import Slo
from bench.planner_eval.workload import PHASES, PhaseName
from litellm_disagg.sim.settings import EngineSettings

SPLITS: dict[PhaseName, str] = {"prompt-heavy": "6P2D", "generation-heavy": "1P7D", "bursts": "5P3D"}
"""Each phase's best static split at the default budget (docs/planner-evaluation.md); the side study checks it at the
other budgets rather than sweeping every split again."""


@dataclass(frozen=True)
class Cell:
    phase: PhaseName
    arm: str
    budget: int
    seed: int
    rate: float


def _policy(arm: str, workers: int) -> Static:
    if arm == "aggregated":
        return Static(0, 0, workers)
    k = int(arm.split("P")[0])
    return Static(k, workers - k)


def _one(args: tuple[PhaseName, str, int, int, int, Slo, SearchSettings]) -> Cell:
    phase, arm, budget, seed, workers, slo, search = args
    config = ClusterConfig(workers=workers, engine=EngineSettings(max_num_batched_tokens=budget))
    found = goodput(phase, lambda: _policy(arm, workers), config, slo, search, seed=seed)
    return Cell(phase, arm, budget, seed, found.rate)


def run(budgets: Sequence[int], seeds: Sequence[int], workers: int, slo: Slo, search: SearchSettings,
        jobs: int) -> list[Cell]:
    tasks = [(phase, arm, budget, seed, workers, slo, search)
             for phase in PHASES for arm in ("aggregated", SPLITS[phase]) for budget in budgets for seed in seeds]
    if jobs <= 1:
        return [_one(t) for t in tasks]
    with ProcessPoolExecutor(jobs) as pool:
        return list(pool.map(_one, tasks))


def _range(values: Sequence[float]) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:g}" if lo == hi else f"{lo:g}-{hi:g}"


def markdown(cells: Sequence[Cell], budgets: Sequence[int]) -> str:
    lines = ["| phase | arm | " + " | ".join(f"budget {b:,}" for b in budgets) + " |",
             "|---|---|" + "---|" * len(budgets)]
    for phase in PHASES:
        for arm in ("aggregated", SPLITS[phase]):
            row = [_range([c.rate for c in cells if c.phase == phase and c.arm == arm and c.budget == b])
                   for b in budgets]
            lines.append(f"| {phase} | {arm} | " + " | ".join(row) + " |")
    lines.append("\nGoodput in requests/s (>= 90% within both SLOs), range over the seeds.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.planner_eval.budget", description=__doc__.splitlines()[0])
    ap.add_argument("--budgets", default="256,512,1024,2048", help="step token budgets, comma-separated")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--duration-s", type=float, default=60.0)
    ap.add_argument("--warmup-s", type=float, default=20.0)
    ap.add_argument("--tol", type=float, default=0.03, help="goodput bisection's relative tolerance")
    args = ap.parse_args(argv)
    budgets = [int(b) for b in args.budgets.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    slo = Slo()
    search = SearchSettings(duration_s=args.duration_s, warmup_s=args.warmup_s, rel_tol=args.tol)
    started = time.monotonic()
    cells = run(budgets, seeds, args.workers, slo, search, args.jobs)
    print(f"## Goodput over the step token budget ({args.workers} workers, TTFT <= {slo.ttft_s:g} s, ITL <= "
          f"{slo.itl_s * 1e3:g} ms; {search.duration_s:g} s probes, the first {search.warmup_s:g} s not counted, "
          f"bisection to {search.rel_tol:.0%})\n")
    print(markdown(cells, budgets))
    print(f"\n({time.monotonic() - started:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

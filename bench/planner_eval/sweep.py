"""Where does disaggregation pay 1.5x? The prompt-heavy phase's goodput, aggregated against every static split, over
the prompts' length and the ITL SLO. A side study; the headline workload (``workload.SHAPES``) is unchanged.

    .venv/bin/python -m bench.planner_eval.sweep            # the table in docs/planner-evaluation.md
    .venv/bin/python -m bench.planner_eval.sweep --cross --itl-ms 30,35     # every length at 30 and 35 ms

Each row is one prompt-heavy shape: prompts drawn uniformly in ``[2/3 L, 4/3 L]`` around a mean ``L`` (L = 4,608 is
the headline phase, 3,072-6,144), outputs 32-128 tokens as in the headline, Poisson arrivals; one ITL SLO (TTFT stays
the headline's). Rows: every ``--prompt-tokens`` at the headline ITL SLO, then every other ``--itl-ms`` at the
headline length (``--cross``: every length at every ITL SLO). Per row and seed: goodput (``goodput.py``) of ``aggregated`` and of each static split kP(n-k)D; the
best split's ratio to aggregated; and, at the first rate each of the two failed, which target the requests missed
(TTFT, ITL: shares of the counted requests; one request can miss both), which says what limits that arm.
Simulated time: the figures do not depend on the machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from bench.planner_eval.arms import static_split_names
from bench.planner_eval.cluster import Cluster, ClusterConfig
from bench.planner_eval.goodput import Goodput, SearchSettings, goodput
from bench.planner_eval.policies import Static
from bench.planner_eval.slo import Slo
from bench.planner_eval.workload import SHAPES, PhaseShape, Segment, schedule

HEADLINE_PROMPT = sum(SHAPES["prompt-heavy"].prompt_tokens) // 2
"""4,608: the mean of the headline prompt-heavy phase's 3,072-6,144."""


def prompt_shape(mean_tokens: int) -> PhaseShape:
    """The prompt-heavy phase with prompts uniform in [2/3, 4/3] of ``mean_tokens`` (the headline at 4,608)."""
    base = SHAPES["prompt-heavy"]
    return PhaseShape(base.name, (round(mean_tokens * 2 / 3), round(mean_tokens * 4 / 3)), base.output_tokens)


def _policy(arm: str, workers: int) -> Static:
    if arm == "aggregated":
        return Static(0, 0, workers)
    k = int(arm.split("P")[0])
    return Static(k, workers - k)


@dataclass(frozen=True)
class Misses:
    rate: float
    ttft: float
    """Share of the counted requests over the TTFT target (or never getting a first token)."""
    itl: float
    """Share over the ITL target (or never finishing)."""


@dataclass(frozen=True)
class Cell:
    prompt_tokens: int
    itl_ms: float
    arm: str
    seed: int
    rate: float
    misses: Misses | None
    """At the lowest rate tried that failed (None: none failed)."""


def misses_at(arm: str, rate: float, shape: PhaseShape, slo: Slo, config: ClusterConfig, search: SearchSettings,
              seed: int) -> Misses:
    arrivals = schedule([Segment("prompt-heavy", rate, search.duration_s, shape)], seed=seed)
    result = Cluster(config, _policy(arm, config.workers)).run(arrivals)
    counted = [r for r in result.requests if r.arrival >= search.warmup_s] or result.requests
    ttft = sum(1 for r in counted if r.ttft is None or r.ttft > slo.ttft_s) / max(1, len(counted))
    itl = sum(1 for r in counted if r.itl is None or r.itl > slo.itl_s) / max(1, len(counted))
    return Misses(rate, ttft, itl)


def _first_failure(g: Goodput, bar: float) -> float | None:
    failed = [p.rate for p in g.probes if p.attainment < bar and p.rate > g.rate]
    return min(failed) if failed else None


def _one(args: tuple[int, float, str, int, Slo, ClusterConfig, SearchSettings]) -> Cell:
    prompt, itl_ms, arm, seed, slo, config, search = args
    shape = prompt_shape(prompt)
    g = goodput("prompt-heavy", lambda: _policy(arm, config.workers), config, slo, search, seed=seed, shape=shape)
    fail = _first_failure(g, slo.attainment)
    miss = None if fail is None else misses_at(arm, fail, shape, slo, config, search, seed)
    return Cell(prompt, itl_ms, arm, seed, g.rate, miss)


def rows_of(prompts: Sequence[int], itls_ms: Sequence[float], default_itl_ms: float,
            cross: bool = False) -> list[tuple[int, float]]:
    """Every prompt length at the headline ITL SLO, then every other ITL SLO at the headline length; ``cross``:
    every prompt length at every ITL SLO instead (ITL SLO by ITL SLO)."""
    if cross:
        return [(p, i) for i in itls_ms for p in prompts]
    rows = [(p, default_itl_ms) for p in prompts]
    rows += [(HEADLINE_PROMPT, i) for i in itls_ms if i != default_itl_ms]
    return list(dict.fromkeys(rows))


def run_sweep(rows: Sequence[tuple[int, float]], seeds: Sequence[int], slo: Slo, config: ClusterConfig,
              search: SearchSettings, jobs: int = 1) -> list[Cell]:
    arms = ["aggregated", *static_split_names(config.workers)]
    work = [(p, i, arm, seed, Slo(slo.ttft_s, i / 1e3, slo.attainment), config, search)
            for p, i in rows for seed in seeds for arm in arms]
    if jobs <= 1:
        return [_one(w) for w in work]
    with ProcessPoolExecutor(jobs) as pool:
        return list(pool.map(_one, work))


def _range(values: Sequence[float], fmt: str) -> str:
    lo, hi = fmt.format(min(values)), fmt.format(max(values))
    return lo if lo == hi else f"{lo}-{hi}"


def _misses_text(cells: Sequence[Cell]) -> str:
    parts = [f"{c.misses.rate:g}: {c.misses.ttft:.0%} / {c.misses.itl:.0%}" for c in cells if c.misses is not None]
    return "; ".join(parts) or "-"


def markdown(cells: Sequence[Cell], rows: Sequence[tuple[int, float]], workers: int) -> str:
    splits = static_split_names(workers)
    lines = [
        "| mean prompt (range) | ITL SLO | aggregated | best static split | best / aggregated | aggregated misses "
        "TTFT / ITL at its first failed rate | best split misses TTFT / ITL |",
        "|---|---|---|---|---|---|---|",
    ]
    for prompt, itl_ms in rows:
        row = [c for c in cells if c.prompt_tokens == prompt and c.itl_ms == itl_ms]
        seeds = sorted({c.seed for c in row})
        by = {(c.arm, c.seed): c for c in row}
        best = max(splits, key=lambda n: statistics.median(by[(n, s)].rate for s in seeds))
        agg = [by[("aggregated", s)].rate for s in seeds]
        top = [max(by[(n, s)].rate for n in splits) for s in seeds]
        ratios = [t / a if a else float("inf") for t, a in zip(top, agg, strict=True)]
        lo, hi = prompt_shape(prompt).prompt_tokens
        lines.append(
            f"| {prompt:,} ({lo:,}-{hi:,}) | {itl_ms:g} ms | {_range(agg, '{:.1f}')} | "
            f"{_range([by[(best, s)].rate for s in seeds], '{:.1f}')} ({best}) | {_range(ratios, '{:.2f}')} | "
            f"{_misses_text([by[('aggregated', s)] for s in seeds])} | "
            f"{_misses_text([by[(best, s)] for s in seeds])} |"
        )
    lines.append("")
    lines.append(f"Goodput in requests/s, range over seeds {sorted({c.seed for c in cells})}; best / aggregated per "
                 "seed (each seed's best split); misses: the rate, then the shares of requests over each target.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.planner_eval.sweep", description=__doc__.splitlines()[0])
    ap.add_argument("--prompt-tokens", default="1024,2048,4608,9216",
                    help="mean prompt lengths, comma-separated (4608: the headline phase)")
    ap.add_argument("--itl-ms", default="25,30,35,40,60", help="ITL SLOs (ms) to run at the headline prompt length")
    ap.add_argument("--cross", action="store_true", help="every prompt length at every ITL SLO")
    ap.add_argument("--seeds", default="0", help="comma-separated seeds (default 0)")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--ttft-s", type=float, default=Slo.ttft_s)
    ap.add_argument("--duration-s", type=float, default=60.0)
    ap.add_argument("--warmup-s", type=float, default=20.0)
    ap.add_argument("--tol", type=float, default=0.05, help="goodput bisection's relative tolerance")
    args = ap.parse_args(argv)
    default_itl = Slo.itl_s * 1e3
    rows = rows_of([int(p) for p in args.prompt_tokens.split(",")], [float(i) for i in args.itl_ms.split(",")],
                   default_itl, args.cross)
    seeds = [int(s) for s in args.seeds.split(",")]
    search = SearchSettings(duration_s=args.duration_s, warmup_s=args.warmup_s, rel_tol=args.tol)
    started = time.monotonic()
    cells = run_sweep(rows, seeds, Slo(ttft_s=args.ttft_s), ClusterConfig(workers=args.workers), search, args.jobs)
    print(f"## Prompt-heavy: aggregated against the best static split ({args.workers} workers, TTFT <= "
          f"{args.ttft_s:g} s; {search.duration_s:g} s probes, the first {search.warmup_s:g} s not counted, "
          f"bisection to {search.rel_tol:.0%})\n")
    print(markdown(cells, rows, args.workers))
    print(f"\n({time.monotonic() - started:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

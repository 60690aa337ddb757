"""``python -m bench.serving.replicas``: the serving benchmark with 1 and with N proxy replicas, runs interleaved.

    flock -x /tmp/ld-cpu.lock .venv/bin/python -m bench.serving.replicas --workload shared \\
        --arms kv_aware,least_busy --proxies 1,2 --runs 3

Users run several LiteLLM proxies behind one address. Each of our replicas subscribes to every worker's KV events and
scrapes every worker's ``/metrics`` itself (shared truth), but counts only its own requests in flight
(``routing/accounting.py``); LiteLLM's ``least-busy`` likewise counts per process. This runs the same seeded schedule
through each arm with each replica count (sessions spread over the replicas round robin, a conversation's turns
through one replica), on one set of simulated workers, every combination once per run, runs interleaved
(run 1: every arm x replicas, run 2: ...), and prints each run's table and the ranges (min-max over runs) per arm and
replica count: TTFT p50/p99, prefix-cache hit rate, busiest worker / mean. Writes
``<out>/serving_replicas_<workload>.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import sys
from pathlib import Path

from bench.serving import __main__ as serving
from bench.serving import arms as arms_mod
from bench.serving import cli, report, workloads
from bench.serving.redis_server import redis_server
from bench.serving.variants import Variant


@dataclasses.dataclass(frozen=True)
class Row:
    arm: str
    proxies: int
    run: int
    figures: report.ArmFigures
    redis: bool = False


def ranges_table(rows: list[Row]) -> str:
    head = (f"{'arm':12s} {'proxies':>13s} {'TTFT p50 ms':>13s} {'TTFT p99 ms':>13s} {'hit rate %':>11s} "
            f"{'busiest/mean':>12s} {'failed':>6s}")
    lines = [head, "-" * len(head)]
    keys = sorted({(r.arm, r.proxies, r.redis) for r in rows})
    for arm, proxies, redis in keys:
        mine = [r.figures for r in rows if (r.arm, r.proxies, r.redis) == (arm, proxies, redis)]

        def span(values: list[float], spec: str) -> str:
            return f"{min(values):{spec}}-{max(values):{spec}}"

        lines.append(
            f"{arm:12s} {Variant(proxies, redis).label:>13s} {span([f.ttft_p50_ms for f in mine], '.0f'):>13s} "
            f"{span([f.ttft_p99_ms for f in mine], '.0f'):>13s} {span([f.hit_rate * 100 for f in mine], '.1f'):>11s} "
            f"{span([f.imbalance for f in mine], '.2f'):>12s} {sum(f.failed for f in mine):6d}")
    return "\n".join(lines)


def parse_args(argv: list[str]) -> argparse.Namespace:
    """This module's --proxies (a list of counts) and --runs; every other option is the serving benchmark's."""
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--proxies", default="1,2",
                     help="comma-separated replica counts to compare; N r (e.g. 2r): N replicas sharing a Redis")
    own.add_argument("--runs", type=int, default=3)
    mine, rest = own.parse_known_args(argv)
    saved, sys.argv = sys.argv, ["python -m bench.serving.replicas", *rest]
    try:
        args = serving.parse_args()
    finally:
        sys.argv = saved
    try:
        args.variants = [Variant.parse(n) for n in mine.proxies.split(",")]
    except ValueError:
        raise SystemExit("--proxies takes counts >= 1, each optionally followed by r (with Redis)") from None
    args.runs = mine.runs
    if args.runs < 1:
        raise SystemExit("--runs takes at least 1")
    return args


def main(argv: list[str] | None = None) -> list[Row]:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.WARNING)
    arm_names = args.arms.split(",")
    for name in arm_names:
        if name not in arms_mod.ARMS:
            raise SystemExit(f"unknown arm {name!r}; choose from {', '.join(arms_mod.ARMS)}")
    workload = args.workload
    if workload not in workloads.WORKLOADS:
        raise SystemExit(f"one workload, from: {', '.join(workloads.WORKLOADS)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    run_dir = cli.new_run_dir("serving-replicas-")
    shape = cli.shape_from_args(args)
    schedule = workloads.build(workload, shape, seed=args.seed)  # type: ignore[arg-type]
    workers = serving.start_workers(args, run_dir)
    rows: list[Row] = []
    with contextlib.ExitStack() as stack:
        stack.callback(workers.close)
        redis_port = (stack.enter_context(redis_server(run_dir / "redis"))
                      if any(v.redis for v in args.variants) else None)
        serving.warm_if_real(args, workers)
        for run in range(1, args.runs + 1):
            for name in arm_names:
                for variant in args.variants:
                    print(f"[{workload}] run {run} {name} {variant.label} ...", flush=True)
                    args.proxies = variant.proxies
                    args.redis_port = redis_port if variant.redis else None
                    fig = serving.run_arm(name, schedule, workers, args, run_dir)  # type: ignore[arg-type]
                    fig.arm = f"{name} {variant.label}"
                    rows.append(Row(name, variant.proxies, run, fig, variant.redis))
                    print(report.table([fig]).splitlines()[-1], flush=True)
    title = (f"{workload}: {schedule.requests} requests at {args.rate:g}/s over {args.workers} "
             f"{'simulated' if args.backend == 'sim' else 'vLLM CPU'} workers, {args.runs} runs interleaved")
    for run in range(1, args.runs + 1):
        print(f"\nrun {run}\n{report.table([r.figures for r in rows if r.run == run])}")
    print(f"\n{title}: ranges (min-max over runs)\n{ranges_table(rows)}")
    path = out / f"serving_replicas_{workload}.json"
    meta = {k: v for k, v in vars(args).items() if k not in ("out", "variants")}
    meta["variants"] = [v.label for v in args.variants]
    path.write_text(json.dumps({"meta": meta, "rows": [
        {"arm": r.arm, "proxies": r.proxies, "redis": r.redis, "run": r.run, **dataclasses.asdict(r.figures)}
        for r in rows]}, indent=2))
    print(f"wrote {path}", flush=True)
    return rows


if __name__ == "__main__":
    main()

"""``python -m bench.planner_eval``: goodput per phase and arm, the phase-shift timeline, tables and PNGs.

    .venv/bin/python -m bench.planner_eval                  # the figures in docs/planner-evaluation.md (~10 min, 2 cores)
    .venv/bin/python -m bench.planner_eval --quick           # a small version (one seed, short runs)

Deterministic: the same seeds give the same tables (simulated time; nothing depends on the machine's speed).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path

from bench.planner_eval import plots, report
from bench.planner_eval.arms import all_arms, one_to_one
from bench.planner_eval.cluster import ClusterConfig
from bench.planner_eval.goodput import SearchSettings
from bench.planner_eval.profile import checked, misprofiled, profile_engine
from bench.planner_eval.run import goodput_table, shift_timeline
from bench.planner_eval.slo import Slo
from bench.planner_eval.workload import PHASES, Segment
from litellm_disagg.planner.mixing import EngineProfile
from litellm_disagg.sim.settings import EngineSettings, TimingSettings

PLANNERS = ("planner", "planner (fast)", "planner (fast, prefill TTFT)")


def _layout(text: str | None, workers: int) -> tuple[int, int, int] | None:
    if text is None:
        return None
    parts = tuple(int(x) for x in text.split(","))
    if len(parts) != 3 or min(parts) < 0 or sum(parts) != workers:
        raise SystemExit(f"--planner-start: three counts (prefill,decode,both) adding up to {workers}, got {text!r}")
    return parts[0], parts[1], parts[2]


def _profile(args: argparse.Namespace, engine: EngineSettings) -> EngineProfile | None:
    """The planner arms' engine profile: none, the simulated engine's, or that one scaled by ``--profile-error``."""
    if not args.engine_profile:
        if args.profile_error is not None:
            raise SystemExit("--profile-error needs --engine-profile")
        return None
    profile = profile_engine(TimingSettings(), engine)
    if args.profile_error is None:
        return profile
    try:
        weight, per_seq, rate = (float(x) for x in args.profile_error.split(","))
    except ValueError:
        raise SystemExit(f"--profile-error: three factors W,S,R, got {args.profile_error!r}") from None
    if min(weight, per_seq, rate) <= 0:
        raise SystemExit(f"--profile-error: factors must be > 0, got {args.profile_error!r}")
    return misprofiled(profile, weight, per_seq, rate)


def _checked(args: argparse.Namespace, profile: EngineProfile | None, engine: EngineSettings) -> EngineProfile | None:
    """``--check-profile RATES``: the profile checked on one simulated ``both`` worker at those prompt-heavy rates
    (``profile.checked``, as ``litellm-disagg profile --check-load``), carrying the largest correction."""
    if args.check_profile is None:
        return profile
    if profile is None:
        raise SystemExit("--check-profile needs --engine-profile")
    try:
        rates = [float(x) for x in args.check_profile.split(",")]
    except ValueError:
        raise SystemExit(f"--check-profile: comma-separated rates, got {args.check_profile!r}") from None
    if not rates or any(r <= 0 for r in rates):
        raise SystemExit(f"--check-profile: rates must be > 0, got {args.check_profile!r}")
    if args.check_seconds <= 0:
        raise SystemExit(f"--check-seconds must be > 0, got {args.check_seconds}")
    profile, checks = checked(profile, engine, rates, seconds=args.check_seconds, seed=args.check_seed)
    for c in checks:
        factor = "n/a" if c.factor is None else f"{c.factor:.2f}"
        print(f"profile check: {c.load.requests_per_s:g} req/s prompt-heavy on one worker, {c.requests} requests: ITL p90 "
              f"{c.itl_p_ms or 0:.1f} ms, estimate {c.estimate.itl_ms or float('nan'):.1f} ms, factor {factor}")
    print(f"profile check: mixing_correction {profile.mixing_correction:.3f}\n")
    return profile


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.planner_eval", description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default 0,1,2)")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--ttft-s", type=float, default=Slo.ttft_s)
    ap.add_argument("--itl-ms", type=float, default=Slo.itl_s * 1e3)
    ap.add_argument("--phase-s", type=float, default=120.0, help="length of each phase in the shift timeline")
    ap.add_argument("--quick", action="store_true", help="one seed, shorter runs, coarser search")
    ap.add_argument("--img-dir", type=Path, default=Path("docs/img"))
    ap.add_argument("--json", type=Path, default=Path("bench/results/planner_eval.json"))
    ap.add_argument("--no-timeline", action="store_true")
    ap.add_argument("--duration-s", type=float, default=SearchSettings.duration_s, help="arrivals per goodput probe")
    ap.add_argument("--warmup-s", type=float, default=SearchSettings.warmup_s, help="not counted in attainment")
    ap.add_argument("--tol", type=float, default=SearchSettings.rel_tol, help="goodput bisection's relative tolerance")
    ap.add_argument("--max-num-batched-tokens", type=int, default=EngineSettings().max_num_batched_tokens,
                    help="every worker's step token budget (chunked prefill; default %(default)s, vLLM's): a smaller "
                         "budget shortens the aggregated workers' mixed steps")
    ap.add_argument("--planner-start", default=None, metavar="P,D,B",
                    help="the planner arms' starting layout (prefill, decode, both workers; default the 1:1 split)")
    ap.add_argument("--engine-profile", action="store_true",
                    help="give the planner arms the engine profile measured on the simulated engine "
                         "(bench/planner_eval/profile.py): they may then cross from a split to aggregated on load")
    ap.add_argument("--profile-error", default=None, metavar="W,S,R",
                    help="with --engine-profile: multiply the profile's weight read, cost per sequence and prefill "
                         "rate by these factors (a profile measured wrong), e.g. 1.2,1,0.8")
    ap.add_argument("--check-profile", default=None, metavar="RATES",
                    help="with --engine-profile: check the profile on one simulated both worker at these "
                         "prompt-heavy request rates (as litellm-disagg profile --check-load does on a real "
                         "worker) and give the planner the largest correction found, e.g. 1,1.5,2")
    ap.add_argument("--check-seconds", type=float, default=240.0,
                    help="with --check-profile: seconds of arrivals per check load (default 240; at 60 s one "
                         "worker's p90 swings with the arrival sample: docs/planner-evaluation.md)")
    ap.add_argument("--check-seed", type=int, default=0, help="with --check-profile: the check's arrival seed")
    ap.add_argument("--first-tick-at-interval", action="store_true",
                    help="the planner's first step one interval after the load starts (the protocol before "
                         "2026-12-02) instead of with the first arrival")
    args = ap.parse_args(argv)

    seeds = [int(s) for s in args.seeds.split(",")]
    search = SearchSettings(duration_s=args.duration_s, warmup_s=args.warmup_s, rel_tol=args.tol)
    if args.quick:
        seeds = seeds[:1]
        search = SearchSettings(duration_s=45.0, warmup_s=15.0, rel_tol=0.1)
        args.phase_s = min(args.phase_s, 60.0)
    slo = Slo(ttft_s=args.ttft_s, itl_s=args.itl_ms / 1e3)
    engine = EngineSettings(max_num_batched_tokens=args.max_num_batched_tokens)
    config = ClusterConfig(workers=args.workers, first_tick_s=None if args.first_tick_at_interval else 0.0,
                           engine=engine, planner_start=_layout(args.planner_start, args.workers),
                           planner_profile=_checked(args, _profile(args, engine), engine))
    arm_names = [a.name for a in all_arms(slo, config)]
    started = time.monotonic()

    cells = goodput_table(PHASES, arm_names, seeds, slo, config, search, jobs=args.jobs)
    print(f"## Goodput (TTFT <= {slo.ttft_s:g} s, ITL <= {slo.itl_s * 1e3:g} ms, {args.workers} workers, "
          f"{args.max_num_batched_tokens}-token step budget)\n")
    print(f"Search: {search.duration_s:g} s of arrivals per probe, the first {search.warmup_s:g} s not counted, "
          f"bisection to {search.rel_tol:.0%}.\n")
    print(report.goodput_markdown(cells, PHASES, args.workers, PLANNERS))
    print("\n### Every static split\n")
    print(report.sweep_markdown(cells, PHASES, args.workers))
    for planner in PLANNERS:
        print(f"\n### Targets: {planner}\n")
        print(report.targets_markdown(cells, PHASES, args.workers, planner))

    out: dict[str, object] = {"slo": asdict(slo), "seeds": seeds, "goodput": [asdict(c) for c in cells]}
    args.img_dir.mkdir(parents=True, exist_ok=True)
    plots.goodput_plot(cells, PHASES, arm_names, args.img_dir / "planner_goodput.png")

    if not args.no_timeline:
        rates = {}
        for phase in PHASES:
            best = report.best_static(cells, phase, args.workers)
            rates[phase] = 0.8 * statistics.median(c.rate for c in cells if c.phase == phase and c.arm == best)
        segments = [Segment(p, round(rates[p], 2), args.phase_s) for p in PHASES]
        first_best = report.best_static(cells, PHASES[0], args.workers)
        arms = ["aggregated", one_to_one(args.workers)]
        arms += [first_best] if first_best not in arms else []
        arms += list(PLANNERS)
        timelines = shift_timeline(arms, segments, seeds, slo, config, jobs=args.jobs)
        rates_text = ", ".join(f"{s.phase} {s.rate:g} req/s" for s in segments)
        print(f"\n## Phase shifts ({args.phase_s:g} s each: {rates_text}; 0.8x each phase's best static goodput)\n")
        print(report.timeline_markdown(timelines, PHASES))
        plots.timeline_plot(timelines, segments, seeds[0], args.img_dir / "planner_timeline.png")
        out["timeline"] = [
            {"arm": t.arm, "seed": t.seed, "phase_attainment": t.phase_attainment, "recovery_s": t.recovery_s,
             "moves": t.moves, "points": [asdict(p) for p in t.points], "pools": [asdict(p) for p in t.pools]}
            for t in timelines
        ]
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=1))
    print(f"\n(plots in {args.img_dir}, data in {args.json}; {time.monotonic() - started:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

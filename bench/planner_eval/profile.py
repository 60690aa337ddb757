"""The engine profile the planner's aggregated estimate needs (``litellm_disagg.planner.mixing.EngineProfile``),
measured on the simulated engine as a profiling run measures a real one: decode-only steps at several batch sizes
(a least-squares line: the intercept is the weight read, the slope the cost per sequence) and one prefill-only step
over a long prompt (its tokens over its time: the compute-bound rate). The step budget is the workers' own.

    python -m bench.planner_eval.profile [--max-num-batched-tokens N]     # prints the profile as YAML

``misprofiled`` scales it (``python -m bench.planner_eval --engine-profile --profile-error W,S,R``); ``checked``
checks it on one simulated ``both`` worker as ``litellm-disagg profile --check-load`` does on a real one
(``--check-profile``).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from bench.planner_eval.cluster import Cluster, ClusterConfig
from bench.planner_eval.policies import Static
from bench.planner_eval.workload import PhaseName, Segment, schedule
from litellm_disagg.planner.mixing import EngineProfile
from litellm_disagg.planner.mixing_check import MixedLoad, MixingCheck, summarize
from litellm_disagg.planner.profiler import StreamedAnswer
from litellm_disagg.sim.settings import EngineSettings, TimingSettings
from litellm_disagg.sim.timing import StepWork, TimingModel

BATCHES = (1, 2, 4, 8, 16, 32, 64, 128)


def profile_engine(timing: TimingSettings, engine: EngineSettings) -> EngineProfile:
    model = TimingModel(timing)
    xs = [float(b) for b in BATCHES]
    ys = [1000.0 * model.step_time(StepWork(decode_seqs=b)) for b in BATCHES]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = (sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True))
             / sum((x - mean_x) ** 2 for x in xs))
    intercept = mean_y - slope * mean_x
    prompt = engine.max_model_len
    rate = prompt / model.step_time(StepWork(prefill_tokens=prompt))
    return EngineProfile(weight_read_ms=intercept, per_sequence_ms=max(0.0, slope), prefill_tokens_per_s=rate,
                         max_num_batched_tokens=engine.max_num_batched_tokens)


def misprofiled(profile: EngineProfile, weight_read: float = 1.0, per_sequence: float = 1.0,
                prefill_rate: float = 1.0) -> EngineProfile:
    """``profile`` with each measured number multiplied by its factor: a profile measured wrong (a noisy or stale
    profiling run), for how far the planner's use of it tolerates the error."""
    return profile.model_copy(update={"weight_read_ms": profile.weight_read_ms * weight_read,
                                      "per_sequence_ms": profile.per_sequence_ms * per_sequence,
                                      "prefill_tokens_per_s": profile.prefill_tokens_per_s * prefill_rate})


def checked(profile: EngineProfile, engine: EngineSettings, rates: Sequence[float], *, seconds: float = 60.0,
            seed: int = 0, headroom: float = 0.7, quantile: float = 0.9,
            phase: PhaseName = "prompt-heavy") -> tuple[EngineProfile, list[MixingCheck]]:
    """``profile`` checked as ``litellm-disagg profile --check-load`` checks a real one: one ``both`` worker of the
    simulated engine serves the phase at each of ``rates`` (requests/s) for ``seconds``, and the product's own
    summary (``mixing_check.summarize``: the requests' TPOT percentile against the estimate) gives each load's
    correction; the profile comes back with the largest as its ``mixing_correction``."""
    checks: list[MixingCheck] = []
    for rate in rates:
        arrivals = schedule([Segment(phase, rate, seconds)], seed=seed)
        result = Cluster(ClusterConfig(workers=1, engine=engine, seed=seed), Static(0, 0, 1)).run(arrivals)
        answers = [StreamedAnswer(None if r.itl is None else r.itl * 1000.0, r.prompt,
                                  r.output if r.finish is not None else 0) for r in result.requests]
        load = MixedLoad(requests_per_s=rate, seconds=seconds, seed=seed)
        checks.append(summarize(load, answers, profile, quantile=quantile, margin=headroom))
    correction = max([1.0] + [c.correction for c in checks])
    return profile.model_copy(update={"mixing_correction": correction}), checks


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.planner_eval.profile", description=__doc__.splitlines()[0])
    ap.add_argument("--max-num-batched-tokens", type=int, default=EngineSettings().max_num_batched_tokens)
    ap.add_argument("--profile-error", default=None, metavar="W,S,R", help="scale the profile (misprofiled)")
    ap.add_argument("--check", default=None, metavar="RATES",
                    help="check the profile on one simulated both worker at these prompt-heavy rates (checked)")
    ap.add_argument("--seconds", type=float, default=240.0, help="with --check: seconds of arrivals per load")
    ap.add_argument("--seeds", default="0", help="with --check: comma-separated arrival seeds, one check each")
    args = ap.parse_args(argv)
    engine = EngineSettings(max_num_batched_tokens=args.max_num_batched_tokens)
    profile = profile_engine(TimingSettings(), engine)
    if args.profile_error:
        profile = misprofiled(profile, *(float(x) for x in args.profile_error.split(",")))
    if args.check:
        rates = [float(x) for x in args.check.split(",")]
        for seed in (int(x) for x in args.seeds.split(",")):
            corrected, checks = checked(profile, engine, rates, seconds=args.seconds, seed=seed)
            factors = ", ".join(f"{c.load.requests_per_s:g} req/s ({c.requests} requests) "
                                + ("n/a" if c.factor is None else f"{c.factor:.2f}") for c in checks)
            print(f"seed {seed}, {args.seconds:g} s: factors {factors}; mixing_correction "
                  f"{corrected.mixing_correction:.2f}")
        return 0
    print("engine_profile:")
    for name, value in profile.model_dump().items():
        print(f"  {name}: {round(value, 4) if isinstance(value, float) else value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

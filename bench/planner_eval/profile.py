"""The engine profile the planner's aggregated estimate needs (``litellm_disagg.planner.mixing.EngineProfile``),
measured on the simulated engine as a profiling run measures a real one: decode-only steps at several batch sizes
(a least-squares line: the intercept is the weight read, the slope the cost per sequence) and one prefill-only step
over a long prompt (its tokens over its time: the compute-bound rate). The step budget is the workers' own.

    python -m bench.planner_eval.profile [--max-num-batched-tokens N]     # prints the profile as YAML

``misprofiled`` scales it (``python -m bench.planner_eval --engine-profile --profile-error W,S,R``).
"""

from __future__ import annotations

import argparse

from litellm_disagg.planner.mixing import EngineProfile
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.planner_eval.profile", description=__doc__.splitlines()[0])
    ap.add_argument("--max-num-batched-tokens", type=int, default=EngineSettings().max_num_batched_tokens)
    args = ap.parse_args(argv)
    profile = profile_engine(TimingSettings(), EngineSettings(max_num_batched_tokens=args.max_num_batched_tokens))
    print("engine_profile:")
    for name, value in profile.model_dump().items():
        print(f"  {name}: {round(value, 4) if isinstance(value, float) else value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

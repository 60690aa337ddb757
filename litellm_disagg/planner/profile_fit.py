"""An engine profile (``mixing.EngineProfile``) fitted from measured points. Pure; no I/O.

    fit_profile(decode_points, prefill_points, max_num_batched_tokens) -> ProfileFit

- **Decode**: the step time of ``batch`` sequences decoding together (a request's time per output token while the
  others decode beside it). A least-squares line over two or more batch sizes: its intercept is the step's fixed cost
  (``weight_read_ms``: reading the weights, plus the engine's per-step overhead), its slope the cost per sequence
  (``per_sequence_ms``).
- **Prefill**: a prompt's time to its first token against its length. A least-squares line over two or more lengths:
  its slope is the inverse of the compute-bound rate (``prefill_tokens_per_s``); its intercept holds everything
  that does not grow with the prompt (the HTTP round trip, the first token's decode step), which the slope leaves
  out. The lengths should be long enough that a step's prompt tokens take longer than the weight read (on a GPU a
  few hundred tokens or more; ``profiler.py`` picks a quarter and three quarters of the model's context).

The fit also reports how well the lines fit (R²) and the predicted step at each measured batch, so an operator can
see a profile that rests on noise before putting it in ``proxy_config.yaml``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from litellm_disagg.planner.mixing import EngineProfile


class ProfileFitError(ValueError):
    """The points cannot give a profile (too few distinct sizes, or a line that is not physical)."""


@dataclass(frozen=True)
class DecodePoint:
    """``batch`` sequences decoding together took ``step_ms`` per step (per output token of each)."""

    batch: int
    step_ms: float


@dataclass(frozen=True)
class PrefillPoint:
    """A ``prompt_tokens``-token prompt took ``seconds`` from sending it to its first (only) output token."""

    prompt_tokens: int
    seconds: float


@dataclass(frozen=True)
class Line:
    intercept: float
    slope: float
    r2: float
    """Coefficient of determination (1.0: the points lie on the line; 1.0 too when they do not vary)."""


@dataclass(frozen=True)
class ProfileFit:
    profile: EngineProfile
    decode: Line
    """Step milliseconds against batch size."""
    prefill: Line
    """Seconds against prompt tokens."""
    decode_points: tuple[DecodePoint, ...]
    prefill_points: tuple[PrefillPoint, ...]

    def predicted_step_ms(self, batch: int) -> float:
        return self.profile.step_ms(0, batch)

    def warnings(self, *, r2_min: float = 0.9, off_line_max: float = 0.15) -> tuple[str, ...]:
        """What an operator should know before trusting the profile: decode points that scatter about their line
        (R² under ``r2_min``), each decode point more than ``off_line_max`` off its fitted step, and a prompt time
        that grows faster than the prompt (a fixed cost under 0: the rate is then the longer prompts' marginal one).
        None of them stops the profile: a real engine's step is only roughly a line."""
        out: list[str] = []
        if self.decode.r2 < r2_min:
            out.append(f"the decode points scatter about their line (R2 {self.decode.r2:.2f}): repeat the run "
                       "(or raise --repeats) and take the medians")
        for point in self.decode_points:
            fitted = self.predicted_step_ms(point.batch)
            off = abs(point.step_ms - fitted) / fitted
            if off > off_line_max:
                out.append(f"batch {point.batch}: {point.step_ms:.1f} ms measured, {off:.0%} off the line's "
                           f"{fitted:.1f} ms")
        if self.prefill.intercept < 0:
            out.append(f"the prompt's time grows faster than its length (fixed cost {self.prefill.intercept * 1000:.0f}"
                       " ms): prefill_tokens_per_s is the longer prompts' marginal rate, below a short prompt's")
        return tuple(out)


def median_profile(fits: Sequence[ProfileFit]) -> EngineProfile:
    """Each number's median over several profiling runs of one engine (one run's noise can be larger than the ~20%
    the planner tolerates: docs/planner-evaluation.md, "A profile measured wrong")."""
    if not fits:
        raise ProfileFitError("no profiling run to take the median of")
    budgets = {f.profile.max_num_batched_tokens for f in fits}
    if len(budgets) != 1:
        raise ProfileFitError(f"the runs were fitted for different step budgets: {sorted(budgets)}")
    return EngineProfile(
        weight_read_ms=statistics.median(f.profile.weight_read_ms for f in fits),
        per_sequence_ms=statistics.median(f.profile.per_sequence_ms for f in fits),
        prefill_tokens_per_s=statistics.median(f.profile.prefill_tokens_per_s for f in fits),
        max_num_batched_tokens=budgets.pop(),
    )


def least_squares(xs: Sequence[float], ys: Sequence[float]) -> Line:
    """The least-squares line through (xs, ys); at least two distinct xs."""
    if len(xs) != len(ys) or len(set(xs)) < 2:
        raise ProfileFitError("a line needs points at two or more distinct sizes")
    n = len(xs)
    mean_x, mean_y = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mean_x) ** 2 for x in xs)
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True))
    slope = sxy / sxx
    intercept = mean_y - slope * mean_x
    ss_tot = sum((y - mean_y) ** 2 for y in ys)
    ss_res = sum((y - (intercept + slope * x)) ** 2 for x, y in zip(xs, ys, strict=True))
    r2 = 1.0 if ss_tot == 0 else 1.0 - ss_res / ss_tot
    return Line(intercept, slope, r2)


def fit_profile(decode_points: Sequence[DecodePoint], prefill_points: Sequence[PrefillPoint],
                max_num_batched_tokens: int) -> ProfileFit:
    """The engine profile these points give (module docstring). A negative cost per sequence (noise on an engine
    whose steps hardly grow with the batch) is taken as 0; a step fixed cost at or under 0, or a prompt time that
    does not grow with the prompt, is an error: those points describe no engine."""
    if any(p.batch < 1 or not math.isfinite(p.step_ms) or p.step_ms <= 0 for p in decode_points):
        raise ProfileFitError("decode points need a batch >= 1 and a positive, finite step time")
    if any(p.prompt_tokens < 1 or not math.isfinite(p.seconds) or p.seconds <= 0 for p in prefill_points):
        raise ProfileFitError("prefill points need a prompt of >= 1 token and a positive, finite time")
    decode = least_squares([float(p.batch) for p in decode_points], [p.step_ms for p in decode_points])
    prefill = least_squares([float(p.prompt_tokens) for p in prefill_points], [p.seconds for p in prefill_points])
    if decode.intercept <= 0:
        raise ProfileFitError(f"the decode line's fixed cost is {decode.intercept:.3f} ms: measure smaller batches "
                              "(the step time of one sequence is its weight read)")
    if prefill.slope <= 0:
        raise ProfileFitError("the prompt's time does not grow with its length: measure longer prompts (the "
                              "engine's prefix cache may be answering them; each prompt must be new)")
    profile = EngineProfile(weight_read_ms=decode.intercept, per_sequence_ms=max(0.0, decode.slope),
                            prefill_tokens_per_s=1.0 / prefill.slope, max_num_batched_tokens=max_num_batched_tokens)
    return ProfileFit(profile, decode, prefill, tuple(decode_points), tuple(prefill_points))

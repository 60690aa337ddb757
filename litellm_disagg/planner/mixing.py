"""What aggregated serving would do at the current load: the inter-token latency of ``both`` workers that mix the
model's prompts into their decode steps, estimated from an engine profile. Pure; no I/O.

    aggregated_estimate(profile, workers, prompt_tokens_per_s, output_tokens_per_s) -> MixedEstimate
    sized_split(profile, workers, prompt_tokens_per_s, output_tokens_per_s, ...) -> SplitEstimate | None

The planner's other signals describe the layout that serves now; they cannot say whether a layout of the other
family would hold the SLOs (a split's signals say nothing of what a mixed step costs). This estimate is the piece
that can, so the planner can cross from a split to aggregated serving when that serves the load within the SLOs
(``policy.py``, ``aggregation_pays``). It is the approach of Dynamo's planner, which sizes pools from a
pre-deployment profile of the engine, applied to one question: would every worker as ``both`` hold the ITL?

The model is that of a chunked-prefill scheduler (vLLM v1) on one worker of ``workers``, the load spread evenly:

- a step reads the weights once and computes its prefill tokens at the compute-bound rate, whichever takes longer,
  plus a cost per decoding sequence: ``max(weight_read, chunk / prefill_rate) + batch x per_sequence``;
- decodes go first and take one token each of the step budget (``max_num_batched_tokens``); while prompt tokens
  wait, a step fills the rest of the budget with them (a full chunk); otherwise it decodes only;
- the worker must compute ``prompt_tokens_per_s / workers`` prompt tokens a second: that many full-chunk steps a
  second, the rest of its time decode-only steps;
- every running sequence gains one token per step, so the mean step is the inter-token latency, and the batch is
  the decode rate times it (Little's law): ``batch = output_tokens_per_s / workers x itl``. The two are solved
  together (a fixed point).

It leaves out what costs a mixed step more on a real engine (attention over long contexts, an imperfect overlap of
the weight read with the prefill's compute, KV-cache pressure) and a request's own variation around the mean step,
which is why the policy asks for the ITL under ``headroom`` of its SLO and the prompt share under
``aggregate_busy_max``, not just under 1.0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field


class EngineProfile(BaseModel):
    """One engine's step cost, as a profiling run measures it (``planner.engine_profile`` in ``proxy_config.yaml``):
    decode steps at two or more batch sizes give ``weight_read_ms`` (the intercept) and ``per_sequence_ms`` (the
    slope); a prefill-only step over a long prompt gives ``prefill_tokens_per_s``. ``max_num_batched_tokens`` is the
    step budget the ``both`` workers run with (vLLM's ``--max-num-batched-tokens``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    weight_read_ms: Annotated[float, Field(gt=0)]
    """A decode step's fixed cost (reading the weights): the step time of a lone sequence, less ``per_sequence_ms``."""
    per_sequence_ms: Annotated[float, Field(ge=0)]
    """What each decoding sequence adds to a step (its KV reads)."""
    prefill_tokens_per_s: Annotated[float, Field(gt=0)]
    """Prompt tokens one worker computes per second in compute-bound (prefill-only) steps."""
    max_num_batched_tokens: Annotated[int, Field(ge=1)]
    """The step budget: prompt tokens plus one token per decoding sequence."""
    mixing_correction: Annotated[float, Field(ge=1.0)] = 1.0
    """What the planner multiplies the mixed-step estimate by from its first step: the largest correction
    ``litellm-disagg profile --check-load`` found on this engine (``mixing_check.py``: its ITL percentile beyond the
    estimate's margin under a mixed load). The planner's own check (``calibration.py``) then moves it as it moves
    a correction it learnt itself."""

    def step_ms(self, prefill_tokens: float, decode_sequences: float) -> float:
        """One step's time in milliseconds."""
        compute = max(self.weight_read_ms, 1000.0 * prefill_tokens / self.prefill_tokens_per_s)
        return compute + decode_sequences * self.per_sequence_ms


@dataclass(frozen=True)
class MixedEstimate:
    """Aggregated serving at the given load, per worker."""

    itl_ms: float | None
    """The estimated inter-token latency (the mean step); None when the worker cannot keep up with its prompts."""
    prefill_busy: float
    """Share of the worker's time in full-chunk steps (>= 1: its prompts queue without bound)."""
    batch: float
    """Decoding sequences per worker at that latency."""

    def holds(self, itl_target_ms: float, itl_margin: float, busy_max: float) -> bool:
        """Whether the estimate holds the ITL target with ``itl_margin`` (0..1) to spare (itl <= itl_margin x target:
        the estimate is a mean step, the SLO a percentile of requests) and keeps up with its prompts
        (``prefill_busy <= busy_max``: the queue of prompts grows without bound as it nears 1)."""
        return (self.itl_ms is not None and self.itl_ms <= itl_margin * itl_target_ms
                and self.prefill_busy <= busy_max)

    def dearer(self, factor: float) -> MixedEstimate:
        """The estimate with its mean step ``factor`` times longer (``calibration.py``: the profile checked against
        the ITL the ``both`` workers showed). The prompt share and the batch are left as estimated."""
        if factor == 1.0 or self.itl_ms is None:
            return self
        return MixedEstimate(self.itl_ms * factor, self.prefill_busy, self.batch)


def aggregated_estimate(profile: EngineProfile, workers: int, prompt_tokens_per_s: float,
                        output_tokens_per_s: float, *, iterations: int = 60) -> MixedEstimate:
    """Every one of ``workers`` as ``both``, with the model's load spread evenly over them (module docstring)."""
    n = max(1, workers)
    prompts = max(0.0, prompt_tokens_per_s) / n
    outputs = max(0.0, output_tokens_per_s) / n
    itl = profile.step_ms(0, 1)
    busy = 0.0
    batch = 0.0
    for _ in range(iterations):
        batch = outputs * itl / 1000.0
        chunk = profile.max_num_batched_tokens - batch  # decodes take their tokens of the budget first
        if chunk <= 0:
            return MixedEstimate(None, math.inf, batch)
        chunk_steps = prompts / chunk  # full-chunk steps a second
        busy = chunk_steps * profile.step_ms(chunk, batch) / 1000.0
        if busy >= 1.0:
            return MixedEstimate(None, busy, batch)
        decode_steps = (1.0 - busy) * 1000.0 / profile.step_ms(0, batch)
        new = 1000.0 / (chunk_steps + decode_steps)
        if abs(new - itl) < 1e-6:
            itl = new
            break
        itl = 0.5 * (itl + new)  # damped: the batch grows with the latency it causes
    return MixedEstimate(itl, busy, batch)


@dataclass(frozen=True)
class SplitEstimate:
    """A split of the model's workers into ``prefill`` and ``decode`` workers at the given load."""

    prefill: int
    decode: int
    prefill_busy: float
    """Share of a prefill worker's time computing prompts in full-budget chunks (>= 1: its queue grows without
    bound)."""
    itl_ms: float | None
    """A decode worker's step at the batch its share of the output rate keeps (Little's law); None: it cannot keep
    up (the step grows faster than the batch it serves)."""

    def holds(self, itl_target_ms: float, itl_margin: float, busy_max: float) -> bool:
        return (self.itl_ms is not None and self.itl_ms <= itl_margin * itl_target_ms
                and self.prefill_busy <= busy_max)


def split_estimate(profile: EngineProfile, prefill: int, decode: int, prompt_tokens_per_s: float,
                   output_tokens_per_s: float) -> SplitEstimate:
    """``prefill`` workers computing every prompt in full-budget chunks (no decode in their steps), ``decode`` workers
    decoding every output token (no prompt in theirs): the load spread evenly on each side. A decode step is
    ``weight_read + batch x per_sequence`` with ``batch = outputs / decode x itl``, so ``itl = weight_read / (1 -
    per_sequence x outputs / decode)``. The transfer between them is left out (the policy's ``transfer_costly``
    watches it)."""
    budget = profile.max_num_batched_tokens
    prompts = max(0.0, prompt_tokens_per_s)
    busy = math.inf if prefill < 1 and prompts > 0 else (
        0.0 if prompts == 0 else prompts / prefill / budget * profile.step_ms(budget, 0) / 1000.0)
    if decode < 1:
        return SplitEstimate(prefill, decode, busy, None)
    outputs = max(0.0, output_tokens_per_s) / decode
    room = 1.0 - profile.per_sequence_ms * outputs / 1000.0
    itl = profile.weight_read_ms / room if room > 0 else None
    return SplitEstimate(prefill, decode, busy, itl)


def sized_split(profile: EngineProfile, workers: int, prompt_tokens_per_s: float, output_tokens_per_s: float, *,
                itl_target_ms: float, itl_margin: float, busy_max: float,
                min_decode: int = 2) -> SplitEstimate | None:
    """The split of ``workers`` with the most room on its tighter side: of the splits that keep the prefill workers'
    prompt chunks under ``busy_max`` of their time and the decode workers' ITL under ``itl_margin`` of its target,
    the one whose larger ratio (busy over ``busy_max``, ITL over ``itl_margin`` x target) is smallest; None when no
    split holds. Not the fewest prefill workers that keep up: the estimate is of the window's mean load, and a split
    sized to the mean leaves a burst of prompts nothing to run on. At least ``min_decode`` decode workers: the
    decode side's KV capacity is not in the profile, and the output rate measured under a backlog is what was
    served, below the demand; a split sized on it with one decode worker overflowed that worker's KV in the
    evaluation (7P1D at 20 prompt-heavy requests/s)."""
    best: tuple[float, SplitEstimate] | None = None
    for prefill in range(1, workers - min_decode + 1):
        estimate = split_estimate(profile, prefill, workers - prefill, prompt_tokens_per_s, output_tokens_per_s)
        if not estimate.holds(itl_target_ms, itl_margin, busy_max):
            continue
        assert estimate.itl_ms is not None
        tight = max(estimate.prefill_busy / busy_max, estimate.itl_ms / (itl_margin * itl_target_ms))
        if best is None or tight < best[0]:
            best = (tight, estimate)
    return None if best is None else best[1]

"""An engine profile's mixed-step estimate checked on a live worker, before a planner trusts it.

    await check_mixing(client, target, model, profile, MixedLoad(...)) -> MixingCheck
    litellm-disagg profile --url URL --max-num-batched-tokens N --check-load 0.5,1      (the command)

``mixing.aggregated_estimate`` turns four profiled numbers into the inter-token latency of a ``both`` worker that mixes
prompt chunks into its decode steps; ``aggregation_pays`` crosses a split to ``both`` on it. The profile's lines are
fitted on decode-only and prefill-only requests, so nothing in the profiling run shows whether the mixed step
follows them. This serves a mixed load on the worker and compares: the same comparison the planner makes on a
settled window of every worker ``both`` (``calibration.py``), done by the operator before the planner is given the
profile, on one worker, where the load is known.

The load, open loop: Poisson arrivals (seeded) at ``requests_per_s`` for ``seconds``, each a streamed completion of a
fresh random-words prompt of about ``prompt_tokens`` tokens and ``output_tokens`` output tokens (``ignore_eos``).
Measured per request: its time per output token after the first (what the ITL SLO judges) and the tokens the
engine counted. The load rates given to the estimate are those tokens over the arrival window, as the planner's
rates count them. The worker must be otherwise idle, as for profiling.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import random
from dataclasses import dataclass
from typing import Annotated

import httpx
from pydantic import BaseModel, ConfigDict, Field

from litellm_disagg.planner.calibration import mixing_correction, observed_factor
from litellm_disagg.planner.mixing import EngineProfile, MixedEstimate, aggregated_estimate
from litellm_disagg.planner.profiler import (
    ProfileError,
    ProfileTarget,
    StreamedAnswer,
    Words,
    sized_prompt,
    streamed,
    tokens_per_word,
)
from litellm_disagg.planner.signals import LatencyWindow


class MixedLoad(BaseModel):
    """The load the check serves (module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    requests_per_s: Annotated[float, Field(gt=0)]
    prompt_tokens: Annotated[int, Field(ge=1)] = 512
    output_tokens: Annotated[int, Field(ge=2)] = 64
    seconds: Annotated[float, Field(gt=0)] = 30.0
    seed: int = 0
    """The arrival times' seed (the prompts' words are fresh every run: no prefix-cache hit)."""


@dataclass(frozen=True)
class MixingCheck:
    """What the worker showed at one load, beside what the profile predicts for it."""

    load: MixedLoad
    requests: int
    """Requests that streamed two or more tokens (the ones with an ITL)."""
    prompt_tokens_per_s: float
    output_tokens_per_s: float
    itl_p50_ms: float | None
    itl_p_ms: float | None
    """The ITL percentile at ``quantile`` over the requests (the planner's ``planner.quantile``)."""
    quantile: float
    estimate: MixedEstimate
    margin: float
    """The share of the ITL SLO the planner holds the estimate under (``planner.headroom``)."""

    @property
    def factor(self) -> float | None:
        """How much dearer the worker's mixed steps were than the estimate, beyond ``margin`` (``calibration.py``);
        1.0 or less: within it. None: no ITL, or no finite estimate (the worker would not keep up, by the profile)."""
        if self.itl_p_ms is None or self.estimate.itl_ms is None:
            return None
        return observed_factor(self.itl_p_ms, self.estimate.itl_ms, self.margin)

    def against(self, profile: EngineProfile) -> MixingCheck:
        """The same measurement judged against another profile (another run's, or one scaled to see how wrong a
        profile the check catches)."""
        estimate = aggregated_estimate(profile, 1, self.prompt_tokens_per_s, self.output_tokens_per_s)
        return dataclasses.replace(self, estimate=estimate)

    @property
    def correction(self) -> float:
        """The correction the planner's check would learn from this window, starting from none."""
        return mixing_correction(1.0, self.itl_p_ms, self.estimate.itl_ms, self.margin)

    def as_json(self) -> dict[str, object]:
        """The ``--json`` output's ``mixing_checks`` entry (an estimate that would not keep up: nulls, not inf)."""
        busy = self.estimate.prefill_busy
        return {"load": self.load.model_dump(), "requests": self.requests,
                "prompt_tokens_per_s": self.prompt_tokens_per_s, "output_tokens_per_s": self.output_tokens_per_s,
                "itl_p50_ms": self.itl_p50_ms, "itl_p_ms": self.itl_p_ms, "quantile": self.quantile,
                "estimated_itl_ms": self.estimate.itl_ms,
                "estimated_prefill_busy": busy if math.isfinite(busy) else None,
                "margin": self.margin, "factor": self.factor, "correction": self.correction}


def summarize(load: MixedLoad, answers: list[StreamedAnswer], profile: EngineProfile, *, quantile: float = 0.9,
              margin: float = 0.7) -> MixingCheck:
    """The check's figures from the answers of one load (pure)."""
    prompt = sum(a.prompt_tokens or 0 for a in answers)
    output = sum(a.completion_tokens or 0 for a in answers)
    tpots = [a.tpot_ms for a in answers if a.tpot_ms is not None]
    p50 = LatencyWindow.of(tpots, 0.5).p_ms if tpots else None
    p = LatencyWindow.of(tpots, quantile).p_ms if tpots else None
    prompt_rate, output_rate = prompt / load.seconds, output / load.seconds
    estimate = aggregated_estimate(profile, 1, prompt_rate, output_rate)
    return MixingCheck(load, len(tpots), prompt_rate, output_rate, p50, p, quantile, estimate, margin)


def arrival_times(load: MixedLoad) -> list[float]:
    """Seconds from the start: a seeded Poisson process at ``requests_per_s`` over ``seconds``."""
    rng = random.Random(load.seed)
    times: list[float] = []
    t = rng.expovariate(load.requests_per_s)
    while t < load.seconds:
        times.append(t)
        t += rng.expovariate(load.requests_per_s)
    return times


async def check_mixing(client: httpx.AsyncClient, target: ProfileTarget, model: str, profile: EngineProfile,
                       load: MixedLoad, *, quantile: float = 0.9, margin: float = 0.7) -> MixingCheck:
    """Serve ``load`` on the worker and compare its ITL with the profile's estimate (the module docstring)."""
    words = Words(None)
    per_word = await tokens_per_word(client, target, model, words)
    times = arrival_times(load)
    if not times:
        raise ProfileError(f"no arrival in {load.seconds} s at {load.requests_per_s} requests/s")
    # every prompt sized before the clock starts (the sizing asks the worker's /tokenize)
    prompts = [await sized_prompt(client, target, model, words, load.prompt_tokens, per_word) for _ in times]
    loop = asyncio.get_running_loop()
    start = loop.time()

    async def one(at: float, prompt: str) -> StreamedAnswer:
        await asyncio.sleep(max(0.0, start + at - loop.time()))
        body = {"model": model, "prompt": prompt, "max_tokens": load.output_tokens, "ignore_eos": True,
                "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
        return await streamed(client, target, body)

    answers = list(await asyncio.gather(*(one(t, p) for t, p in zip(times, prompts, strict=True))))
    return summarize(load, answers, profile, quantile=quantile, margin=margin)


FEW_REQUESTS = 200
"""Under this many requests a load's ITL percentile swings with the arrival sample: on the simulated engine, 60 s
of one worker's Poisson arrivals (48-129 requests) gave corrections of 1.0-1.67 over four seeds for the exact
profile, 240 s 1.04-1.13 (docs/planner-evaluation.md)."""


def render_checks(checks: list[MixingCheck]) -> str:
    """One line per load: what was served, the ITL seen and estimated, the factor and the correction; a warning
    under a load with few requests."""
    out = [f"mixing check (ITL p{round(checks[0].quantile * 100)} against the estimate held under "
           f"{checks[0].margin} of the SLO):" if checks else "mixing check: no load"]
    for c in checks:
        est = "none (would not keep up)" if c.estimate.itl_ms is None else f"{c.estimate.itl_ms:.1f} ms"
        seen = "none" if c.itl_p_ms is None else f"{c.itl_p_ms:.1f} ms (p50 {c.itl_p50_ms:.1f})"
        factor = "n/a" if c.factor is None else f"{c.factor:.2f}"
        out.append(f"  {c.load.requests_per_s:g} req/s x {c.load.prompt_tokens}+{c.load.output_tokens} tokens: "
                   f"{c.prompt_tokens_per_s:,.0f} prompt + {c.output_tokens_per_s:,.0f} output tokens/s, "
                   f"{c.requests} requests; ITL {seen}, estimate {est} (busy {c.estimate.prefill_busy:.2f}); "
                   f"factor {factor}, correction {c.correction:.2f}")
        if c.requests < FEW_REQUESTS:
            out.append(f"  warning: {c.requests} requests at {c.load.requests_per_s:g} req/s: the percentile swings "
                       f"with the arrival sample; give each load {FEW_REQUESTS} or more (a longer --check-seconds)")
    return "\n".join(out) + "\n"

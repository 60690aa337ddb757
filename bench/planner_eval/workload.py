"""Seeded workloads in simulated time: request sizes per phase and Poisson (or bursty) arrivals. Pure.

    prompt-heavy       long inputs, short outputs (summaries, RAG answers): prefill-bound
    generation-heavy   short inputs, long outputs (writing, reasoning): decode-bound
    bursts             the mixed shape with on/off arrivals: ``burst_factor`` x the mean rate for ``burst_s`` every
                       ``burst_period_s``, the rest of the time a lower rate, so the mean stays ``rate``

Sizes are drawn uniformly in each phase's ranges. The same seed gives the same schedule.

Two optional knobs of a ``Segment``, both off in the headline evaluation: ``shape`` replaces the phase's sizes (the
prompt-length sweep, ``sweep.py``), ``ramp_s`` ramps the rate linearly from 0 to ``rate`` over the segment's first
``ramp_s`` seconds (the ramped-start measurement, ``startup.py``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

PhaseName = Literal["prompt-heavy", "generation-heavy", "bursts"]
PHASES: tuple[PhaseName, ...] = ("prompt-heavy", "generation-heavy", "bursts")


@dataclass(frozen=True)
class PhaseShape:
    name: PhaseName
    prompt_tokens: tuple[int, int]
    """Uniform range, inclusive."""
    output_tokens: tuple[int, int]
    burst_factor: float = 1.0
    """1: plain Poisson arrivals. Above 1: bursts at this multiple of the mean rate."""
    burst_s: float = 0.0
    burst_period_s: float = 0.0


SHAPES: dict[PhaseName, PhaseShape] = {
    "prompt-heavy": PhaseShape("prompt-heavy", prompt_tokens=(3072, 6144), output_tokens=(32, 128)),
    "generation-heavy": PhaseShape("generation-heavy", prompt_tokens=(128, 512), output_tokens=(256, 768)),
    "bursts": PhaseShape(
        "bursts", prompt_tokens=(512, 4096), output_tokens=(64, 384), burst_factor=3.0, burst_s=4.0,
        burst_period_s=20.0,
    ),
}


@dataclass(frozen=True)
class Arrival:
    rid: int
    t: float
    """Arrival time, simulated seconds."""
    prompt_tokens: int
    output_tokens: int
    phase: PhaseName


@dataclass(frozen=True)
class Segment:
    """One stretch of a schedule: a phase at a mean rate (requests/s) for ``duration_s``."""

    phase: PhaseName
    rate: float
    duration_s: float
    shape: PhaseShape | None = None
    """Sizes (and burst pattern) to draw instead of ``SHAPES[phase]``; the requests keep ``phase`` as their label."""
    ramp_s: float = 0.0
    """The rate grows linearly from 0 to ``rate`` over the segment's first ``ramp_s`` seconds (0: full from the
    start)."""


def _rate_at(shape: PhaseShape, rate: float, t: float) -> float:
    if shape.burst_factor <= 1.0 or shape.burst_period_s <= 0:
        return rate
    quiet_share = 1.0 - shape.burst_s / shape.burst_period_s
    quiet = rate * (1.0 - shape.burst_factor * shape.burst_s / shape.burst_period_s) / quiet_share
    return rate * shape.burst_factor if (t % shape.burst_period_s) < shape.burst_s else max(quiet, 0.0)


def schedule(segments: Sequence[Segment], seed: int = 0) -> list[Arrival]:
    """Arrivals for the segments back to back, by thinning a Poisson process at each segment's peak rate."""
    rng = random.Random(seed)
    out: list[Arrival] = []
    start = 0.0
    for seg in segments:
        shape = seg.shape or SHAPES[seg.phase]
        peak = seg.rate * max(1.0, shape.burst_factor)
        t = 0.0
        while peak > 0:
            t += rng.expovariate(peak)
            if t >= seg.duration_s:
                break
            rate_now = _rate_at(shape, seg.rate, t)
            if seg.ramp_s > 0 and t < seg.ramp_s:
                rate_now *= t / seg.ramp_s
            if rng.random() * peak > rate_now:
                continue
            out.append(
                Arrival(
                    rid=len(out),
                    t=start + t,
                    prompt_tokens=rng.randint(*shape.prompt_tokens),
                    output_tokens=rng.randint(*shape.output_tokens),
                    phase=seg.phase,
                )
            )
        start += seg.duration_s
    return out

"""What the planner sees: typed, I/O-free signals per worker and per model, one ``ClusterSignals`` per step.

Whoever collects them (the proxy's loop from accounting, the load scraper and request records; the standalone loop
from the workers' ``/metrics`` and discovery; a simulator from its own state) builds these objects; the policy
(``policy.py``) only reads them. Nothing here knows where a number came from.

    ClusterSignals
      └─ ModelSignals (one per served model)        latency windows (TTFT, ITL, transfer), prefill rate
           └─ WorkerSignals (one per worker)        role, state, flip in progress, queue, batch, KV usage

A missing measurement is ``None`` (no sample in the window, metric not exposed), never a made-up zero: the policy
treats an unknown latency as "no evidence" and an unknown capacity as "not the bottleneck".
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from litellm_disagg.runtime_config import WorkerRole, WorkerState


def _finite_or_none(value: float | None) -> float | None:
    if value is None or not math.isfinite(value) or value < 0:
        return None
    return float(value)


@dataclass(frozen=True)
class LatencyWindow:
    """A latency percentile over the collection window (e.g. the last 30 s), in milliseconds.

    ``p_ms`` is None when the window holds no sample. ``samples`` lets the policy ignore a percentile of too few
    requests (``PlannerSettings.min_samples``)."""

    p_ms: float | None = None
    samples: int = 0
    span_s: float | None = None
    """The seconds the window covers (``window.HistogramWindow``: more than ``window_s`` where it reached back for
    ``min_samples`` requests); None: not known (a window built from values)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "p_ms", _finite_or_none(self.p_ms))
        object.__setattr__(self, "samples", max(0, int(self.samples)))

    @classmethod
    def of(cls, values_ms: Iterable[float], quantile: float) -> LatencyWindow:
        """The ``quantile`` (0..1, nearest rank) of ``values_ms``; empty input gives an empty window."""
        ordered = sorted(v for v in values_ms if math.isfinite(v) and v >= 0)
        if not ordered:
            return cls()
        rank = min(len(ordered) - 1, max(0, math.ceil(quantile * len(ordered)) - 1))
        return cls(ordered[rank], len(ordered))

    def ratio(self, target_ms: float, min_samples: int) -> float | None:
        """The percentile over its target (1.0: exactly at the SLO); None without enough samples."""
        if self.p_ms is None or self.samples < max(1, min_samples):
            return None
        return self.p_ms / target_ms


@dataclass(frozen=True)
class WorkerSignals:
    """One worker as the planner sees it at one step."""

    worker_id: str
    model: str
    """Served model name (pools are per model)."""
    role: WorkerRole
    """The role it serves now (its published role)."""
    state: WorkerState = WorkerState.READY
    pending_role: WorkerRole | None = None
    """A role change asked for and not yet in effect (the flip is in progress); None when none is."""
    running_requests: int = 0
    """Requests in its running batch (decoding, or prefilling in a mixed batch)."""
    waiting_requests: int = 0
    """Requests queued for prefill on it (engine's waiting queue, or the router's own count)."""
    queued_prefill_tokens: int = 0
    """Prompt tokens waiting to be computed on it (router's accounting)."""
    max_running_requests: int | None = None
    """Its batch capacity (``max_num_seqs``); None when unknown (occupancy is then unknown)."""
    kv_usage: float | None = None
    """Fraction of its KV cache in use, 0..1; None when not scraped."""
    servable_roles: frozenset[WorkerRole] | None = None
    """Roles its launch can serve without a restart (its published ``role`` plus ``allowed_roles``); None: any (a
    simulated worker). The planner never asks a worker for a role outside this set."""

    def __post_init__(self) -> None:
        if self.servable_roles is not None:
            object.__setattr__(self, "servable_roles", frozenset(self.servable_roles) | {self.role})
        kv = _finite_or_none(self.kv_usage)
        object.__setattr__(self, "kv_usage", None if kv is None else min(1.0, kv))
        for name in ("running_requests", "waiting_requests", "queued_prefill_tokens"):
            object.__setattr__(self, name, max(0, int(getattr(self, name))))
        if self.max_running_requests is not None and self.max_running_requests <= 0:
            object.__setattr__(self, "max_running_requests", None)

    @property
    def flipping(self) -> bool:
        return self.pending_role is not None and self.pending_role is not self.role

    def can_serve(self, role: WorkerRole) -> bool:
        return self.servable_roles is None or role in self.servable_roles

    @property
    def active(self) -> bool:
        """Serving, and counted in a pool: ready (a draining or starting worker is in no pool)."""
        return self.state is WorkerState.READY

    @property
    def effective_role(self) -> WorkerRole:
        """The role it counts for: the pending one while a flip is in progress."""
        return self.pending_role if self.pending_role is not None else self.role

    @property
    def batch_occupancy(self) -> float | None:
        """Running requests over batch capacity (0..1+); None when the capacity is unknown."""
        if self.max_running_requests is None:
            return None
        return self.running_requests / self.max_running_requests


@dataclass(frozen=True)
class PoolSignals:
    """The active workers of one model that can serve one side (prefill: prefill + both; decode: decode + both)."""

    workers: tuple[WorkerSignals, ...]

    @property
    def size(self) -> int:
        return len(self.workers)

    @property
    def waiting_requests(self) -> int:
        return sum(w.waiting_requests for w in self.workers)

    @property
    def queued_prefill_tokens(self) -> int:
        return sum(w.queued_prefill_tokens for w in self.workers)

    @property
    def running_requests(self) -> int:
        return sum(w.running_requests for w in self.workers)

    @property
    def batch_occupancy(self) -> float | None:
        """Running over capacity across the workers whose capacity is known; None when none is."""
        known = [w for w in self.workers if w.max_running_requests is not None]
        if not known:
            return None
        return sum(w.running_requests for w in known) / sum(w.max_running_requests or 0 for w in known)

    @property
    def kv_usage(self) -> float | None:
        """Mean KV usage over the workers that report it; None when none does."""
        known = [w.kv_usage for w in self.workers if w.kv_usage is not None]
        return sum(known) / len(known) if known else None


@dataclass(frozen=True)
class ModelSignals:
    """One served model's workers and its request latencies over the window."""

    model: str
    workers: tuple[WorkerSignals, ...] = ()
    ttft: LatencyWindow = field(default_factory=LatencyWindow)
    """Time to first token of the requests finished in the window (all modes)."""
    itl: LatencyWindow = field(default_factory=LatencyWindow)
    """Inter-token latency of the requests in the window."""
    transfer: LatencyWindow = field(default_factory=LatencyWindow)
    """Measured KV transfer time per disaggregated request (prefill answer to decode start)."""
    prefill_tokens_per_s: float | None = None
    """Measured prefill throughput of one worker (tokens/s), used to turn queued tokens into a wait; None: unknown."""
    prefill_time: LatencyWindow = field(default_factory=LatencyWindow)
    """Prefill time of the requests whose prefill finished in the window: arrival to the prefill's answer for a
    disaggregated request, arrival to first token for a local one. Unlike TTFT it holds no decode-side wait (a pull
    queued for KV blocks); empty when the collector does not measure it (the policy then falls back to TTFT)."""
    prompt_tokens_per_s: float | None = None
    """The model's prefill demand: prompt tokens of the requests that arrived over the window, per second (tokens
    served from a prefix cache included: the estimate in ``mixing.py`` is conservative). None: not measured."""
    output_tokens_per_s: float | None = None
    """The model's decode demand: tokens generated per second over the window, all workers. None: not measured.
    With ``prompt_tokens_per_s`` and an engine profile the planner estimates what aggregated serving would do at
    this load (``planner/mixing.py``)."""
    recent_prompt_tokens_per_s: float | None = None
    """Prompt tokens per second over the latency windows' reach (``window_max_s``), not cut at the last layout
    change as those windows are: a prompt in that span leaves a prefill side with no first token measured since
    *unmeasured*, not idle (``pressures``). None: no reach beyond ``window_s``, or not measured."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "workers", tuple(self.workers))
        rate = _finite_or_none(self.prefill_tokens_per_s)
        object.__setattr__(self, "prefill_tokens_per_s", rate if rate else None)
        object.__setattr__(self, "prompt_tokens_per_s", _finite_or_none(self.prompt_tokens_per_s))
        object.__setattr__(self, "output_tokens_per_s", _finite_or_none(self.output_tokens_per_s))
        object.__setattr__(self, "recent_prompt_tokens_per_s", _finite_or_none(self.recent_prompt_tokens_per_s))

    @property
    def active(self) -> tuple[WorkerSignals, ...]:
        return tuple(w for w in self.workers if w.active)

    def with_role(self, role: WorkerRole) -> tuple[WorkerSignals, ...]:
        """Active workers whose effective role (pending, while flipping) is exactly ``role``."""
        return tuple(w for w in self.active if w.effective_role is role)

    @property
    def prefill_pool(self) -> PoolSignals:
        return PoolSignals(tuple(w for w in self.active if w.effective_role.can_prefill))

    @property
    def decode_pool(self) -> PoolSignals:
        return PoolSignals(tuple(w for w in self.active if w.effective_role.can_decode))

    @property
    def flipping(self) -> tuple[WorkerSignals, ...]:
        return tuple(w for w in self.workers if w.flipping)


@dataclass(frozen=True)
class ClusterSignals:
    """Everything the planner sees at one step."""

    models: tuple[ModelSignals, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "models", tuple(sorted(self.models, key=lambda m: m.model)))

    @classmethod
    def of(cls, models: Sequence[ModelSignals]) -> ClusterSignals:
        return cls(tuple(models))

    def model(self, name: str) -> ModelSignals | None:
        return next((m for m in self.models if m.model == name), None)

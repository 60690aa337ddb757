"""The ``planner:`` section of the plugin's settings (``litellm_disagg.planner`` in ``proxy_config.yaml``).

Targets are SLOs (``ttft_ms``, ``itl_ms``), never token thresholds; the other knobs are how fast and how carefully
the planner acts. ``docs/planner.md`` explains each one in the order the policy uses them.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from litellm_disagg.planner.mixing import EngineProfile


class PlannerLockSettings(BaseModel):
    """Only one planner acts when several proxies run: a lock through the registry (``planner/lock.py``). A planner
    without the lock tries to take it at each step (``interval_s``)."""

    model_config = ConfigDict(extra="forbid")

    ttl_s: Annotated[float, Field(ge=10, le=86400)] = 15.0
    """Consul: the session's TTL (Consul's minimum is 10 s); a holder that stops renewing loses the lock after it
    (Consul may wait up to twice the TTL). File backend: unused (the kernel drops a dead holder's ``fcntl`` lock)."""


class PlannerSettings(BaseModel):
    """The dynamic planner: moves workers between the prefill, decode and aggregated (``both``) pools."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    """Run the planner in the proxy process. Off by default: it changes workers' roles."""
    ttft_ms: Annotated[float, Field(gt=0)] = 2000.0
    """Time-to-first-token SLO (the percentile ``quantile`` of the window should stay under it)."""
    itl_ms: Annotated[float, Field(gt=0)] = 100.0
    """Inter-token-latency SLO."""
    quantile: Annotated[float, Field(gt=0, le=1)] = 0.9
    """Which percentile of the window is held against the SLOs."""
    window_s: Annotated[float, Field(gt=0)] = 10.0
    """Latencies are taken over the requests of the last ``window_s`` seconds."""
    min_samples: Annotated[int, Field(ge=1)] = 5
    """A latency percentile over fewer requests than this is no evidence (treated as unknown)."""
    window_max_s: Annotated[float, Field(gt=0)] | None = None
    """A latency window (TTFT, ITL, prefill time) holding fewer than ``min_samples`` requests over the last
    ``window_s`` reaches back for them up to this many seconds, never before the model's serving layout last changed
    (a worker joined, left or changed role). At a few requests a second, or with first tokens slower than
    ``window_s``, the window then still measures the prefill side. None (or at most ``window_s``): no reach. The
    load rates (prompt and output tokens per second) stay over ``window_s``."""
    interval_s: Annotated[float, Field(gt=0)] = 2.0
    """Seconds between two planner steps."""
    hysteresis_steps: Annotated[int, Field(ge=1)] = 2
    """A condition must hold this many consecutive steps before the planner acts on it."""
    cooldown_s: Annotated[float, Field(ge=0)] = 20.0
    """A worker the planner moved is not moved again for this long."""
    min_prefill_workers: Annotated[int, Field(ge=0)] = 1
    """Workers that can prefill (``prefill`` or ``both``) the planner always leaves per model."""
    min_decode_workers: Annotated[int, Field(ge=1)] = 1
    """Workers that can decode (``decode`` or ``both``) the planner always leaves per model."""
    headroom: Annotated[float, Field(gt=0, lt=1)] = 0.7
    """A side "has headroom" when its pressure (1.0 = at its SLO) is below this: it can give a worker away."""
    aggregate_below: Annotated[float, Field(ge=0, lt=1)] = 0.3
    """Both pressures below this: load is low, disaggregation does not pay, workers go to ``both``."""
    allow_aggregated: bool = True
    """Whether the planner may move workers to ``both`` (aggregated); off: it only moves between prefill and decode."""
    transfer_share_max: Annotated[float, Field(gt=0, le=1)] = 0.5
    """Measured transfer time above this share of the TTFT SLO counts as "disaggregation does not pay"."""
    occupancy_high: Annotated[float, Field(gt=0, le=1)] = 0.9
    """Decode batch occupancy (running / max) at which the decode side counts as full (pressure 1.0)."""
    kv_usage_high: Annotated[float, Field(gt=0, le=1)] = 0.9
    """Decode KV-cache usage at which the decode side counts as full (pressure 1.0)."""
    max_batch: Annotated[int, Field(ge=1)] | None = None
    """A worker's batch capacity (vLLM's ``--max-num-seqs``), for decode batch occupancy; None: occupancy unknown
    (the engines do not publish it), the KV usage and ITL terms still count."""
    scale_down_below: Annotated[float, Field(ge=0, lt=1)] = 0.2
    """Both pressures below this (for ``hysteresis_steps``): the desired pool sizes shrink by one worker."""
    flip_timeout_s: Annotated[float, Field(gt=0)] = 180.0
    """A role request the worker has not followed (published) within this long is given up (logged); the worker's
    old role's in-flight work must finish first, so keep it above the longest request."""
    max_moves_per_step: Annotated[int, Field(ge=1)] = 3
    """Most role changes per model per step. A step moves as many workers as the prefill pool is short by its measured
    demand (the queue's growth, ``planner/trend.py``), else ``ceil(pool x (pressure - 1) / 4)`` of the pressed side,
    capped here (all up to this for the ``both`` moves when prefill is nearly idle)."""
    engine_profile: EngineProfile | None = None
    """The engine's step cost from a profiling run (``planner/mixing.py``). With it, and the model's prompt and output
    token rates, the planner estimates what aggregated serving would do at the current load and moves a split whose
    side misses its SLO to ``both`` when that estimate holds the ITL under ``headroom`` of its SLO
    (``aggregation_pays``). None: the planner never crosses from a split to aggregated on load (only at low load)."""
    aggregate_busy_max: Annotated[float, Field(gt=0, lt=1)] = 0.9
    """With ``engine_profile``: the largest share of a ``both`` worker's time the estimate may spend on prompt chunks
    for aggregated serving to count as keeping up (its prompts queue without bound as the share nears 1)."""
    steady_swing_max: Annotated[float, Field(ge=1)] = 1.5
    """With ``engine_profile``: a window may raise the mixing correction (``calibration.py``) only when the load was
    steady over it: the windowed prompt rate's readings over the last ``window_s``, largest over smallest, at most
    this (``steadiness.py``); any window may lower it. In the evaluation, Poisson arrivals at a loaded rate gave
    1.02-1.53 (medians 1.08-1.17) and its bursts (3x the mean rate for 4 s of every 20) 1.54 and over."""
    hook_command: list[str] | None = None
    """Run when the desired pool sizes change: argv (no shell), with ``MODEL PREFILL DECODE BOTH`` appended and the
    same in ``LITELLM_DISAGG_DESIRED_*`` environment variables. For an external autoscaler."""
    hook_timeout_s: Annotated[float, Field(gt=0)] = 30.0
    lock: PlannerLockSettings = Field(default_factory=PlannerLockSettings)

    @model_validator(mode="after")
    def _bands(self) -> PlannerSettings:
        if self.aggregate_below >= self.headroom:
            raise ValueError("planner.aggregate_below must be below planner.headroom")
        if self.scale_down_below > self.headroom:
            raise ValueError("planner.scale_down_below must not exceed planner.headroom")
        if self.hook_command is not None and not self.hook_command:
            raise ValueError("planner.hook_command must name a program (a non-empty argv list) or be left out")
        return self

"""The arms' role policies.

- ``Static(prefill, decode, both)``: a fixed split, never moves (all aggregated is ``Static(0, 0, 8)``).
- ``StandIn``: this harness's own simple policy, used only until ``litellm_disagg.planner`` exists (kept as a
  baseline): every interval, the pool whose latency is further over its target (TTFT for prefill, ITL for decode)
  takes one worker from the other, with a cooldown.
- ``PlannerPolicy``: the product's planner (``litellm_disagg.planner.policy.Planner``), fed the same signals.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bench.planner_eval.cluster import Move
from litellm_disagg.planner.policy import Planner, PlannerStep
from litellm_disagg.planner.settings import PlannerSettings
from litellm_disagg.planner.signals import ClusterSignals
from litellm_disagg.runtime_config import WorkerRole


@dataclass
class Static:
    prefill: int
    decode: int
    both: int = 0
    interval_s: float = 0.0

    @property
    def name(self) -> str:
        if self.both and not (self.prefill or self.decode):
            return f"aggregated ({self.both} both)"
        parts = [f"{self.prefill}P{self.decode}D"] + ([f"+{self.both}B"] if self.both else [])
        return "".join(parts)

    def initial_roles(self, n: int) -> list[WorkerRole]:
        roles = [WorkerRole.PREFILL] * self.prefill + [WorkerRole.DECODE] * self.decode + [WorkerRole.BOTH] * self.both
        if len(roles) != n:
            raise ValueError(f"split {self.name} has {len(roles)} workers, the cluster {n}")
        return roles

    def decide(self, signals: ClusterSignals, now: float) -> Sequence[Move]:
        return ()


@dataclass
class StandIn:
    """Latency-ratio balancing between the prefill and decode pools (no ``both``)."""

    ttft_target_ms: float
    itl_target_ms: float
    start_prefill: int = 4
    interval_s: float = 2.0
    cooldown_s: float = 6.0
    min_pool: int = 1
    name: str = "stand-in policy"
    _last: float = -1e9

    def initial_roles(self, n: int) -> list[WorkerRole]:
        return [WorkerRole.PREFILL] * self.start_prefill + [WorkerRole.DECODE] * (n - self.start_prefill)

    def decide(self, signals: ClusterSignals, now: float) -> Sequence[Move]:
        model = signals.models[0]
        if model.flipping or now - self._last < self.cooldown_s:
            return ()
        prefill = model.with_role(WorkerRole.PREFILL)
        decode = model.with_role(WorkerRole.DECODE)
        rate = model.prefill_tokens_per_s or 1.0
        backlog_ms = sum(w.queued_prefill_tokens for w in prefill) / max(1, len(prefill)) / rate * 1e3
        p = max(model.ttft.ratio(self.ttft_target_ms, 5) or 0.0, backlog_ms / self.ttft_target_ms)
        d = model.itl.ratio(self.itl_target_ms, 5) or 0.0
        kv = max((w.kv_usage or 0.0 for w in decode), default=0.0)
        if kv > 0.9:
            d = max(d, 1.0 + kv)
        if p > 1.0 and p > d and len(decode) > self.min_pool:
            victim = min(decode, key=lambda w: w.running_requests)
            self._last = now
            return (Move(victim.worker_id, WorkerRole.PREFILL),)
        if d > 1.0 and d > p and len(prefill) > self.min_pool:
            victim = min(prefill, key=lambda w: w.queued_prefill_tokens)
            self._last = now
            return (Move(victim.worker_id, WorkerRole.DECODE),)
        if max(p, d) < 0.5:  # both comfortable: move toward the pool with more pressure, slowly
            return ()
        return ()


class PlannerPolicy:
    """The product's planner: ``Planner(settings).step(signals, now)``, its moves applied as flips.

    Starts from ``start`` (default the static 1:1 split an operator would launch). ``steps`` keeps every
    ``PlannerStep`` (its decisions and the pressures behind them) for the report."""

    def __init__(self, settings: PlannerSettings, start: tuple[int, int, int] = (4, 4, 0), name: str = "planner"):
        self.settings = settings
        self.planner = Planner(settings)
        self.start = start
        self.name = name
        self.interval_s = settings.interval_s
        self.steps: list[PlannerStep] = []

    def initial_roles(self, n: int) -> list[WorkerRole]:
        return Static(*self.start).initial_roles(n)

    def decide(self, signals: ClusterSignals, now: float) -> Sequence[Move]:
        step = self.planner.step(signals, now)
        self.steps.append(step)
        return tuple(Move(m.worker_id, m.to_role) for m in step.moves)

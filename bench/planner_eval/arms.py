"""The arms compared, as factories (each run gets a fresh policy: the planner keeps state).

- ``aggregated``: 8 ``both`` workers (plain continuous batching, no disaggregation);
- ``static 1:1``: 4 prefill + 4 decode;
- ``static kP(8-k)D`` for k = 1..7 (the best one per phase is picked after the sweep);
- ``planner``: ``litellm_disagg.planner`` with its default knobs, only the SLOs set (TTFT, ITL);
- ``planner (fast)``: the same with quicker knobs (2 s interval, 2-step hysteresis, 10 s cooldown and window).
- ``planner (fast, prefill TTFT)``: ``planner (fast)`` fed, for disaggregated requests, the prefill's part of the
  TTFT instead of the whole (``ClusterConfig.prefill_side_ttft``): an experiment on the signal, the policy unchanged.

The planner arms start from the 1:1 split (``ClusterConfig.planner_start`` changes it); with
``ClusterConfig.planner_profile`` they get that engine profile (``planner.engine_profile``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from bench.planner_eval.cluster import ClusterConfig, RolePolicy
from bench.planner_eval.policies import PlannerPolicy, Static
from bench.planner_eval.slo import Slo
from litellm_disagg.planner.mixing import EngineProfile
from litellm_disagg.planner.settings import PlannerSettings


@dataclass(frozen=True)
class Arm:
    name: str
    make: Callable[[], RolePolicy]
    config: ClusterConfig


def planner_settings(slo: Slo, fast: bool, profile: EngineProfile | None = None) -> PlannerSettings:
    base: dict[str, object] = {"ttft_ms": slo.ttft_s * 1e3, "itl_ms": slo.itl_s * 1e3, "quantile": slo.attainment,
                               "engine_profile": profile}
    if fast:
        base |= {"interval_s": 2.0, "hysteresis_steps": 2, "cooldown_s": 10.0, "window_s": 10.0}
    return PlannerSettings(**base)


def _planner(slo: Slo, fast: bool, workers: int, config: ClusterConfig, prefill_ttft: bool = False) -> Arm:
    settings = planner_settings(slo, fast, config.planner_profile)
    half = workers // 2
    start = config.planner_start or (half, workers - half, 0)
    name = ("planner (fast)" if fast else "planner") if not prefill_ttft else "planner (fast, prefill TTFT)"
    return Arm(
        name,
        lambda: PlannerPolicy(settings, start=start, name=name),
        ClusterConfig(
            **{**config.__dict__, "signal_window_s": settings.window_s, "prefill_side_ttft": prefill_ttft}
        ),
    )


def all_arms(slo: Slo, config: ClusterConfig) -> list[Arm]:
    n = config.workers
    arms = [Arm("aggregated", lambda: Static(0, 0, n), config)]
    arms += [Arm(f"{k}P{n - k}D", (lambda k=k: Static(k, n - k)), config) for k in range(1, n)]
    arms += [_planner(slo, False, n, config), _planner(slo, True, n, config), _planner(slo, True, n, config, True)]
    return arms


def static_split_names(workers: int) -> list[str]:
    return [f"{k}P{workers - k}D" for k in range(1, workers)]


def one_to_one(workers: int) -> str:
    return f"{workers // 2}P{workers - workers // 2}D"

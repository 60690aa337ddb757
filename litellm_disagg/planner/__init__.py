"""The dynamic planner (issue 9): moves workers between the prefill, decode and aggregated pools, publishes the pool
sizes it wants. Reading order: ``signals.py`` (what it sees), ``policy.py`` (how it decides, no I/O),
``settings.py`` (its knobs), ``mixing.py`` (what aggregated serving would do, from an engine profile); the loop and its I/O live beside them. See docs/planner.md.
"""

from litellm_disagg.planner.mixing import EngineProfile, MixedEstimate, aggregated_estimate
from litellm_disagg.planner.policy import (
    Condition,
    DecodeDriver,
    DesiredPools,
    ModelDecision,
    Planner,
    PlannerStep,
    Pressures,
    RoleMove,
)
from litellm_disagg.planner.settings import PlannerLockSettings, PlannerSettings
from litellm_disagg.planner.signals import ClusterSignals, LatencyWindow, ModelSignals, PoolSignals, WorkerSignals

__all__ = [
    "ClusterSignals",
    "Condition",
    "DecodeDriver",
    "DesiredPools",
    "EngineProfile",
    "LatencyWindow",
    "ModelDecision",
    "MixedEstimate",
    "ModelSignals",
    "Planner",
    "PlannerLockSettings",
    "PlannerSettings",
    "PlannerStep",
    "PoolSignals",
    "Pressures",
    "RoleMove",
    "WorkerSignals",
    "aggregated_estimate",
]

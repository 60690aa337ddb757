"""The ramped start on the simulated cluster (docs/planner-evaluation.md, "The way back from both"): the planner's
light-load move to ``both`` is split back when the long prompts arrive. One 60 s probe in simulated time; well under
a second."""

from __future__ import annotations

from bench.planner_eval.arms import all_arms
from bench.planner_eval.cluster import Cluster, ClusterConfig
from bench.planner_eval.policies import PlannerPolicy
from bench.planner_eval.slo import Slo, attainment
from bench.planner_eval.workload import Segment, schedule
from litellm_disagg.planner.policy import Condition
from litellm_disagg.runtime_config import WorkerRole


def test_a_ramped_prompt_heavy_start_splits_the_both_workers_back():
    # seed 0 at 12 req/s, ramped over 10 s: before the way back, the planner went 4P4D -> 1P4D3B at t = 4 s and then
    # moved prefill workers to decode on the mixed steps' ITL (attainment 0.58); static 4P4D carries ~16 req/s
    slo = Slo()
    arm = next(a for a in all_arms(slo, ClusterConfig()) if a.name == "planner")
    policy = arm.make()
    assert isinstance(policy, PlannerPolicy)
    result = Cluster(arm.config, policy).run(schedule([Segment("prompt-heavy", 12.0, 60.0, None, 10.0)], seed=0))
    assert attainment(slo, (r for r in result.requests if r.arrival >= 20.0)) >= slo.attainment
    moves = [m for step in policy.steps for m in step.moves]
    assert any(m.to_role is WorkerRole.BOTH for m in moves)  # the light first seconds still go aggregated
    assert any(m.condition is Condition.MIXING_COSTLY and m.from_role is WorkerRole.BOTH for m in moves)
    assert not any(m.from_role is WorkerRole.PREFILL and m.to_role is WorkerRole.DECODE for m in moves)

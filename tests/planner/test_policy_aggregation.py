"""Crossing from a split to aggregated serving on load (``aggregation_pays``): the engine-profile estimate
(litellm_disagg/planner/mixing.py) and the policy's use of it (policy.py)."""

from __future__ import annotations

import math

import pytest

from litellm_disagg.planner import ClusterSignals, Condition, LatencyWindow, ModelSignals, Planner, PlannerSettings
from litellm_disagg.planner.mixing import EngineProfile, aggregated_estimate
from litellm_disagg.planner.signals import WorkerSignals
from litellm_disagg.runtime_config import WorkerRole

P, D, B = WorkerRole.PREFILL, WorkerRole.DECODE, WorkerRole.BOTH
MODEL = "m"


def profile(budget: int) -> EngineProfile:
    # the simulator's engine as bench/planner_eval/profile.py measures it
    return EngineProfile(weight_read_ms=19.81, per_sequence_ms=0.19, prefill_tokens_per_s=20_000,
                         max_num_batched_tokens=budget)


# -- the estimate ---------------------------------------------------------------------------------------------------


def test_without_prompts_the_estimate_is_a_decode_step_at_the_batch_littles_law_gives() -> None:
    est = aggregated_estimate(profile(512), 8, 0.0, 8 * 2000.0)
    assert est.prefill_busy == 0.0
    assert est.itl_ms is not None
    # batch = rate x itl; itl = weight read + batch x per sequence
    assert est.batch == pytest.approx(2000.0 * est.itl_ms / 1000.0, rel=1e-3)
    assert est.itl_ms == pytest.approx(19.81 + est.batch * 0.19, rel=1e-3)


def test_a_larger_step_budget_stretches_the_mixed_steps_at_the_same_load() -> None:
    # prompt-heavy at 24 req/s over 8 workers (4,608-token prompts, 80-token answers)
    load = (24 * 4608.0, 24 * 80.0)
    itls = [aggregated_estimate(profile(b), 8, *load).itl_ms for b in (512, 1024, 2048)]
    assert all(x is not None for x in itls)
    assert itls[0] < itls[1] < itls[2]  # type: ignore[operator]
    assert itls[0] < 0.7 * 40 < itls[2]  # type: ignore[operator]


def test_more_prompt_load_than_the_workers_compute_is_no_estimate() -> None:
    est = aggregated_estimate(profile(512), 8, 8 * 25_000.0, 100.0)
    assert est.itl_ms is None and est.prefill_busy >= 1.0
    assert not est.holds(40.0, 0.7, 0.9)
    busy = [aggregated_estimate(profile(512), 8, r * 4608.0, r * 80.0).prefill_busy for r in (10, 20, 30)]
    assert busy == sorted(busy)


# -- the policy -----------------------------------------------------------------------------------------------------


def settings(budget: int | None, **kw: object) -> PlannerSettings:
    base: dict[str, object] = {"ttft_ms": 1000, "itl_ms": 40, "hysteresis_steps": 2, "cooldown_s": 20,
                               "min_samples": 1, "max_moves_per_step": 3, "window_s": 10,
                               "engine_profile": None if budget is None else profile(budget)}
    base.update(kw)
    return PlannerSettings.model_validate(base)


def split(prefill: int, decode: int, both: int = 0) -> tuple[WorkerSignals, ...]:
    """Worker ``w0`` .. ``w7``: the ``both`` workers first (the crossing moves the lowest ids first), then prefill,
    then decode."""
    roles = [B] * both + [P] * prefill + [D] * decode
    return tuple(WorkerSignals(f"w{i}", MODEL, role, queued_prefill_tokens=20_000 if role is P else 0)
                 for i, role in enumerate(roles))


def prompt_heavy(workers: tuple[WorkerSignals, ...], rate: float = 26.0) -> ClusterSignals:
    """A split missing the TTFT SLO (prefill time 1.6 s against 1 s) at ``rate`` prompt-heavy requests/s."""
    return ClusterSignals((ModelSignals(MODEL, workers, ttft=LatencyWindow(1700, 50), itl=LatencyWindow(25, 50),
                                        prefill_time=LatencyWindow(1600, 50), prompt_tokens_per_s=rate * 4608.0,
                                        output_tokens_per_s=rate * 80.0),))


def test_a_split_missing_its_slo_crosses_to_aggregated_when_the_estimate_holds() -> None:
    planner = Planner(settings(512))
    first = planner.step(prompt_heavy(split(6, 2)), 0.0).decision(MODEL)
    assert first is not None and first.condition is Condition.AGGREGATION_PAYS and not first.moves
    assert first.pressures.aggregated_itl_ratio is not None and first.pressures.aggregated_itl_ratio < 0.7
    second = planner.step(prompt_heavy(split(6, 2)), 2.0).decision(MODEL)
    assert second is not None and [m.to_role for m in second.moves] == [B, B, B]
    assert {m.from_role for m in second.moves} == {P}
    # the crossing goes on at the next step: no hysteresis, no settling window (its evidence is the load)
    third = planner.step(prompt_heavy(split(3, 2, 3)), 4.0).decision(MODEL)
    assert third is not None and third.condition is Condition.AGGREGATION_PAYS and len(third.moves) == 3
    fourth = planner.step(prompt_heavy(split(0, 2, 6)), 6.0).decision(MODEL)
    assert fourth is not None and [(m.from_role, m.to_role) for m in fourth.moves] == [(D, B), (D, B)]


def test_without_a_profile_the_same_split_moves_toward_prefill() -> None:
    planner = Planner(settings(None))
    for t in (0.0, 2.0):
        decision = planner.step(prompt_heavy(split(4, 4)), t).decision(MODEL)
    assert decision is not None and decision.condition is Condition.PREFILL_BOUND
    assert decision.pressures.aggregated_itl_ratio is None
    assert decision.moves and all(m.to_role is P for m in decision.moves)


def test_no_crossing_where_mixed_steps_would_break_the_itl() -> None:
    # the same load with vLLM's default budget: a 2,048-token chunk makes a ~100 ms step
    planner = Planner(settings(2048))
    for t in (0.0, 2.0):
        decision = planner.step(prompt_heavy(split(4, 4), rate=24.0), t).decision(MODEL)
    assert decision is not None and decision.condition is Condition.PREFILL_BOUND
    assert decision.pressures.aggregated_itl_ratio is not None and decision.pressures.aggregated_itl_ratio > 0.7


def test_no_crossing_while_the_split_meets_its_slos_or_past_the_workers_prompt_capacity() -> None:
    planner = Planner(settings(512))
    calm = ClusterSignals((ModelSignals(MODEL, split(6, 2), ttft=LatencyWindow(500, 50), itl=LatencyWindow(25, 50),
                                        prefill_time=LatencyWindow(450, 50), prompt_tokens_per_s=20 * 4608.0,
                                        output_tokens_per_s=20 * 80.0),))
    for t in (0.0, 2.0, 4.0):
        decision = planner.step(calm, t).decision(MODEL)
        assert decision is not None and decision.condition is not Condition.AGGREGATION_PAYS
    # 34 req/s: more prompt tokens than eight mixing workers compute within aggregate_busy_max
    over = Planner(settings(512))
    for t in (0.0, 2.0):
        decision = over.step(prompt_heavy(split(6, 2), rate=34.0), t).decision(MODEL)
    assert decision is not None and decision.condition is not Condition.AGGREGATION_PAYS
    assert decision.pressures.aggregated_busy is not None and decision.pressures.aggregated_busy > 0.9


def test_the_estimate_needs_both_load_rates_and_is_logged_as_inf_when_the_workers_cannot_keep_up() -> None:
    planner = Planner(settings(512))
    signals = ClusterSignals((ModelSignals(MODEL, split(6, 2), prefill_time=LatencyWindow(1600, 50),
                                           prompt_tokens_per_s=26 * 4608.0),))
    decision = planner.step(signals, 0.0).decision(MODEL)
    assert decision is not None and decision.pressures.aggregated_itl_ratio is None
    flooded = prompt_heavy(split(6, 2), rate=60.0)
    decision = planner.step(flooded, 2.0).decision(MODEL)
    assert decision is not None and decision.pressures.aggregated_itl_ratio == math.inf
    assert decision.pressures.as_fields()["aggregated_itl_ratio"] == math.inf


def test_no_prompt_arriving_while_prompts_wait_is_no_estimate_not_an_idle_load() -> None:
    """Closed-loop clients send nothing while their prompts queue: a window with no prompt arrived beside a backlog
    is not zero load (every estimate at zero load holds, and the split would cross on no evidence; seen in
    tests/planner/test_planner_sim_proxy_crossing.py in CI). Once a prompt arrives, the estimate is back."""
    def waiting(rate: float, *, queued: bool) -> ClusterSignals:
        workers = tuple(WorkerSignals(w.worker_id, MODEL, w.role, queued_prefill_tokens=w.queued_prefill_tokens
                                      if queued else 0, waiting_requests=0) for w in split(6, 2))
        return ClusterSignals((ModelSignals(MODEL, workers, ttft=LatencyWindow(1700, 50), itl=LatencyWindow(25, 50),
                                            prefill_time=LatencyWindow(1600, 50), prompt_tokens_per_s=rate,
                                            output_tokens_per_s=80.0),))

    planner = Planner(settings(512))
    for t in (0.0, 2.0):
        decision = planner.step(waiting(0.0, queued=True), t).decision(MODEL)
        assert decision is not None and decision.condition is not Condition.AGGREGATION_PAYS
        assert decision.pressures.aggregated_itl_ratio is None and not any(m.to_role is B for m in decision.moves)
    # waiting requests on a worker's page are a backlog too (the standalone planner has no queued tokens)
    paged = waiting(0.0, queued=False)
    model = paged.models[0]
    paged = ClusterSignals((ModelSignals(MODEL, tuple(WorkerSignals(w.worker_id, MODEL, w.role, waiting_requests=3)
                                                      for w in model.workers), ttft=model.ttft, itl=model.itl,
                                         prefill_time=model.prefill_time, prompt_tokens_per_s=0.0,
                                         output_tokens_per_s=80.0),))
    decision = Planner(settings(512)).step(paged, 0.0).decision(MODEL)
    assert decision is not None and decision.pressures.aggregated_itl_ratio is None
    # nothing waiting: a rate of zero is an idle load, priced as one
    idle = Planner(settings(512)).step(waiting(0.0, queued=False), 0.0).decision(MODEL)
    assert idle is not None and idle.pressures.aggregated_itl_ratio is not None
    # a prompt arrives: the estimate is back and the split crosses
    crossing = Planner(settings(512))
    for t in (0.0, 2.0):
        decision = crossing.step(waiting(26 * 4608.0, queued=True), t).decision(MODEL)
    assert decision is not None and decision.condition is Condition.AGGREGATION_PAYS and decision.moves


def test_a_crossing_once_started_goes_on_inside_the_band_and_stops_past_it() -> None:
    # started with margin (busy under aggregate_busy_max), it goes on while the estimate still keeps up with the
    # prompts and holds the ITL SLO itself, as the pressure band does for low_load: a noisy load estimate just over
    # aggregate_busy_max does not leave the layout half crossed
    planner = Planner(settings(512))
    for t in (0.0, 2.0):
        decision = planner.step(prompt_heavy(split(6, 2)), t).decision(MODEL)
    assert decision is not None and len(decision.moves) == 3
    busier = prompt_heavy(split(3, 2, 3), rate=32.0)  # estimated busy ~0.95: over aggregate_busy_max, under 1
    decision = planner.step(busier, 4.0).decision(MODEL)
    assert decision is not None and decision.pressures.aggregated_busy is not None
    assert 0.9 < decision.pressures.aggregated_busy < 1.0
    assert decision.condition is Condition.AGGREGATION_PAYS and len(decision.moves) == 3
    # the same load does not start a crossing
    fresh = Planner(settings(512))
    for t in (0.0, 2.0):
        decision = fresh.step(prompt_heavy(split(6, 2), rate=32.0), t).decision(MODEL)
    assert decision is not None and decision.condition is not Condition.AGGREGATION_PAYS
    # past the band (the workers would not keep up) the crossing stops
    flooded = prompt_heavy(split(0, 2, 6), rate=40.0)
    decision = planner.step(flooded, 6.0).decision(MODEL)
    assert decision is not None and decision.condition is not Condition.AGGREGATION_PAYS


def test_decode_bound_evidence_for_both_carries_over_into_the_crossing() -> None:
    # a shift to short prompts and long answers: decode just over its ITL SLO, prefill idle. decode_bound asks for
    # the idle prefill workers to go to both; when the next step reads aggregation_pays (the same moves, and more),
    # that step is the condition's second, not its first: the crossing moves at once instead of a step later
    def shifted(rates: bool) -> ClusterSignals:
        return ClusterSignals((ModelSignals(
            MODEL, split(6, 2), ttft=LatencyWindow(200, 50), itl=LatencyWindow(42, 50),
            prefill_time=LatencyWindow(20, 50),
            prompt_tokens_per_s=20 * 320.0 if rates else None, output_tokens_per_s=20 * 300.0 if rates else None),))

    planner = Planner(settings(512))
    first = planner.step(shifted(False), 0.0).decision(MODEL)
    assert first is not None and first.condition is Condition.DECODE_BOUND and not first.moves
    second = planner.step(shifted(True), 2.0).decision(MODEL)
    assert second is not None and second.condition is Condition.AGGREGATION_PAYS
    assert [(m.from_role, m.to_role) for m in second.moves] == [(P, B)] * 3
    # low_load's streak is no such evidence (no side asked for the move)
    idle = Planner(settings(512))
    quiet = ClusterSignals((ModelSignals(MODEL, split(6, 2)),))
    # (nothing measured is idle once the planner has seen a whole window, not before: test_policy.py)
    assert idle.step(quiet, 0.0).decision(MODEL).condition is Condition.STEADY  # type: ignore[union-attr]
    assert idle.step(quiet, 10.0).decision(MODEL).condition is Condition.LOW_LOAD  # type: ignore[union-attr]
    after = idle.step(prompt_heavy(split(6, 2)), 12.0).decision(MODEL)
    assert after is not None and after.condition is Condition.AGGREGATION_PAYS and not after.moves

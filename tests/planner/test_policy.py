"""The planner's decision core (litellm_disagg/planner/policy.py): pure, table-driven, simulated time."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from litellm_disagg.planner import (
    ClusterSignals,
    Condition,
    DecodeDriver,
    LatencyWindow,
    ModelSignals,
    Planner,
    PlannerSettings,
    WorkerSignals,
)
from litellm_disagg.planner.policy import condition_of, pressures
from litellm_disagg.runtime_config import WorkerRole, WorkerState

P, D, B = WorkerRole.PREFILL, WorkerRole.DECODE, WorkerRole.BOTH
MODEL = "m"


def settings(**kw: object) -> PlannerSettings:
    # one move per step and no settling time unless a test asks for them (their own tests below)
    base: dict[str, object] = {"ttft_ms": 1000, "itl_ms": 50, "hysteresis_steps": 1, "cooldown_s": 30,
                               "min_samples": 1, "max_moves_per_step": 1, "window_s": 1e-6}
    base.update(kw)
    return PlannerSettings.model_validate(base)


def w(wid: str, role: WorkerRole, **kw: object) -> WorkerSignals:
    return WorkerSignals(wid, MODEL, role, **kw)  # type: ignore[arg-type]


def lat(ms: float | None, n: int = 20) -> LatencyWindow:
    return LatencyWindow(ms, n if ms is not None else 0)


def cluster(workers: list[WorkerSignals], ttft: float | None = None, itl: float | None = None,
            transfer: float | None = None, rate: float | None = None) -> ClusterSignals:
    return ClusterSignals((ModelSignals(MODEL, tuple(workers), lat(ttft), lat(itl), lat(transfer), rate),))


def layout(ps: int = 0, ds: int = 0, bs: int = 0) -> list[WorkerSignals]:
    return ([w(f"p{i}", P) for i in range(ps)] + [w(f"d{i}", D) for i in range(ds)]
            + [w(f"b{i}", B) for i in range(bs)])


# -- signals -------------------------------------------------------------------------------------------------------


def test_latency_window_quantile_nearest_rank_and_empty() -> None:
    assert LatencyWindow.of([], 0.9) == LatencyWindow()
    window = LatencyWindow.of([float(i) for i in range(1, 11)], 0.9)
    assert (window.p_ms, window.samples) == (9.0, 10)
    assert LatencyWindow.of([5.0, float("nan"), -1.0], 0.5) == LatencyWindow(5.0, 1)
    assert window.ratio(9.0, min_samples=10) == 1.0
    assert window.ratio(9.0, min_samples=11) is None


def test_worker_signals_sanitise_and_derive() -> None:
    worker = w("a", D, running_requests=-3, kv_usage=float("inf"), max_running_requests=0)
    assert (worker.running_requests, worker.kv_usage, worker.max_running_requests) == (0, None, None)
    assert worker.batch_occupancy is None
    assert w("a", D, running_requests=3, max_running_requests=4).batch_occupancy == 0.75
    assert w("a", D, kv_usage=1.7).kv_usage == 1.0
    flipping = w("a", D, pending_role=P)
    assert flipping.flipping and flipping.effective_role is P
    assert not w("a", D, pending_role=D).flipping


def test_pools_count_effective_roles_of_ready_workers_only() -> None:
    model = ModelSignals(MODEL, (w("p", P, queued_prefill_tokens=100), w("b", B, queued_prefill_tokens=50),
                                 w("d", D, running_requests=2, max_running_requests=4, kv_usage=0.5),
                                 w("x", P, state=WorkerState.DRAINING, queued_prefill_tokens=999),
                                 w("f", D, pending_role=P)))
    assert {x.worker_id for x in model.prefill_pool.workers} == {"p", "b", "f"}
    assert {x.worker_id for x in model.decode_pool.workers} == {"b", "d"}
    assert model.prefill_pool.queued_prefill_tokens == 150
    assert model.decode_pool.batch_occupancy == 0.5
    assert model.decode_pool.kv_usage == 0.5


# -- pressures and conditions --------------------------------------------------------------------------------------


def test_pressures_are_slo_ratios_and_queue_wait() -> None:
    s = settings()
    model = cluster([w("p", P, queued_prefill_tokens=2000), w("d", D, running_requests=9, max_running_requests=10,
                                                               kv_usage=0.45)],
                    ttft=500, itl=25, transfer=100, rate=1000).models[0]
    p = pressures(model, s)
    assert p.ttft_ratio == 0.5 and p.queue_ratio == 2.0 and p.prefill == 2.0
    assert p.itl_ratio == 0.5 and p.occupancy_ratio == pytest.approx(1.0) and p.kv_ratio == pytest.approx(0.5)
    assert p.decode == pytest.approx(1.0) and p.decode_driver is DecodeDriver.OCCUPANCY
    assert p.transfer_share == 0.1


def test_no_evidence_is_zero_pressure() -> None:
    p = pressures(cluster(layout(1, 1)).models[0], settings())
    assert (p.prefill, p.decode, p.decode_driver) == (0.0, 0.0, DecodeDriver.NONE)
    # too few samples: no evidence either
    few = ClusterSignals((ModelSignals(MODEL, tuple(layout(1, 1)), LatencyWindow(5000, 2)),)).models[0]
    assert pressures(few, settings(min_samples=5)).prefill == 0.0


@pytest.mark.parametrize(
    ("prefill_ms", "itl_ms", "transfer_ms", "disagg", "expected"),
    [
        (2000, 100, None, True, Condition.OVERLOADED),       # both sides over
        (2000, 10, None, True, Condition.PREFILL_BOUND),     # TTFT over, decode idle
        (2000, 40, None, True, Condition.OVERLOADED),        # TTFT over, decode without headroom (0.8)
        (100, 100, None, True, Condition.DECODE_BOUND),      # ITL over, prefill idle
        (800, 100, None, True, Condition.OVERLOADED),        # ITL over, prefill without headroom
        (100, 5, None, True, Condition.LOW_LOAD),            # both low
        (100, 5, None, False, Condition.STEADY),             # already aggregated
        (500, 25, 600, True, Condition.TRANSFER_COSTLY),     # transfer eats 60% of the TTFT budget
        (500, 25, 300, True, Condition.STEADY),
        (500, 25, None, True, Condition.STEADY),
    ],
)
def test_condition_table(prefill_ms: float, itl_ms: float, transfer_ms: float | None, disagg: bool,
                         expected: Condition) -> None:
    s = settings()
    model = cluster(layout(1, 1), ttft=prefill_ms, itl=itl_ms, transfer=transfer_ms).models[0]
    assert condition_of(pressures(model, s), s, disaggregated=disagg) is expected


def test_no_aggregation_when_not_allowed() -> None:
    s = settings(allow_aggregated=False)
    p = pressures(cluster(layout(1, 1), ttft=10, itl=1).models[0], s)
    assert condition_of(p, s, disaggregated=True) is Condition.STEADY


# -- moves -----------------------------------------------------------------------------------------------------------


def test_prefill_bound_moves_least_busy_decode_worker_to_prefill() -> None:
    workers = [w("p0", P), w("d0", D, running_requests=5), w("d1", D, running_requests=1), w("d2", D)]
    step = Planner(settings()).step(cluster(workers, ttft=3000, itl=10), now=0)
    (move,) = step.moves
    assert (move.worker_id, move.from_role, move.to_role, move.condition) == ("d2", D, P, Condition.PREFILL_BOUND)
    decision = step.decisions[0]
    assert (decision.desired.prefill, decision.desired.decode) == (2, 2)
    assert (decision.current.prefill, decision.current.decode) == (1, 3)


def test_prefill_bound_from_aggregated_moves_nothing_and_asks_for_a_worker_more() -> None:
    # every worker of an all-``both`` layout already prefills (its own prompts): a ``both`` worker moved to prefill
    # gets no prompt from a decode worker (there is none) and its decode capacity is gone, so no role change adds
    # prefill capacity; the desired sizes grow by one ``both`` worker instead
    step = Planner(settings()).step(cluster(layout(0, 0, 3), ttft=3000, itl=10), now=0)
    decision = step.decisions[0]
    assert decision.condition is Condition.PREFILL_BOUND and step.moves == ()
    assert decision.held is not None and "no decode worker" in decision.held
    assert (decision.desired.prefill, decision.desired.decode, decision.desired.both) == (0, 0, 4)


def test_prefill_bound_beside_decode_workers_still_splits_a_both_worker() -> None:
    step = Planner(settings()).step(cluster(layout(0, 1, 2), ttft=3000, itl=10), now=0)
    assert [(m.from_role, m.to_role) for m in step.moves] == [(B, P)]


def test_decode_bound_by_itl_moves_prefill_to_decode() -> None:
    step = Planner(settings()).step(cluster(layout(2, 1), ttft=500, itl=80), now=0)
    assert [(m.worker_id, m.to_role) for m in step.moves] == [("p0", D)]
    assert step.decisions[0].pressures.decode_driver is DecodeDriver.ITL


def test_decode_bound_by_kv_moves_prefill_to_both() -> None:
    workers = [w("p0", P), w("p1", P), w("d0", D, kv_usage=0.99)]
    step = Planner(settings()).step(cluster(workers, ttft=100, itl=10), now=0)
    assert step.decisions[0].condition is Condition.DECODE_BOUND
    assert step.decisions[0].pressures.decode_driver is DecodeDriver.KV
    assert [(m.worker_id, m.to_role) for m in step.moves] == [("p0", B)]


def test_decode_bound_by_kv_without_aggregation_moves_to_decode() -> None:
    workers = [w("p0", P), w("p1", P), w("d0", D, kv_usage=0.99)]
    step = Planner(settings(allow_aggregated=False)).step(cluster(workers, ttft=100, itl=10), now=0)
    assert [(m.worker_id, m.to_role) for m in step.moves] == [("p0", D)]


def test_low_load_aggregates_prefill_first_then_decode() -> None:
    planner = Planner(settings(cooldown_s=0))
    workers = layout(1, 2)
    seen = []
    for t in range(5):
        step = planner.step(cluster(workers, ttft=50, itl=2), now=t)
        for m in step.moves:
            seen.append((m.worker_id, m.to_role))
            workers = [w(x.worker_id, m.to_role) if x.worker_id == m.worker_id else x for x in workers]
    assert seen == [("p0", B), ("d0", B), ("d1", B)]
    assert all(x.role is B for x in workers)


def test_transfer_costly_aggregates() -> None:
    step = Planner(settings()).step(cluster(layout(1, 1), ttft=500, itl=25, transfer=700), now=0)
    assert step.decisions[0].condition is Condition.TRANSFER_COSTLY
    assert [(m.worker_id, m.to_role) for m in step.moves] == [("p0", B)]


def test_minimum_pools_hold() -> None:
    # the only decode worker is never taken for prefill
    step = Planner(settings()).step(cluster(layout(1, 1), ttft=3000, itl=10), now=0)
    assert step.moves == ()
    assert step.decisions[0].held == "no movable worker: minimum pools"
    # ... and the planner asks for one more prefill worker instead
    assert step.decisions[0].desired.prefill == 2
    # min_prefill_workers=2: the second prefill worker stays
    step = Planner(settings(min_prefill_workers=2)).step(cluster(layout(2, 1), ttft=500, itl=80), now=0)
    assert step.moves == ()
    # min_prefill_workers=0: the last prefill worker may go to decode
    step = Planner(settings(min_prefill_workers=0)).step(cluster(layout(1, 1), ttft=500, itl=80), now=0)
    assert [(m.worker_id, m.to_role) for m in step.moves] == [("p0", D)]


def test_hysteresis_needs_consecutive_steps_and_restarts_after_a_move() -> None:
    planner = Planner(settings(hysteresis_steps=3, cooldown_s=0))
    hot = cluster(layout(1, 3), ttft=3000, itl=10)
    calm = cluster(layout(1, 3), ttft=500, itl=25)
    assert planner.step(hot, 0).moves == ()
    assert planner.step(hot, 1).decisions[0].held == "hysteresis 2/3"
    assert planner.step(calm, 2).moves == ()        # the streak breaks
    assert planner.step(hot, 3).moves == ()
    assert planner.step(hot, 4).moves == ()
    assert len(planner.step(hot, 5).moves) == 1     # third consecutive
    assert planner.step(hot, 6).moves == ()         # the count starts again after a move
    assert planner.step(hot, 7).moves == ()
    assert len(planner.step(hot, 8).moves) == 1


def test_cooldown_blocks_a_second_move_of_the_same_worker() -> None:
    planner = Planner(settings(cooldown_s=30, min_prefill_workers=0))
    workers = [w("p0", P), w("d0", D)]
    (move,) = planner.step(cluster(workers, ttft=500, itl=80), 0).moves
    assert move.worker_id == "p0" and move.to_role is D
    workers = [w("p0", D), w("d0", D)]
    # now prefill is hot: p0 is the least busy decode worker, but cooling down; d0 moves instead
    (move,) = planner.step(cluster(workers, ttft=3000, itl=10), 10).moves
    assert move.worker_id == "d0"
    workers = [w("p0", D), w("d0", P)]
    # decode hot again at t=20: d0 cooling down (moved at 10), p0 is not a prefill worker: nothing
    step = planner.step(cluster(workers, ttft=500, itl=80), 20)
    assert step.moves == () and "cooldown" in (step.decisions[0].held or "")
    # after the cooldown it may move
    assert [m.worker_id for m in planner.step(cluster(workers, ttft=500, itl=80), 41).moves] == ["d0"]


def test_no_move_while_a_flip_is_in_progress() -> None:
    workers = [w("p0", P), w("d0", D, pending_role=P), w("d1", D), w("d2", D)]
    step = Planner(settings()).step(cluster(workers, ttft=3000, itl=10), 0)
    assert step.moves == () and step.decisions[0].held == "flip in progress: d0"
    # the flipping worker counts for its new role
    assert (step.decisions[0].current.prefill, step.decisions[0].current.decode) == (2, 2)


def test_draining_and_starting_workers_are_never_moved_or_counted() -> None:
    workers = [w("p0", P), w("d0", D, state=WorkerState.DRAINING), w("d1", D, state=WorkerState.STARTING), w("d2", D)]
    step = Planner(settings()).step(cluster(workers, ttft=3000, itl=10), 0)
    assert step.moves == ()
    assert step.decisions[0].current.total == 2


def test_max_moves_per_step() -> None:
    step = Planner(settings(max_moves_per_step=2)).step(cluster(layout(1, 4), ttft=9000, itl=10), 0)
    assert [m.worker_id for m in step.moves] == ["d0", "d1"]
    assert step.decisions[0].desired.prefill == 3


def test_overloaded_grows_the_more_pressed_side() -> None:
    step = Planner(settings()).step(cluster(layout(1, 1), ttft=3000, itl=60), 0)
    d = step.decisions[0]
    assert d.condition is Condition.OVERLOADED and step.moves == ()
    assert (d.desired.prefill, d.desired.decode, d.desired.both) == (2, 1, 0)
    step = Planner(settings()).step(cluster(layout(1, 1), ttft=1100, itl=100), 0)
    assert (step.decisions[0].desired.prefill, step.decisions[0].desired.decode) == (1, 2)
    # aggregated layout: grows the both pool
    step = Planner(settings()).step(cluster(layout(0, 0, 2), ttft=3000, itl=100), 0)
    assert step.decisions[0].desired.both == 3


def test_scale_down_after_hysteresis_names_the_least_busy_worker_of_the_least_pressed_side() -> None:
    s = settings(hysteresis_steps=2, allow_aggregated=False)
    planner = Planner(s)
    workers = [w("p0", P, running_requests=1), w("p1", P), w("d0", D), w("d1", D)]
    quiet = cluster(workers, ttft=100, itl=1)     # prefill 0.1, decode 0.02: decode side least pressed
    first = planner.step(quiet, 0).decisions[0]
    assert first.drain is None and first.desired.total == 4
    second = planner.step(quiet, 1).decisions[0]
    assert second.drain == "d0" and (second.desired.decode, second.desired.prefill) == (1, 2)
    # the same worker and the same sizes while it is in the pool (an autoscaler sees a steady target)
    third = planner.step(quiet, 2).decisions[0]
    assert third.drain == "d0" and third.desired == second.desired
    # it drains: it leaves the pool, the sizes already leave it out, and the next removal needs fresh evidence
    draining = [w("p0", P, running_requests=1), w("p1", P), w("d0", D, state=WorkerState.DRAINING), w("d1", D)]
    quiet = cluster(draining, ttft=100, itl=1)
    fourth = planner.step(quiet, 3).decisions[0]
    assert fourth.drain is None and fourth.desired.total == 3
    assert planner.step(quiet, 4).decisions[0].drain is None
    # d1 is the last decode worker: the next removal is a prefill worker, the least busy one
    assert planner.step(quiet, 5).decisions[0].drain == "p1"
    # load comes back: no removal, the name is forgotten
    assert planner.step(cluster(draining, ttft=900, itl=1), 6).decisions[0].drain is None


def test_scale_down_respects_minimums() -> None:
    planner = Planner(settings(allow_aggregated=False))
    d = planner.step(cluster(layout(1, 1), ttft=10, itl=1), 0).decisions[0]
    assert d.drain is None and d.desired.total == 2


def test_scale_down_never_names_a_worker_moved_this_step() -> None:
    planner = Planner(settings())
    d = planner.step(cluster(layout(1, 2), ttft=10, itl=1), 0).decisions[0]
    assert [m.worker_id for m in d.moves] == ["p0"]
    assert d.drain != "p0"


def test_models_are_independent_and_forgotten_when_gone() -> None:
    planner = Planner(settings(hysteresis_steps=2))
    a = ModelSignals("a", (WorkerSignals("a-p", "a", P), WorkerSignals("a-d0", "a", D), WorkerSignals("a-d1", "a", D)),
                     lat(3000), lat(10))
    b = ModelSignals("b", (WorkerSignals("b-p", "b", P), WorkerSignals("b-d", "b", D)), lat(500), lat(25))
    planner.step(ClusterSignals((a, b)), 0)
    step = planner.step(ClusterSignals((b, a)), 1)
    assert [m.worker_id for m in step.moves] == ["a-d0"]
    assert [d.model for d in step.decisions] == ["a", "b"]
    planner.step(ClusterSignals((b,)), 2)
    # a's streak was forgotten: one hot step is not enough again
    assert planner.step(ClusterSignals((a,)), 3).moves == ()


def test_step_is_deterministic() -> None:
    signals = cluster(layout(2, 3, 1), ttft=3000, itl=10)
    assert Planner(settings()).step(signals, 0) == Planner(settings()).step(signals, 0)


def test_settings_validate_bands_and_hook() -> None:
    with pytest.raises(ValidationError):
        PlannerSettings(aggregate_below=0.8, headroom=0.7)
    with pytest.raises(ValidationError):
        PlannerSettings(hook_command=[])
    with pytest.raises(ValidationError):
        PlannerSettings.model_validate({"ttft_ms": 0})
    assert PlannerSettings().enabled is False


def test_only_roles_the_launch_serves() -> None:
    workers = [w("p0", P), w("d0", D, servable_roles=frozenset()), w("d1", D, servable_roles=frozenset({P})),
               w("d2", D)]
    assert not workers[1].can_serve(P) and workers[1].can_serve(D)
    step = Planner(settings()).step(cluster(workers, ttft=3000, itl=10), 0)
    assert [m.worker_id for m in step.moves] == ["d1"]
    only_fixed = [w("p0", P), w("d0", D, servable_roles=frozenset()), w("d1", D, servable_roles=frozenset())]
    step = Planner(settings()).step(cluster(only_fixed, ttft=3000, itl=10), 0)
    assert step.moves == () and step.decisions[0].held == "no movable worker: launch cannot serve prefill"


def test_a_split_with_prompts_arriving_and_no_first_token_yet_is_not_idle() -> None:
    """A planner started on a loaded split (``litellm-disagg planner`` beside a running proxy: no queue measured),
    or one whose window holds fewer first tokens than ``min_samples`` (a few requests a second, or first tokens
    slower than the window), has no evidence on the prefill side while prompts arrive: the prefill pressure reads
    0.0 for want of it, and is not taken for an idle side. Seen on real CPU workers (bench.planner_crossing): both
    workers moved to ``both`` on ``low_load`` 4 s after the planner started, under a load whose first tokens took
    15-19 s; and on ``decode_bound``'s aggregating branch (ITL at 0.72-0.8 of its SLO) with a TTFT window of 3
    samples at 1.4x its SLO."""
    def signals(ttft: float | None, itl: float | None, rate: float) -> ClusterSignals:
        return ClusterSignals((ModelSignals(MODEL, tuple(layout(1, 1)), lat(ttft), lat(itl), lat(None),
                                            prompt_tokens_per_s=rate, output_tokens_per_s=10.0),))

    planner = Planner(settings(hysteresis_steps=2))
    for t in range(4):
        step = planner.step(signals(None, None, 300.0), now=t)
        decision = step.decisions[0]
        assert decision.condition is Condition.STEADY and step.moves == ()
        assert decision.pressures.prefill_unmeasured and decision.pressures.as_fields()["prefill_unmeasured"] == 1.0
    # the decode side near its SLO (ITL at 0.8 of it) beside an unmeasured prefill side: no move to ``both``
    step = Planner(settings()).step(signals(None, 40, 300.0), now=0)
    assert step.decisions[0].condition is Condition.STEADY and step.moves == ()
    # ... where a measured quiet prefill side is idle, as before
    assert Planner(settings()).step(signals(50, 40, 300.0), now=0).decisions[0].condition is Condition.DECODE_BOUND
    assert Planner(settings()).step(signals(50, 2, 300.0), now=0).decisions[0].condition is Condition.LOW_LOAD

    def after_a_window(model: ClusterSignals) -> Condition:
        planner = Planner(settings(window_s=10))
        planner.step(model, now=0)
        planner.step(model, now=5)
        return planner.step(model, now=10).decisions[0].condition

    # a lull between two arrivals (rate zero over the window) while the latency window holds first tokens too few to
    # measure is no idle side either: on real CPU workers at a request every ~12 s, a decode worker an ITL breach
    # had moved out of ``both`` went back a step later on that reading, every cooldown (2026-12-06)
    def sparse(ttft_samples: int, layout_now: list[WorkerSignals]) -> ClusterSignals:
        return ClusterSignals((ModelSignals(MODEL, tuple(layout_now), LatencyWindow(9000.0, ttft_samples), lat(40),
                                            lat(None), prompt_tokens_per_s=0.0, output_tokens_per_s=5.0),))

    five = settings(window_s=10, min_samples=5, hysteresis_steps=1)
    decode_and_both = [w("d0", D), w("b0", B)]
    for samples, condition in ((2, Condition.STEADY), (0, Condition.DECODE_BOUND)):
        planner = Planner(five)
        for t in (0, 5, 10):
            step = planner.step(sparse(samples, decode_and_both), now=t)
        decision = step.decisions[0]
        assert decision.condition is condition, samples
        assert decision.pressures.prefill_unmeasured is (samples > 0)
        assert (step.moves == ()) is (samples > 0)  # with none seen: the aggregating decode_bound moves d0 to both

    # right after a layout change the latency windows start empty (they never reach back past it): a prompt over the
    # reach (``window_max_s``), none in the last ``window_s``, still leaves the side unmeasured, not idle
    def after_a_move(recent_rate: float | None) -> ClusterSignals:
        return ClusterSignals((ModelSignals(MODEL, tuple(decode_and_both), LatencyWindow(), lat(40), lat(None),
                                            prompt_tokens_per_s=0.0, output_tokens_per_s=5.0,
                                            recent_prompt_tokens_per_s=recent_rate),))

    for recent_rate, condition in ((25.0, Condition.STEADY), (0.0, Condition.DECODE_BOUND),
                                   (None, Condition.DECODE_BOUND)):
        planner = Planner(five)
        for t in (0, 5, 10):
            step = planner.step(after_a_move(recent_rate), now=t)
        assert step.decisions[0].condition is condition, recent_rate
        assert step.decisions[0].pressures.prefill_unmeasured is (recent_rate == 25.0)

    # no prompt arriving, and a prompt rate not measured at all (no KV routing), say nothing in the planner's first
    # window (a rate read over a planner's first seconds was zero under a load on real workers: a lull between two
    # arrivals) and are idle once it has seen a whole one, as before
    for idle, condition in ((signals(None, 40, 0.0), Condition.DECODE_BOUND),
                            (signals(None, None, 0.0), Condition.LOW_LOAD),
                            (cluster(layout(1, 1)), Condition.LOW_LOAD)):
        first = Planner(settings(window_s=10)).step(idle, now=0).decisions[0]
        assert first.condition is Condition.STEADY and first.pressures.prefill_unmeasured
        assert after_a_window(idle) is condition

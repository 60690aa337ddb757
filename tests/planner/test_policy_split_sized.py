"""From ``both`` workers straight to the split the engine profile sizes (``disaggregation_pays``): the split estimate
(litellm_disagg/planner/mixing.py: ``split_estimate``, ``sized_split``) and the policy's use of it (policy.py). Pure.

The case it exists for: every worker ``both`` with vLLM's default 2,048-token budget under prompt-heavy load, where
each 2,048-token chunk makes a ~100 ms step and the ITL misses its SLO. Without a profile the planner splits one
worker per settling window (decode_bound, then mixing_costly), about 50 s to reach the split the load needs."""

from __future__ import annotations

import pytest

from litellm_disagg.planner import ClusterSignals, Condition, LatencyWindow, ModelSignals, Planner, PlannerSettings
from litellm_disagg.planner.mixing import EngineProfile, sized_split, split_estimate
from litellm_disagg.planner.signals import WorkerSignals
from litellm_disagg.runtime_config import WorkerRole

P, D, B = WorkerRole.PREFILL, WorkerRole.DECODE, WorkerRole.BOTH
MODEL = "m"
PROFILE = EngineProfile(weight_read_ms=19.81, per_sequence_ms=0.19, prefill_tokens_per_s=20_000,
                        max_num_batched_tokens=2048)


def test_the_split_estimate_is_the_prefill_workers_share_of_the_prompts_and_a_decode_step_at_its_batch() -> None:
    est = split_estimate(PROFILE, 4, 4, 4 * 10_000.0, 4 * 1_000.0)
    assert est.prefill_busy == pytest.approx(10_000 / 2048 * PROFILE.step_ms(2048, 0) / 1000)
    assert est.itl_ms is not None
    batch = 1_000.0 * est.itl_ms / 1000  # Little's law at the worker's output rate
    assert est.itl_ms == pytest.approx(PROFILE.step_ms(0, batch))
    # more output than a decode worker's steps can ever carry: no estimate
    assert split_estimate(PROFILE, 4, 1, 0.0, 10_000.0).itl_ms is None


def test_the_sized_split_has_the_most_room_on_its_tighter_side_and_none_when_no_split_holds() -> None:
    rate = 20.0  # prompt-heavy requests/s: 4,608-token prompts, 80-token answers
    found = sized_split(PROFILE, 8, rate * 4608.0, rate * 80.0, itl_target_ms=40, itl_margin=0.7, busy_max=0.9)
    assert found is not None and (found.prefill, found.decode) == (6, 2)
    assert found.prefill_busy <= 0.9 and split_estimate(PROFILE, 5, 3, rate * 4608.0, rate * 80.0).prefill_busy > 0.9
    # 7P1D keeps up with the prompts with more room, but its one decode worker's ITL would be at the margin
    seven = split_estimate(PROFILE, 7, 1, rate * 4608.0, rate * 80.0)
    assert seven.prefill_busy < found.prefill_busy and seven.itl_ms is not None and seven.itl_ms > 0.7 * 40
    # at a lighter load not the fewest prefill workers that keep up (1 would): room on both sides
    light = sized_split(PROFILE, 8, 8 * 4608.0, 8 * 80.0, itl_target_ms=40, itl_margin=0.7, busy_max=0.9)
    assert light is not None and light.prefill == 3
    assert split_estimate(PROFILE, 2, 6, 8 * 4608.0, 8 * 80.0).prefill_busy > 0.9
    assert sized_split(PROFILE, 8, 40 * 4608.0, 40 * 80.0, itl_target_ms=40, itl_margin=0.7, busy_max=0.9) is None
    # a decode side the outputs would overload: no split holds
    assert sized_split(PROFILE, 8, 1000.0, 100_000.0, itl_target_ms=40, itl_margin=0.7, busy_max=0.9) is None


def settings(profile: EngineProfile | None = PROFILE, **kw: object) -> PlannerSettings:
    base: dict[str, object] = {"ttft_ms": 2000, "itl_ms": 40, "hysteresis_steps": 2, "cooldown_s": 20,
                               "min_samples": 1, "max_moves_per_step": 3, "window_s": 10, "engine_profile": profile}
    base.update(kw)
    return PlannerSettings.model_validate(base)


def layout(prefill: int, decode: int, both: int) -> tuple[WorkerSignals, ...]:
    roles = [B] * both + [P] * prefill + [D] * decode
    return tuple(WorkerSignals(f"w{i}", MODEL, role) for i, role in enumerate(roles))


def mixing(workers: tuple[WorkerSignals, ...], rate: float = 20.0, itl_ms: float = 52.0) -> ClusterSignals:
    """``both`` workers mixing 2,048-token chunks into their steps: the ITL over its 40 ms SLO, prompts arriving
    (prefill time 1.1 s against the 2 s TTFT SLO: busy, not over), the decode side's KV far from full."""
    return ClusterSignals((ModelSignals(MODEL, workers, ttft=LatencyWindow(1200, 50), itl=LatencyWindow(itl_ms, 50),
                                        prefill_time=LatencyWindow(1100, 50), prompt_tokens_per_s=rate * 4608.0,
                                        output_tokens_per_s=rate * 80.0),))


def warmed(planner: Planner, workers: tuple[WorkerSignals, ...]) -> Planner:
    """A planner that has seen the model for a window (``window_s``, 10 s) at a calm load: the load rates now cover
    a whole window, which a split is sized from."""
    planner.step(mixing(workers, rate=2.0, itl_ms=22.0), -10.0)
    return planner


def moves(decision) -> list[tuple[WorkerRole, WorkerRole]]:
    return [(m.from_role, m.to_role) for m in decision.moves]


def applied(workers: tuple[WorkerSignals, ...], decision) -> tuple[WorkerSignals, ...]:
    """The layout after ``decision``'s moves (the flips done at once), worker ids kept."""
    to = {m.worker_id: m.to_role for m in decision.moves}
    return tuple(WorkerSignals(w.worker_id, MODEL, to.get(w.worker_id, w.role)) for w in workers)


def test_all_both_missing_the_itl_goes_to_the_sized_split_in_a_few_steps() -> None:
    workers = layout(0, 0, 8)
    planner = warmed(Planner(settings()), workers)
    first = planner.step(mixing(workers), 0.0).decision(MODEL)
    assert first is not None and first.condition is Condition.DISAGGREGATION_PAYS and not first.moves
    assert first.held == "hysteresis 1/2" and first.pressures.split_prefill == 6
    second = planner.step(mixing(workers), 2.0).decision(MODEL)
    # decode workers first: a prefill worker beside only ``both`` workers would get no prompts
    assert second is not None and moves(second) == [(B, D), (B, D), (B, P)]
    # it goes on at the next steps, no hysteresis and no settling window, the stale ITL window notwithstanding
    workers = applied(workers, second)
    third = planner.step(mixing(workers), 4.0).decision(MODEL)
    assert third is not None and third.condition is Condition.DISAGGREGATION_PAYS and moves(third) == [(B, P)] * 3
    workers = applied(workers, third)
    fourth = planner.step(mixing(workers), 6.0).decision(MODEL)
    assert fourth is not None and moves(fourth) == [(B, P)] * 2
    workers = applied(workers, fourth)
    assert [w.role for w in workers].count(P) == 6 and [w.role for w in workers].count(D) == 2
    done = planner.step(mixing(workers, itl_ms=25.0), 8.0).decision(MODEL)
    assert done is not None and done.condition is not Condition.DISAGGREGATION_PAYS and not done.moves


def test_a_started_split_stops_when_the_load_no_longer_fits_it() -> None:
    workers = layout(0, 0, 8)
    planner = warmed(Planner(settings()), workers)
    planner.step(mixing(workers), 0.0)
    second = planner.step(mixing(workers), 2.0).decision(MODEL)
    assert second is not None and len(second.moves) == 3
    # the prompts doubled: 6 prefill workers no longer keep up (busy over 1), so the sized split is off
    third = planner.step(mixing(applied(workers, second), rate=40.0), 4.0).decision(MODEL)
    assert third is not None and third.condition is not Condition.DISAGGREGATION_PAYS


def test_without_a_profile_all_both_splits_one_worker_per_settling_window() -> None:
    planner = warmed(Planner(settings(profile=None)), layout(0, 0, 8))
    planner.step(mixing(layout(0, 0, 8)), 0.0)
    second = planner.step(mixing(layout(0, 0, 8)), 2.0).decision(MODEL)
    assert second is not None and second.condition is Condition.DECODE_BOUND and moves(second) == [(B, D)]
    third = planner.step(mixing(layout(0, 1, 7)), 4.0).decision(MODEL)
    assert third is not None and not third.moves and third.pressures.split_prefill is None


def test_no_split_while_the_itl_holds_or_when_the_profile_sizes_none() -> None:
    planner = warmed(Planner(settings()), layout(0, 0, 8))
    for t in (0.0, 2.0, 4.0):
        calm = planner.step(mixing(layout(0, 0, 8), itl_ms=30.0), t).decision(MODEL)
        assert calm is not None and calm.condition is not Condition.DISAGGREGATION_PAYS and not calm.moves
    # at 40 req/s no split of 8 keeps up with the prompts: the profile sizes none, the old path decides
    planner = warmed(Planner(settings()), layout(0, 0, 8))
    for t in (0.0, 2.0):
        heavy = planner.step(mixing(layout(0, 0, 8), rate=40.0), t).decision(MODEL)
    assert heavy is not None and heavy.condition is not Condition.DISAGGREGATION_PAYS
    assert heavy.pressures.split_prefill is None


def test_no_split_from_the_first_seconds_of_load() -> None:
    """The output rate lags the prompts' at first (answers come after their prompts): a split sized then has too
    few decode workers. The first window only goes the old way."""
    planner = Planner(settings())
    for t in (0.0, 2.0):
        early = planner.step(mixing(layout(0, 0, 8)), t).decision(MODEL)
        assert early is not None and early.condition is not Condition.DISAGGREGATION_PAYS
        assert early.pressures.split_prefill is None


def test_no_split_where_the_estimate_says_aggregated_serving_holds() -> None:
    """An ITL just over its SLO while every worker as ``both`` holds this load with room (the estimate under
    ``headroom``): a burst's spread, not a load a split would serve better."""
    planner = warmed(Planner(settings()), layout(0, 0, 8))
    for t in (0.0, 2.0, 4.0):
        light = planner.step(mixing(layout(0, 0, 8), rate=8.0, itl_ms=44.0), t).decision(MODEL)
        assert light is not None and light.condition is Condition.DECODE_BOUND
        assert light.pressures.split_prefill is not None
        # nor a rule's move: a ``both`` worker moved to decode for a burst comes back at the next quiet period
        assert not light.moves and (t == 0.0 or "a burst's spread" in (light.held or ""))
        # the estimate is under ``headroom``; the ITL beyond its margin makes the profile's correction (calibration.py)
        # 44 x 0.7 / 24.8 ms = 1.24, and the corrected estimate is still in the band's lower half: no split
        ratio, correction = light.pressures.aggregated_itl_ratio, light.pressures.mixing_correction
        assert ratio is not None and correction is not None and ratio / correction < 0.7
        assert correction == pytest.approx(1.24, abs=0.01) and ratio < (0.7 + 1.0) / 2


def test_a_bursts_itl_breach_moves_no_worker_of_an_all_both_layout_the_estimate_says_holds() -> None:
    """The rules' move for the breach above (``decode_bound``: a ``both`` worker to decode) is held with a profile, and
    only in an all-``both`` layout: in the evaluation's bursts from all-``both`` that worker went to decode on each
    burst and back to ``both`` in each quiet period. Without a profile, or with a prefill worker in the layout, the
    rule acts."""
    planner = warmed(Planner(settings()), layout(0, 0, 8))
    planner.step(mixing(layout(0, 0, 8), rate=8.0, itl_ms=44.0), 0.0)
    held = planner.step(mixing(layout(0, 0, 8), rate=8.0, itl_ms=44.0), 2.0).decision(MODEL)
    assert held is not None and not held.moves and held.held is not None and held.held.startswith("a burst's spread")
    planner = warmed(Planner(settings(profile=None)), layout(0, 0, 8))
    planner.step(mixing(layout(0, 0, 8), rate=8.0, itl_ms=44.0), 0.0)
    rules = planner.step(mixing(layout(0, 0, 8), rate=8.0, itl_ms=44.0), 2.0).decision(MODEL)
    assert rules is not None and moves(rules) == [(B, D)]
    planner = warmed(Planner(settings()), layout(1, 0, 7))
    planner.step(mixing(layout(1, 0, 7), rate=8.0, itl_ms=44.0), 0.0)
    mixed = planner.step(mixing(layout(1, 0, 7), rate=8.0, itl_ms=44.0), 2.0).decision(MODEL)
    assert mixed is not None and mixed.moves and mixed.held is None


def test_workers_that_crossed_to_both_for_the_load_keep_their_cooldown() -> None:
    """A split that crossed to ``both`` (``aggregation_pays``) is not split straight back inside the cooldown on the
    next ITL breach: that back and forth is what the cooldown exists to stop (bursts)."""
    planner = warmed(Planner(settings(cooldown_s=30)), layout(0, 0, 8))
    for i in range(8):
        planner._state.last_move[f"w{i}"] = 0.0
        planner._state.moved_for[f"w{i}"] = Condition.AGGREGATION_PAYS
    for t in (2.0, 4.0):
        decision = planner.step(mixing(layout(0, 0, 8)), t).decision(MODEL)
    assert decision is not None and decision.condition is Condition.DISAGGREGATION_PAYS and not decision.moves
    assert decision.held is not None and "cooldown" in decision.held


def test_an_itl_breach_of_both_workers_waits_for_the_estimates_in_the_first_window() -> None:
    """With a profile, the rules' move for all-``both`` workers missing the ITL (``decode_bound``: one worker to
    decode) waits until the load rates cover a window: it would restart the settling window that the sized split,
    possible a few seconds later, then waits out (in the evaluation from all-``both``, the split came 6-8 s later)."""
    planner = Planner(settings())
    for t in (0.0, 2.0, 4.0, 6.0, 8.0):
        early = planner.step(mixing(layout(0, 0, 8)), t).decision(MODEL)
        assert early is not None and early.condition is Condition.DECODE_BOUND and not early.moves
    assert early.held is not None and "estimates" in early.held and "8.0 of 10 s" in early.held
    covered = planner.step(mixing(layout(0, 0, 8)), 10.0).decision(MODEL)
    assert covered is not None and covered.condition is Condition.DISAGGREGATION_PAYS and covered.held == "hysteresis 1/2"
    sized = planner.step(mixing(layout(0, 0, 8)), 12.0).decision(MODEL)
    assert sized is not None and moves(sized) == [(B, D), (B, D), (B, P)]
    # a decode side that is full (KV, which the profile does not price) is not held: its move goes at once
    full = tuple(WorkerSignals(f"w{i}", MODEL, P if i == 0 else B, kv_usage=1.0, running_requests=10)
                 for i in range(8))
    planner = Planner(settings())
    planner.step(mixing(full, itl_ms=30.0), 0.0)
    kv = planner.step(mixing(full, itl_ms=30.0), 2.0).decision(MODEL)
    assert kv is not None and kv.condition is Condition.DECODE_BOUND and kv.pressures.decode_driver.value == "kv"
    assert moves(kv) == [(P, B)]
    # without a profile the rules act in the first window as they always do (nothing else would)
    planner = Planner(settings(profile=None))
    planner.step(mixing(layout(0, 0, 8)), 0.0)
    rules = planner.step(mixing(layout(0, 0, 8)), 2.0).decision(MODEL)
    assert rules is not None and rules.condition is Condition.DECODE_BOUND and moves(rules) == [(B, D)]


def test_near_the_splits_capacity_the_split_holding_the_slo_itself_is_sized_when_none_has_the_margins() -> None:
    """At 24 prompt-heavy requests/s 6P2D's prefill workers would be busy 92% of their time (over
    ``aggregate_busy_max``, 0.9), and no split of 8 has both margins; every worker ``both`` misses the ITL. The
    split that holds the SLO itself (busy under 1, ITL under 40 ms) is still the better layout: it is sized, not
    one worker per settling window (before: the sizing came and went with the window's rate, and the split waited)."""
    rate = 24.0
    assert sized_split(PROFILE, 8, rate * 4608.0, rate * 80.0, itl_target_ms=40, itl_margin=0.7, busy_max=0.9) is None
    planner = warmed(Planner(settings()), layout(0, 0, 8))
    first = planner.step(mixing(layout(0, 0, 8), rate=rate), 0.0).decision(MODEL)
    assert first is not None and first.condition is Condition.DISAGGREGATION_PAYS
    assert first.pressures.split_prefill == 6 and first.pressures.split_itl_ratio is not None
    assert first.pressures.split_itl_ratio < 1.0
    second = planner.step(mixing(layout(0, 0, 8), rate=rate), 2.0).decision(MODEL)
    assert second is not None and moves(second) == [(B, D), (B, D), (B, P)]
    # past what any split's prefill workers compute, still none
    assert planner.step(mixing(layout(0, 0, 8), rate=40.0), 4.0).decision(MODEL).pressures.split_prefill is None



def test_two_both_workers_missing_the_itl_go_to_one_prefill_and_one_decode_worker() -> None:
    """With two workers the only split is one prefill and one decode worker; the sizing's two-decode-worker guard
    (the decode side's KV, which the profile does not price) ruled it out, and two ``both`` workers mixing prompts
    into their decode steps missed the ITL SLO with no split sized (on real CPU workers, ``bench.planner_crossing``'s
    way back, the planner then held ``disaggregation_pays`` at ``split_prefill: null``)."""
    workers = layout(0, 0, 2)
    planner = warmed(Planner(settings()), workers)
    first = planner.step(mixing(workers, rate=2.0), 0.0).decision(MODEL)
    assert first is not None and first.condition is Condition.DISAGGREGATION_PAYS and not first.moves
    assert first.pressures.split_prefill == 1
    second = planner.step(mixing(workers, rate=2.0), 2.0).decision(MODEL)
    assert second is not None and moves(second) == [(B, D), (B, P)]
    # three workers or more keep two decode workers
    three = sized_split(PROFILE, 3, 2.0 * 4608.0, 2.0 * 80.0, itl_target_ms=40, itl_margin=0.7, busy_max=0.9)
    assert three is not None and three.decode >= 2

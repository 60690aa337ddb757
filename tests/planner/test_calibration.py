"""The engine profile checked against the ITL every-worker-``both`` layouts show (litellm_disagg/planner/calibration.py)
and the policy's use of the correction (policy.py). Pure.

The case it exists for: a profile that underprices mixing (measured 20-30% optimistic) crossed a prompt-heavy load to
``both`` and kept it there, its ITL at 1.5x the SLO while the estimate said 0.65x (docs/planner-evaluation.md, "A
profile measured wrong"): the burst guard of ``disaggregation_pays`` trusted the same estimate."""

from __future__ import annotations

import pytest

from litellm_disagg.planner import ClusterSignals, Condition, LatencyWindow, ModelSignals, Planner, PlannerSettings
from litellm_disagg.planner.calibration import mixing_correction, observed_factor
from litellm_disagg.planner.mixing import EngineProfile, aggregated_estimate
from litellm_disagg.planner.signals import WorkerSignals
from litellm_disagg.runtime_config import WorkerRole

from .test_policy_split_sized import layout
from .test_policy_split_sized import settings as split_settings

P, D, B = WorkerRole.PREFILL, WorkerRole.DECODE, WorkerRole.BOTH
MODEL = "m"
EXACT = EngineProfile(weight_read_ms=19.81, per_sequence_ms=0.19, prefill_tokens_per_s=20_000,
                      max_num_batched_tokens=2048)
# the optimistic error of the evaluation: weight read x0.8, cost per sequence x0.7, prefill rate x1.25
OPTIMISTIC = EngineProfile(weight_read_ms=19.81 * 0.8, per_sequence_ms=0.19 * 0.7, prefill_tokens_per_s=25_000,
                           max_num_batched_tokens=2048)


def test_the_factor_is_what_the_margin_did_not_cover() -> None:
    # an estimate held under 0.7 of the SLO allows a percentile up to estimate / 0.7
    assert observed_factor(30.0, 21.0, 0.7) == pytest.approx(1.0)
    assert observed_factor(60.0, 21.0, 0.7) == pytest.approx(2.0)
    assert observed_factor(15.0, 21.0, 0.7) == pytest.approx(0.5)


def test_the_correction_rises_at_once_falls_halfway_and_never_under_one() -> None:
    assert mixing_correction(1.0, 60.0, 21.0, 0.7) == pytest.approx(2.0)  # up at once
    assert mixing_correction(2.0, 36.0, 21.0, 0.7) == pytest.approx(1.6)  # factor 1.2: halfway from 2.0
    assert mixing_correction(1.2, 15.0, 21.0, 0.7) == pytest.approx(1.1)  # factor 0.5: halfway toward 1.0
    assert mixing_correction(1.0, 15.0, 21.0, 0.7) == 1.0
    # no percentile, or workers that would not keep up with their prompts (no finite estimate): unchanged
    assert mixing_correction(1.3, None, 21.0, 0.7) == 1.3
    assert mixing_correction(1.3, 60.0, None, 0.7) == 1.3
    # lowered at most once per window (the policy says when): up at once still
    assert mixing_correction(2.0, 15.0, 21.0, 0.7, may_lower=False) == 2.0
    assert mixing_correction(1.2, 60.0, 21.0, 0.7, may_lower=False) == pytest.approx(2.0)
    # a window of bursts (``may_raise`` False): never up, down as any other
    assert mixing_correction(1.2, 60.0, 21.0, 0.7, may_raise=False) == 1.2
    assert mixing_correction(1.2, 15.0, 21.0, 0.7, may_raise=False) == pytest.approx(1.1)


def settings(profile: EngineProfile | None, **kw: object) -> PlannerSettings:
    """The split tests' settings (a 40 ms ITL SLO, 10 s window) with a 30 s cooldown."""
    return split_settings(profile, **{"cooldown_s": 30, **kw})


def signals(workers: tuple[WorkerSignals, ...], itl_ms: float, rate: float = 20.0) -> ClusterSignals:
    """Prompt-heavy at ``rate`` requests/s (4,608-token prompts, 80-token answers), prompts keep arriving (prefill
    time 1.1 s against the 2 s TTFT SLO), the decode side's KV far from full."""
    return ClusterSignals((ModelSignals(MODEL, workers, ttft=LatencyWindow(1200, 50), itl=LatencyWindow(itl_ms, 50),
                                        prefill_time=LatencyWindow(1100, 50), prompt_tokens_per_s=rate * 4608.0,
                                        output_tokens_per_s=rate * 80.0),))


def warmed(planner: Planner, workers: tuple[WorkerSignals, ...]) -> Planner:
    """Seen for a whole window at a calm load, the ITL within the margin (no correction yet)."""
    planner.step(signals(workers, itl_ms=20.0, rate=2.0), -10.0)
    return planner


def test_all_both_over_the_itl_its_optimistic_estimate_calls_a_spread_is_corrected_and_split() -> None:
    workers = layout(0, 0, 8)
    raw = aggregated_estimate(OPTIMISTIC, 8, 20.0 * 4608, 20.0 * 80)
    assert raw.itl_ms is not None and raw.itl_ms < 0.85 * 40  # uncorrected: the burst guard would hold the split
    planner = warmed(Planner(settings(OPTIMISTIC)), workers)
    first = planner.step(signals(workers, itl_ms=64.0), 0.0).decision(MODEL)
    assert first is not None and first.pressures.mixing_correction == pytest.approx(64.0 * 0.7 / raw.itl_ms)
    assert first.pressures.aggregated_itl_ratio == pytest.approx(64.0 * 0.7 / 40)
    assert first.condition is Condition.DISAGGREGATION_PAYS
    second = planner.step(signals(workers, itl_ms=64.0), 2.0).decision(MODEL)
    assert second is not None and second.moves and {m.to_role for m in second.moves} <= {P, D}


def test_a_window_that_predates_the_last_move_is_no_evidence() -> None:
    """Within ``window_s`` of the model's last move the ITL window holds the old layout's requests: nothing is learnt,
    and the uncorrected estimate's burst guard holds the split (one worker per settling window at most)."""
    workers = layout(0, 0, 8)
    planner = warmed(Planner(settings(OPTIMISTIC)), workers)
    planner._state.models[MODEL].last_move_at = -1.0
    for t in (0.0, 2.0):
        decision = planner.step(signals(workers, itl_ms=64.0), t).decision(MODEL)
        assert decision is not None and decision.pressures.mixing_correction == 1.0
        assert decision.condition is not Condition.DISAGGREGATION_PAYS and len(decision.moves) <= 1


def test_only_a_settled_window_of_every_worker_both_is_evidence() -> None:
    # a split: the ITL is the decode workers', which the mixed-step estimate does not describe
    planner = warmed(Planner(settings(OPTIMISTIC)), layout(4, 4, 0))
    split = planner.step(signals(layout(4, 4, 0), itl_ms=64.0), 0.0).decision(MODEL)
    assert split is not None and split.pressures.mixing_correction == 1.0
    # part ``both``: the model's ITL mixes both kinds of worker
    planner = warmed(Planner(settings(OPTIMISTIC)), layout(2, 2, 4))
    part = planner.step(signals(layout(2, 2, 4), itl_ms=64.0), 0.0).decision(MODEL)
    assert part is not None and part.pressures.mixing_correction == 1.0
    # the first window after the model is first seen: no correction either
    first = Planner(settings(OPTIMISTIC)).step(signals(layout(0, 0, 8), itl_ms=64.0), 0.0).decision(MODEL)
    assert first is not None and first.pressures.mixing_correction == 1.0
    # no profile: nothing to correct, and the field says so
    none = warmed(Planner(settings(None)), layout(0, 0, 8)).step(signals(layout(0, 0, 8), itl_ms=64.0), 0.0)
    decision = none.decision(MODEL)
    assert decision is not None and decision.pressures.mixing_correction is None
    assert decision.pressures.as_fields()["mixing_correction"] is None


def test_an_exact_profile_at_its_own_load_is_not_corrected() -> None:
    """The simulated engine's own profile, all ``both`` at 20 prompt-heavy requests/s: the evaluation's windows showed
    an ITL p90 of 1.1-1.3x the SLO against an estimate of 0.9-1.0x: inside the margin."""
    workers = layout(0, 0, 8)
    raw = aggregated_estimate(EXACT, 8, 20.0 * 4608, 20.0 * 80)
    assert raw.itl_ms is not None
    planner = warmed(Planner(settings(EXACT)), workers)
    decision = planner.step(signals(workers, itl_ms=raw.itl_ms / 0.7 * 0.98), 0.0).decision(MODEL)
    assert decision is not None and decision.pressures.mixing_correction == 1.0


def test_workers_a_refuted_crossing_moved_into_both_skip_their_cooldown() -> None:
    """A crossing (``aggregation_pays``) whose estimate the ``both`` layout then refuted: the correction rose after the
    workers' move, and the split does not wait out their cooldown on a layout known to break the ITL. An unrefuted
    crossing keeps its cooldown (``test_workers_that_crossed_to_both_for_the_load_keep_their_cooldown``)."""
    workers = layout(0, 0, 8)
    planner = warmed(Planner(settings(OPTIMISTIC)), workers)
    for i in range(8):
        planner._state.last_move[f"w{i}"] = -20.0
        planner._state.moved_for[f"w{i}"] = Condition.AGGREGATION_PAYS
    planner._state.models[MODEL].last_move_at = -20.0
    first = planner.step(signals(workers, itl_ms=64.0), 0.0).decision(MODEL)
    assert first is not None and first.pressures.mixing_correction is not None
    assert first.pressures.mixing_correction > 1.0 and first.condition is Condition.DISAGGREGATION_PAYS
    second = planner.step(signals(workers, itl_ms=64.0), 2.0).decision(MODEL)
    assert second is not None and len(second.moves) == 3, second.held


def test_a_correction_outlives_the_layout_that_showed_it() -> None:
    """Once split, the model's windows say nothing of mixing: the correction stays, and the crossing back to
    ``both`` is judged on the corrected estimate."""
    workers = layout(0, 0, 8)
    planner = warmed(Planner(settings(OPTIMISTIC)), workers)
    planner.step(signals(workers, itl_ms=64.0), 0.0)
    later = planner.step(signals(layout(6, 2, 0), itl_ms=30.0), 40.0).decision(MODEL)
    assert later is not None and later.pressures.mixing_correction is not None
    assert later.pressures.mixing_correction > 1.5
    assert later.condition is not Condition.AGGREGATION_PAYS


def test_a_checked_profile_starts_the_planner_from_its_correction() -> None:
    """``profile --check-load`` writes the largest correction it found into the profile (``mixing_correction``): the
    planner's estimate is that much dearer from its first step, before any all-``both`` window; its own settled
    windows then move it as any other (down halfway at most once per window, up at once)."""
    checked = OPTIMISTIC.model_copy(update={"mixing_correction": 1.3})
    raw = aggregated_estimate(OPTIMISTIC, 8, 20.0 * 4608, 20.0 * 80)
    assert raw.itl_ms is not None
    first = Planner(settings(checked)).step(signals(layout(4, 4, 0), itl_ms=30.0), 0.0).decision(MODEL)
    assert first is not None and first.pressures.mixing_correction == 1.3
    assert first.pressures.aggregated_itl_ratio == pytest.approx(raw.itl_ms * 1.3 / 40)
    planner = warmed(Planner(settings(checked)), layout(0, 0, 8))
    calm = [planner.step(signals(layout(0, 0, 8), itl_ms=20.0), t).decision(MODEL) for t in (0.0, 2.0, 4.0)]
    # a window well within the margin: halfway toward 1.0, then not again over the same window's requests
    assert [d.pressures.mixing_correction for d in calm if d is not None] == pytest.approx([1.15, 1.15, 1.15])
    again = planner.step(signals(layout(0, 0, 8), itl_ms=20.0), 10.0).decision(MODEL)
    assert again is not None and again.pressures.mixing_correction == pytest.approx(1.075)
    hot = planner.step(signals(layout(0, 0, 8), itl_ms=64.0), 12.0).decision(MODEL)
    assert hot is not None and hot.pressures.mixing_correction == pytest.approx(64.0 * 0.7 / raw.itl_ms)


def test_a_bursts_window_never_raises_the_correction_and_may_lower_it() -> None:
    """Arrivals in bursts (the windowed prompt rate swinging 1.67x over the window, its mean the steady case's 20/s):
    the ITL percentile holds the bursts' steps, which no mean-rate estimate describes, so it does not raise the
    correction (``steadiness.py``). In the evaluation a bursty window raised it to 1.13, and the corrected estimate
    then split a load every worker as ``both`` served best (bursts from all-``both``, seed 1). The same ITL at a
    steady rate is corrected as before. A bursty window well within the margin still lowers it: its ITL is above what
    a steady load would show, so it shows mixing no dearer than that (in the evaluation's phase shifts, a correction
    of 1.28 from generation-heavy, never lowered by the bursts' windows, split the bursts at 11.8 req/s: 70% of them
    within the SLOs against 94%)."""
    workers = layout(0, 0, 8)
    raw = aggregated_estimate(OPTIMISTIC, 8, 20.0 * 4608, 20.0 * 80)
    assert raw.itl_ms is not None

    def run(rates: tuple[float, ...]) -> list:
        planner = Planner(settings(OPTIMISTIC))
        out = []
        for i, rate in enumerate(rates):
            out.append(planner.step(signals(workers, itl_ms=20.0 if i < 6 else 64.0, rate=rate), 2.0 * i))
        return [step.decision(MODEL) for step in out]

    bursty = run((15.0, 15.0, 25.0, 25.0, 15.0, 15.0, 15.0, 25.0, 25.0, 20.0))
    assert all(d is not None and d.pressures.mixing_correction == 1.0 for d in bursty)
    last = bursty[-1]
    assert last.pressures.load_swing == pytest.approx(25 / 15)
    assert last.pressures.as_fields()["load_swing"] == pytest.approx(25 / 15, abs=1e-4)
    # uncorrected, the estimate calls the breach a burst's spread: no worker moves at any step
    assert not any(d.moves for d in bursty) and last.held is not None and "burst's spread" in last.held
    steady = run((20.0,) * 10)
    assert steady[-1] is not None and steady[-1].pressures.load_swing == pytest.approx(1.0)
    assert steady[-1].pressures.mixing_correction == pytest.approx(64.0 * 0.7 / raw.itl_ms)
    # the threshold is the operator's: a planner told any swing is steady corrects the bursty window too
    loose = Planner(settings(OPTIMISTIC, steady_swing_max=10.0))
    rates = (15.0, 15.0, 25.0, 25.0, 15.0, 15.0, 15.0, 25.0, 25.0, 20.0)
    decisions = [loose.step(signals(workers, itl_ms=20.0 if i < 6 else 64.0, rate=r), 2.0 * i).decision(MODEL)
                 for i, r in enumerate(rates)]
    assert decisions[-1] is not None and decisions[-1].pressures.mixing_correction > 1.0

    # a bursty window within the margin lowers a correction (the profile checked to 1.3): halfway toward 1.0
    checked = OPTIMISTIC.model_copy(update={"mixing_correction": 1.3})
    planner = Planner(settings(checked))
    calm = [planner.step(signals(workers, itl_ms=20.0, rate=r), 2.0 * i).decision(MODEL) for i, r in enumerate(rates)]
    assert calm[-1] is not None and calm[-1].pressures.load_swing == pytest.approx(25 / 15)
    assert calm[-1].pressures.mixing_correction == pytest.approx(1.15)

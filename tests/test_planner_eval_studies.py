"""The planner evaluation's side studies (bench/planner_eval/sweep.py, startup.py) and the two workload knobs they use
(a segment's own request shape, a ramped start). The headline schedules must not change: the published figures are
reproduced from them."""

from __future__ import annotations

import pytest

from bench.planner_eval import goodput as goodput_mod
from bench.planner_eval import startup, sweep
from bench.planner_eval.cluster import ClusterConfig
from bench.planner_eval.goodput import SearchSettings
from bench.planner_eval.policies import Static
from bench.planner_eval.slo import Slo
from bench.planner_eval.workload import SHAPES, Segment, schedule
from litellm_disagg.runtime_config import WorkerRole


def test_the_headline_schedules_are_unchanged():
    # pinned from the schedule before the shape and ramp knobs existed (bench/planner_eval/workload.py at 8189ce0)
    a = schedule([Segment("bursts", 6.0, 30.0), Segment("prompt-heavy", 4.0, 10.0)], seed=3)
    assert len(a) == 268
    assert [(round(x.t, 6), x.prompt_tokens, x.output_tokens) for x in (a[0], a[50], a[-1])] == [
        (0.015098, 2027, 373), (2.746327, 1043, 279), (39.823394, 3075, 47)]


def test_a_segment_can_draw_another_shape_and_keeps_its_phase_label():
    shape = sweep.prompt_shape(1024)
    assert shape.prompt_tokens == (683, 1365)
    assert shape.output_tokens == SHAPES["prompt-heavy"].output_tokens
    arrivals = schedule([Segment("prompt-heavy", 20.0, 10.0, shape)], seed=0)
    assert arrivals and all(683 <= a.prompt_tokens <= 1365 for a in arrivals)
    assert {a.phase for a in arrivals} == {"prompt-heavy"}


def test_the_sweeps_headline_row_is_the_headline_phase():
    assert sweep.HEADLINE_PROMPT == 4608
    assert sweep.prompt_shape(sweep.HEADLINE_PROMPT) == SHAPES["prompt-heavy"]
    assert sweep.rows_of([2048, 4608], [30.0, 40.0], 40.0) == [(2048, 40.0), (4608, 40.0), (4608, 30.0)]
    assert sweep.rows_of([2048, 4608], [30.0, 40.0], 40.0, cross=True) == [
        (2048, 30.0), (4608, 30.0), (2048, 40.0), (4608, 40.0)]


def test_a_ramp_thins_the_first_seconds_only():
    flat = schedule([Segment("prompt-heavy", 40.0, 40.0)], seed=1)
    ramped = schedule([Segment("prompt-heavy", 40.0, 40.0, ramp_s=20.0)], seed=1)

    def count(arrivals, lo, hi):
        return sum(lo <= a.t < hi for a in arrivals)

    # the first quarter of a 20 s ramp averages 1/8 of the rate, the last quarter 7/8
    assert count(ramped, 0, 5) < 0.25 * count(flat, 0, 5)
    assert count(ramped, 15, 20) > 0.7 * count(flat, 15, 20)
    assert count(ramped, 20, 40) == pytest.approx(count(flat, 20, 40), rel=0.1)
    assert all(a.t >= 0.0 for a in ramped)


def test_goodput_probes_pass_the_shape_and_the_ramp_on(monkeypatch):
    seen: list[Segment] = []
    real = goodput_mod.schedule

    def spy(segments, seed=0):
        seen.extend(segments)
        return real(segments, seed=seed)

    monkeypatch.setattr(goodput_mod, "schedule", spy)
    shape = sweep.prompt_shape(2048)
    goodput_mod.measure("prompt-heavy", 4.0, lambda: Static(1, 1), ClusterConfig(workers=2), Slo(),
                        SearchSettings(duration_s=5.0, warmup_s=1.0, ramp_s=2.0), seed=0, shape=shape)
    assert seen == [Segment("prompt-heavy", 4.0, 5.0, shape, 2.0)]


def test_a_tiny_prompt_length_sweep():
    search = SearchSettings(duration_s=12.0, warmup_s=3.0, rel_tol=0.5)
    cells = sweep.run_sweep([(2048, 40.0)], [0], Slo(), ClusterConfig(workers=4), search)
    assert sorted(c.arm for c in cells) == ["1P3D", "2P2D", "3P1D", "aggregated"]
    assert all(c.rate > 0 for c in cells)
    for c in cells:
        if c.misses is not None:
            assert c.misses.rate > c.rate and 0.0 <= c.misses.ttft <= 1.0 and 0.0 <= c.misses.itl <= 1.0
    table = sweep.markdown(cells, [(2048, 40.0)], 4)
    assert "| 2,048 (1,365-2,731) | 40 ms |" in table


def test_a_scripted_move_moves_the_named_workers_once_at_its_time():
    policy = startup.ScriptedMove(["w2", "w3"], at_s=1.5, start=(2, 2))
    assert policy.initial_roles(4) == [WorkerRole.PREFILL] * 2 + [WorkerRole.DECODE] * 2
    assert policy.decide(None, 1.0) == ()  # type: ignore[arg-type]
    moves = policy.decide(None, 1.5)  # type: ignore[arg-type]
    assert [(m.worker_id, m.role) for m in moves] == [("w2", WorkerRole.PREFILL), ("w3", WorkerRole.PREFILL)]


def test_the_scripted_move_table_tries_every_pair_of_decode_workers():
    search = SearchSettings(duration_s=8.0, warmup_s=2.0)
    cells = startup.move_table([3.0], [1.0], 0, Slo(), ClusterConfig(workers=6), search)
    assert [c.workers for c in cells] == [("w3", "w4"), ("w3", "w5"), ("w4", "w5")]
    assert all(0.0 <= c.attainment <= 1.0 and c.preemptions >= 0 for c in cells)
    assert "3 of 3" in startup.move_markdown(cells, 0.0)

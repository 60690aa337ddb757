"""Decisions sized from the measured prefill demand (planner/trend.py): a k-worker shortfall moves k workers on the
second step, a steady load (noisy queue) moves nothing, and after a move the planner neither adds more nor moves back
while the backlog drains. Scripted signal sequences; pure, milliseconds."""

from __future__ import annotations

import json

from litellm_disagg.planner import ClusterSignals, Condition, LatencyWindow, ModelSignals, Planner, WorkerSignals
from litellm_disagg.planner.report import decision_fields
from litellm_disagg.planner.settings import PlannerSettings
from litellm_disagg.planner.trend import QueueHistory
from litellm_disagg.runtime_config import WorkerRole

P, D, B = WorkerRole.PREFILL, WorkerRole.DECODE, WorkerRole.BOTH
MODEL = "m"
RATE = 1000.0
"""One worker's prefill throughput, tokens/s."""


def settings(**kw: object) -> PlannerSettings:
    base: dict[str, object] = {"ttft_ms": 1000, "itl_ms": 50, "hysteresis_steps": 2, "cooldown_s": 20,
                               "min_samples": 1, "max_moves_per_step": 3, "window_s": 10, "interval_s": 2}
    return PlannerSettings.model_validate(base | kw)


def lat(ms: float | None) -> LatencyWindow:
    return LatencyWindow(ms, 20) if ms is not None else LatencyWindow()


def signals(roles: list[tuple[str, WorkerRole, WorkerRole | None]], queued: int, prefill_ms: float = 300,
            itl_ms: float = 20, kv: float = 0.3, rate: float | None = RATE) -> ClusterSignals:
    """``roles``: (id, role, pending role); the queue is spread over the prefill workers that serve now."""
    serving = [wid for wid, role, pending in roles if role.can_prefill and pending is None]
    workers = tuple(
        WorkerSignals(wid, MODEL, role, pending_role=pending,
                      queued_prefill_tokens=queued // len(serving) if wid in serving else 0,
                      kv_usage=kv if role is D else 0.0)
        for wid, role, pending in roles)
    model = ModelSignals(MODEL, workers, lat(prefill_ms), lat(itl_ms), prefill_tokens_per_s=rate,
                         prefill_time=lat(prefill_ms))
    return ClusterSignals((model,))


def split(ps: int, ds: int, pending: dict[str, WorkerRole] | None = None) -> list[tuple[str, WorkerRole,
                                                                                        WorkerRole | None]]:
    pending = pending or {}
    roles = [(f"p{i}", P) for i in range(ps)] + [(f"d{i}", D) for i in range(ds)]
    return [(wid, role, pending.get(wid)) for wid, role in roles]


def test_a_two_worker_shortfall_moves_two_workers_on_the_second_step() -> None:
    # 4 prefill workers at 1,000 tokens/s each; the queue grows 1,000 tokens/s: demand 5,000 tokens/s, plus the
    # 4,000 queued to clear within window_s: 5.4 workers -> 6 needed, 2 short
    # (decode KV 0.2: two decode workers fewer and the prefill output 1.5x leave it at 0.6, under full)
    planner = Planner(settings())
    first = planner.step(signals(split(4, 4), queued=2000, kv=0.2), now=0)
    assert first.moves == () and first.decisions[0].condition is Condition.STEADY  # wait 0.5 s: under the SLO
    step = planner.step(signals(split(4, 4), queued=4000, kv=0.2), now=2)
    d = step.decisions[0]
    assert d.condition is Condition.PREFILL_BOUND and d.pressures.prefill_needed == 6
    assert d.pressures.trend_ratio is not None and d.pressures.trend_ratio > 1.0   # (4,000 + 1,000 x 10) / 4,000
    assert d.pressures.queue_ratio == 1.0 and d.streak == 1       # no streak yet: the rising queue is the evidence
    assert [(m.from_role, m.to_role) for m in step.moves] == [(D, P), (D, P)]
    fields = decision_fields(d, None)
    assert fields["prefill_needed"] == 6.0 and fields["trend_ratio"] == d.pressures.trend_ratio
    json.dumps(fields)  # one JSON log line


def test_the_shortfall_is_capped_by_max_moves_and_the_decode_side() -> None:
    # the queue grows 4,000 tokens/s: 8 + 1 workers needed, 5 short; max_moves_per_step 3
    def moves(kv: float, cap: int = 3) -> int:
        planner = Planner(settings(max_moves_per_step=cap))
        planner.step(signals(split(4, 4), queued=2000, kv=kv), now=0)
        return len(planner.step(signals(split(4, 4), queued=10000, kv=kv), now=2).moves)

    assert moves(kv=0.1) == 3
    assert moves(kv=0.1, cap=2) == 2
    # decode KV at 0.45 (0.5 of full): two moves leave it at 1.0 on 2 workers, so one only
    assert moves(kv=0.45) == 1


def test_the_decode_side_is_sized_for_the_larger_prefill_output() -> None:
    # A load step: the queue empty at the first step, 8,000 tokens at the second (4,000 tokens/s of growth: 9
    # workers needed, 5 short, 3 allowed per step). The decode side is still filling (KV 0.2 of 0.9: 0.22 of full).
    # On its own numbers three decode workers could go (0.22 x 4 / 1 = 0.89 of full), but a growing queue means the
    # prefill pool computes at its full rate, so 7 prefill workers instead of 4 send the decode side 1.75x the
    # requests: 1.56 of full on one worker. Two moves leave it at 0.22 x 4 / 2 x 6 / 4 = 0.67.
    planner = Planner(settings())
    assert planner.step(signals(split(4, 4), queued=0, kv=0.2), now=0).moves == ()
    step = planner.step(signals(split(4, 4), queued=8000, kv=0.2), now=2)
    d = step.decisions[0]
    assert d.condition is Condition.PREFILL_BOUND and d.pressures.prefill_needed == 9
    assert [(m.from_role, m.to_role) for m in step.moves] == [(D, P), (D, P)]


def test_without_a_measured_rate_the_latency_ratio_sizes_the_move() -> None:
    planner = Planner(settings())
    planner.step(signals(split(4, 4), queued=2000, prefill_ms=1300, rate=None), now=0)
    step = planner.step(signals(split(4, 4), queued=4000, prefill_ms=1300, rate=None), now=2)
    assert step.decisions[0].pressures.prefill_needed is None
    assert len(step.moves) == 1  # ceil(4 x 0.3 / 4)


def test_a_steady_load_with_a_noisy_queue_moves_nothing() -> None:
    # 6 prefill workers (6,000 tokens/s) under ~5,000 tokens/s: the queue jumps around, never trends past the SLO
    planner = Planner(settings())
    queue = [300, 900, 200, 1200, 0, 600, 1500, 400, 800, 100] * 4
    moves = []
    trends = []
    for i, q in enumerate(queue):
        step = planner.step(signals(split(6, 2), queued=q, prefill_ms=450, itl_ms=25), now=2.0 * i)
        moves += step.moves
        trends.append(step.decisions[0].pressures.trend_ratio)
        assert step.decisions[0].condition is Condition.STEADY, (i, step.decisions[0])
    assert moves == []
    assert any(t is not None for t in trends) and max(t or 0.0 for t in trends) < 1.0  # measured, under the SLO


def test_after_a_sized_move_the_draining_backlog_asks_for_nothing_more() -> None:
    # the shortfall is found and covered at t=2; the flips take 2 s; the backlog then drains while the prefill-time
    # window still shows it (over the SLO for ~10 s): no further move, none back, in 60 s of steps
    planner = Planner(settings())
    script: list[tuple[float, list[tuple[str, WorkerRole, WorkerRole | None]], int, float]] = [
        (0, split(4, 4), 2000, 600),
        (2, split(4, 4), 4000, 900),
    ]
    seen = []
    for now, roles, queued, prefill_ms in script:  # decode KV 0.2: room for two workers fewer (see the first test)
        seen += planner.step(signals(roles, queued, prefill_ms, kv=0.2), now).moves
    assert sorted(m.worker_id for m in seen) == ["d0", "d1"]
    after = [(f"p{i}", P, None) for i in range(4)] + [("d0", D, P), ("d1", D, P), ("d2", D, None), ("d3", D, None)]
    moved = [(f"p{i}", P, None) for i in range(4)] + [("d0", P, None), ("d1", P, None), ("d2", D, None),
                                                     ("d3", D, None)]
    later = list(planner.step(signals(after, 5000, 1400), now=4).moves)   # flip in progress
    drain = [4500, 3500, 2500, 1500, 800, 300, 100, 0, 200, 0, 400, 100, 0, 300, 0, 100, 0, 200, 0, 100, 0, 0, 100, 0,
             300, 0, 100]
    for i, queued in enumerate(drain):
        now = 6.0 + 2 * i
        prefill_ms = 1500 if now < 16 else 400
        step = planner.step(signals(moved, queued, prefill_ms), now)
        later += step.moves
    assert later == []


def test_the_history_restarts_when_the_serving_layout_changes() -> None:
    history = QueueHistory()
    model = signals(split(4, 4), queued=1000).models[0]
    assert history.observe(model, 0, 10) is None
    grown = signals(split(4, 4), queued=3000).models[0]
    trend = history.observe(grown, 2, 10)
    assert trend is not None and trend.growth_tokens_per_s == 1000 and trend.rising_steps == 2
    # a worker joins the prefill side: the samples of the old layout are dropped
    assert history.observe(signals(split(5, 3), queued=4000).models[0], 4, 10) is None
    assert [s.t for s in history.samples] == [4]
    # samples older than the horizon are dropped too
    history.observe(signals(split(5, 3), queued=5000).models[0], 6, 10)
    history.observe(signals(split(5, 3), queued=6000).models[0], 20, 10)
    assert [s.t for s in history.samples] == [20]


def test_a_latency_window_over_the_slo_with_an_empty_queue_moves_nothing() -> None:
    # a burst that is over: the prefill-time window still shows it, the queue is empty
    planner = Planner(settings(hysteresis_steps=1))
    step = planner.step(signals(split(4, 4), queued=0, prefill_ms=1300), now=0)
    assert step.decisions[0].condition is Condition.PREFILL_BOUND and step.moves == ()
    assert "past backlog" in (step.decisions[0].held or "")
    # the same latency with a queue of 1.2 s: a move
    step = Planner(settings(hysteresis_steps=1)).step(signals(split(4, 4), queued=4800, prefill_ms=1300), now=0)
    assert len(step.moves) == 1


def test_a_full_decode_side_within_its_slos_keeps_a_busy_prefill_side() -> None:
    planner = Planner(settings(hysteresis_steps=1))
    step = planner.step(signals(split(6, 2), queued=600, prefill_ms=500, itl_ms=25, kv=0.99), now=0)
    d = step.decisions[0]
    assert d.condition is Condition.DECODE_BOUND and step.moves == () and "within their SLOs" in (d.held or "")
    # ITL near its SLO: the full decode side shows, a prefill worker goes to both (as before)
    step = Planner(settings(hysteresis_steps=1)).step(
        signals(split(6, 2), queued=600, prefill_ms=500, itl_ms=45, kv=0.99), now=0)
    assert [m.to_role for m in step.moves] == [B]

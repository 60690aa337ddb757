"""The policy changes from the simulated evaluation (docs/planner-evaluation.md): prefill pressure from the prefill
side's own evidence, idle prefill workers going to ``both`` when decode is the bottleneck, several moves when a
pressure is far above 1, and no move on a latency window that predates the last move. Pure, milliseconds."""

from __future__ import annotations

from dataclasses import replace

from litellm_disagg.planner import ClusterSignals, Condition, LatencyWindow, ModelSignals, Planner, WorkerSignals
from litellm_disagg.planner.policy import pressures
from litellm_disagg.planner.settings import PlannerSettings
from litellm_disagg.runtime_config import WorkerRole

P, D, B = WorkerRole.PREFILL, WorkerRole.DECODE, WorkerRole.BOTH
MODEL = "m"


def settings(**kw: object) -> PlannerSettings:
    base: dict[str, object] = {"ttft_ms": 1000, "itl_ms": 50, "hysteresis_steps": 1, "cooldown_s": 30,
                               "min_samples": 1, "max_moves_per_step": 3, "window_s": 10}
    return PlannerSettings.model_validate(base | kw)


def w(wid: str, role: WorkerRole, **kw: object) -> WorkerSignals:
    return WorkerSignals(wid, MODEL, role, **kw)  # type: ignore[arg-type]


def lat(ms: float | None) -> LatencyWindow:
    return LatencyWindow(ms, 20) if ms is not None else LatencyWindow()


def model(workers: list[WorkerSignals], ttft: float | None = None, itl: float | None = None,
          prefill_time: float | None = None) -> ModelSignals:
    return ModelSignals(MODEL, tuple(workers), lat(ttft), lat(itl), prefill_time=lat(prefill_time))


def split(ps: int, ds: int, bs: int = 0, **kw: object) -> list[WorkerSignals]:
    return ([w(f"p{i}", P) for i in range(ps)] + [w(f"d{i}", D, **kw) for i in range(ds)]
            + [w(f"b{i}", B) for i in range(bs)])


def test_ttft_inflated_by_decode_waits_is_not_prefill_pressure() -> None:
    # the evaluation's freeze: TTFT 3x its SLO because pulls wait for decode KV; the prefill's own time is short
    s = settings()
    full = split(6, 2, kv_usage=0.99)
    p = pressures(model(full, ttft=3000, itl=30, prefill_time=200), s)
    assert p.prefill == 0.2 and p.ttft_ratio == 3.0 and p.prefill_time_ratio == 0.2
    step = Planner(s).step(ClusterSignals((model(full, ttft=3000, itl=30, prefill_time=200),)), 0)
    assert step.decisions[0].condition is Condition.DECODE_BOUND
    assert [m.to_role for m in step.moves] == [B, B, B]
    # without a prefill-time window, TTFT is no prefill evidence while the decode side is full ...
    assert pressures(model(full, ttft=3000, itl=30), s).prefill == 0.0
    # ... and still is when it is not (an aggregated layout, or a collector that measures no prefill time)
    assert pressures(model(split(6, 2, kv_usage=0.3), ttft=3000, itl=30), s).prefill == 3.0


def test_decode_bound_with_idle_prefill_goes_aggregated() -> None:
    planner = Planner(settings())
    step = planner.step(ClusterSignals((model(split(2, 6), ttft=100, itl=80, prefill_time=100),)), 0)
    assert [(m.worker_id, m.to_role) for m in step.moves] == [("p0", B), ("p1", B), ("d0", B)]
    # prefill not idle (between aggregate_below and headroom): prefill workers go to decode, one per step
    step = Planner(settings()).step(ClusterSignals((model(split(2, 6), itl=60, prefill_time=500),)), 0)
    assert [(m.worker_id, m.to_role) for m in step.moves] == [("p0", D)]


def test_idle_prefill_joins_decode_before_decode_misses_its_slo() -> None:
    # decode at 0.8 of its SLO (above headroom 0.7), prefill at 0.1: decode_bound early, prefill -> both
    step = Planner(settings()).step(ClusterSignals((model(split(2, 6), itl=40, prefill_time=100),)), 0)
    assert step.decisions[0].condition is Condition.DECODE_BOUND
    assert {m.to_role for m in step.moves} == {B}
    # the same pressures in an aggregated layout: nothing to do
    step = Planner(settings()).step(ClusterSignals((model(split(0, 0, 8), itl=40, prefill_time=100),)), 0)
    assert step.decisions[0].condition is Condition.STEADY and step.moves == ()


def test_moves_grow_with_the_pressure_and_stop_at_the_decode_headroom() -> None:
    def moves(prefill_ms: float, kv: float | None = None, cap: int = 3) -> int:
        m = model(split(4, 4, kv_usage=kv), itl=10, prefill_time=prefill_ms)
        return len(Planner(settings(max_moves_per_step=cap)).step(ClusterSignals((m,)), 0).moves)

    assert moves(1200) == 1            # ceil(4 x 0.2 / 4)
    assert moves(3000) == 2            # ceil(4 x 2 / 4)
    assert moves(9000) == 3            # capped at max_moves_per_step
    assert moves(9000, cap=1) == 1
    assert moves(9000, kv=0.3) == 2    # a third move would leave 1 decode worker at KV 0.3 x 4 / 1 / 0.9 > headroom


def test_no_move_on_a_latency_window_that_predates_the_last_move() -> None:
    planner = Planner(settings(max_moves_per_step=1))
    hot = model(split(4, 4), itl=10, prefill_time=3000)
    assert len(planner.step(ClusterSignals((hot,)), 0).moves) == 1
    after = replace(hot, workers=tuple(split(5, 3)))
    step = planner.step(ClusterSignals((after,)), 5)
    assert step.moves == () and (step.decisions[0].held or "").startswith("settling")
    assert len(planner.step(ClusterSignals((after,)), 10).moves) == 1   # window_s later: fresh evidence

"""The way back from ``both`` (``mixing_costly``, docs/planner-evaluation.md "The way back from both"): prefill
workers that went to ``both`` at light load are split again when their mixed steps break the ITL SLO while prompts
keep arriving, and a growing prefill queue splits them before it takes decode workers. Scripted signal sequences
into the I/O-free core; pure, milliseconds."""

from __future__ import annotations

from litellm_disagg.planner import ClusterSignals, Condition, LatencyWindow, ModelSignals, Planner, WorkerSignals
from litellm_disagg.planner.policy import RoleMove, condition_of, pressures
from litellm_disagg.planner.settings import PlannerSettings
from litellm_disagg.runtime_config import WorkerRole

P, D, B = WorkerRole.PREFILL, WorkerRole.DECODE, WorkerRole.BOTH
MODEL = "m"
RATE = 20_000.0
"""One worker's prefill throughput, tokens/s."""


def settings(**kw: object) -> PlannerSettings:
    # the evaluation's knobs: defaults with its SLOs (TTFT 1 s, ITL 40 ms)
    base: dict[str, object] = {"ttft_ms": 1000, "itl_ms": 40, "min_samples": 1}
    return PlannerSettings.model_validate(base | kw)


def lat(ms: float | None) -> LatencyWindow:
    return LatencyWindow(ms, 20) if ms is not None else LatencyWindow()


def signals(roles: dict[str, WorkerRole], prefill_ms: float | None = None, itl_ms: float | None = None,
            kv: float = 0.05, queued: int = 0) -> ClusterSignals:
    """``roles``: worker id -> published role; ``queued`` prompt tokens spread over the workers that prefill."""
    prefilling = [wid for wid, role in roles.items() if role.can_prefill]
    workers = tuple(WorkerSignals(wid, MODEL, role, kv_usage=kv if role.can_decode else 0.0,
                                  queued_prefill_tokens=queued // len(prefilling) if wid in prefilling else 0)
                    for wid, role in roles.items())
    return ClusterSignals((ModelSignals(MODEL, workers, lat(prefill_ms), lat(itl_ms), prefill_tokens_per_s=RATE,
                                        prefill_time=lat(prefill_ms)),))


def start() -> dict[str, WorkerRole]:
    return {**{f"p{i}": P for i in range(4)}, **{f"d{i}": D for i in range(4)}}


def applied(roles: dict[str, WorkerRole], moves: tuple[RoleMove, ...]) -> dict[str, WorkerRole]:
    return {**roles, **{m.worker_id: m.to_role for m in moves}}


def light_start(planner: Planner) -> dict[str, WorkerRole]:
    """The ramp's first seconds: 4P4D idle, then light -> three prefill workers go to ``both`` at t = 4 s."""
    roles = start()
    assert planner.step(signals(roles), now=2).moves == ()
    step = planner.step(signals(roles, queued=2000), now=4)
    assert step.decisions[0].condition is Condition.LOW_LOAD
    assert [(m.worker_id, m.to_role) for m in step.moves] == [("p0", B), ("p1", B), ("p2", B)]
    return applied(roles, step.moves)


def test_both_workers_breaking_the_itl_slo_under_long_prompts_are_split_back_to_prefill() -> None:
    # the ramped start of docs/planner-evaluation.md: at 1P4D3B the prompts grow, the ITL window goes over its SLO
    # (the both workers mix prefill chunks into their decode steps), prefill is busy (0.5 of the TTFT SLO) and the
    # decode side's KV and batches are nearly empty. Before the fix this was an ITL-driven decode_bound that moved
    # the last prefill worker to decode (1P4D3B -> 0P5D3B -> 0P6D2B) and made the mixing worse.
    planner = Planner(settings())
    roles = light_start(planner)
    seen: list[tuple[float, str, WorkerRole, WorkerRole, Condition]] = []
    for now in range(6, 40, 2):
        mixing = any(r is B for r in roles.values())
        # the ITL window holds the mixed steps until window_s after the split, then the split layout's own ITL
        itl_ms = 52 if mixing or now < 24 else 25
        step = planner.step(signals(roles, prefill_ms=500, itl_ms=itl_ms, kv=0.05), now=now)
        assert step.decisions[0].condition is (Condition.MIXING_COSTLY if mixing else Condition.STEADY)
        seen += [(now, m.worker_id, m.from_role, m.to_role, m.condition) for m in step.moves]
        roles = applied(roles, step.moves)
    # one step, every both worker, once the latency window postdates the t = 4 s move (window_s 10 s); inside
    # their 20 s cooldown: they went to both under aggregate_below and leave on an ITL over its SLO
    assert seen == [(14, w, B, P, Condition.MIXING_COSTLY) for w in ("p0", "p1", "p2")]
    assert roles == start()
    assert not any(dst is D for _, _, _, dst, _ in seen)  # no prefill worker taken for decode


def test_hysteresis_holds_a_single_step_over_the_slo() -> None:
    planner = Planner(settings())
    roles = light_start(planner)
    for now in (6, 8, 10, 12):
        planner.step(signals(roles, prefill_ms=500, itl_ms=30), now=now)
    first = planner.step(signals(roles, prefill_ms=500, itl_ms=52), now=14)
    assert first.decisions[0].condition is Condition.MIXING_COSTLY
    assert first.moves == () and first.decisions[0].held == "hysteresis 1/2"
    calm = planner.step(signals(roles, prefill_ms=500, itl_ms=30), now=16)
    assert calm.moves == () and calm.decisions[0].condition is Condition.STEADY


def test_split_goes_to_decode_when_no_decode_worker_would_pull_or_the_decode_side_is_near_full() -> None:
    s = settings(hysteresis_steps=1)
    # 2P2B: a prefill worker beside only both workers gets no prompts (they serve theirs): to decode
    step = Planner(s).step(signals({"p0": P, "p1": P, "b0": B, "b1": B}, prefill_ms=500, itl_ms=52), now=0)
    assert step.decisions[0].condition is Condition.MIXING_COSTLY
    assert {(m.from_role, m.to_role) for m in step.moves} <= {(B, D)} and step.moves
    # 1P2D2B with decode KV at 0.6 (of 0.9): one worker fewer would reach headroom (0.6 / 0.9 x 4 / 3 = 0.89)
    roles = {"p0": P, "d0": D, "d1": D, "b0": B, "b1": B}
    step = Planner(s).step(signals(roles, prefill_ms=500, itl_ms=52, kv=0.6), now=0)
    assert step.decisions[0].condition is Condition.MIXING_COSTLY
    assert {(m.from_role, m.to_role) for m in step.moves} == {(B, D)}
    # ... with KV at 0.05 they go to prefill, both of them
    step = Planner(s).step(signals(roles, prefill_ms=500, itl_ms=52), now=0)
    assert [(m.worker_id, m.to_role) for m in step.moves] == [("b0", P), ("b1", P)]


def test_not_mixing_when_the_decode_side_is_full_prefill_idle_or_all_aggregated() -> None:
    s = settings()
    mixed = {"p0": P, "d0": D, "b0": B}

    def condition(roles: dict[str, WorkerRole], **kw: object) -> Condition:
        model = signals(roles, **kw).models[0]  # type: ignore[arg-type]
        both = any(r is B for r in roles.values())
        return condition_of(pressures(model, s), s, disaggregated=any(r is not B for r in roles.values()),
                            aggregated_workers=both)

    assert condition(mixed, prefill_ms=500, itl_ms=52) is Condition.MIXING_COSTLY
    # decode KV at 0.7 of full (0.63 / 0.9): the ITL may be its batches: the decode_bound/overloaded rows decide
    assert condition(mixed, prefill_ms=500, itl_ms=52, kv=0.63) is not Condition.MIXING_COSTLY
    # prefill nearly idle: nothing is mixed in, the ITL is decode work (idle prefill workers join decode as both)
    assert condition(mixed, prefill_ms=100, itl_ms=52) is Condition.DECODE_BOUND
    # every worker both: nothing to split back into, the earlier rows decide (as before)
    assert condition({"b0": B, "b1": B}, prefill_ms=500, itl_ms=52) is Condition.DECODE_BOUND
    # no both worker: no mixing
    assert condition({"p0": P, "d0": D}, prefill_ms=500, itl_ms=52) is Condition.DECODE_BOUND


def test_a_growing_prefill_queue_splits_both_workers_before_taking_decode_workers() -> None:
    # the same light start, then the long prompts arrive faster than 1P3B prefills them: the queue rises at each
    # step (the trend is the evidence: no streak, and no settling window after the low_load move), and the both
    # workers go to prefill first, inside their cooldown, before any decode worker
    planner = Planner(settings())
    roles = light_start(planner)
    step = planner.step(signals(roles, prefill_ms=600, itl_ms=20, queued=120_000), now=6)
    d = step.decisions[0]
    assert d.condition is Condition.PREFILL_BOUND and d.streak == 1
    assert d.pressures.prefill_needed == 7   # 4 x 20k + 30k growth + 12k backlog tokens/s over 20k: 6.1
    assert [(m.worker_id, m.from_role, m.to_role) for m in step.moves] == [
        ("p0", B, P), ("p1", B, P), ("p2", B, P)]


def test_the_itl_window_of_the_mixed_layout_does_not_block_the_split_layout() -> None:
    # after every both worker was split, the ITL window still holds the mixed steps for window_s: it is left out
    # of the decode pressure, so a growing prefill queue reads as prefill_bound (a move), not as overloaded
    planner = Planner(settings())
    roles = light_start(planner)
    for now in range(6, 16, 2):
        roles = applied(roles, planner.step(signals(roles, prefill_ms=500, itl_ms=52), now=now).moves)
    assert roles == start()
    planner.step(signals(roles, prefill_ms=900, itl_ms=60, queued=60_000), now=16)
    step = planner.step(signals(roles, prefill_ms=1200, itl_ms=60, queued=160_000), now=18)
    d = step.decisions[0]
    assert d.pressures.itl_ratio is None and d.condition is Condition.PREFILL_BOUND
    assert step.moves and all((m.from_role, m.to_role) == (D, P) for m in step.moves)
    # once the window postdates the split, the ITL counts again
    later = planner.step(signals(roles, prefill_ms=500, itl_ms=60), now=30).decisions[0]
    assert later.pressures.itl_ratio == 1.5


def test_a_burst_does_not_split_back_what_the_decode_side_asked_for_inside_its_cooldown() -> None:
    # bursts (docs/planner-evaluation.md, "Bursts: no split back inside the cooldown"): between two bursts prefill is
    # nearly idle while the ITL nears its SLO on 6P2D, so three idle prefill workers join the decode side as both
    # (decode_bound). The next burst's mixed steps push the ITL window over its SLO: mixing_costly. Before the fix
    # it split them back at once (t = 28 s, inside their cooldown), and the next quiet period moved them to both
    # again: a flip-flop with the burst period. A move into both that the decode side asked for keeps its cooldown.
    planner = Planner(settings())
    roles = {**{f"p{i}": P for i in range(6)}, "d0": D, "d1": D}
    quiet = {"prefill_ms": 190, "itl_ms": 35.6}   # prefill 0.19 (< aggregate_below), ITL 0.89 (>= headroom)
    assert planner.step(signals(roles, **quiet), now=16).moves == ()
    step = planner.step(signals(roles, **quiet), now=18)
    assert step.decisions[0].condition is Condition.DECODE_BOUND
    assert [(m.worker_id, m.from_role, m.to_role) for m in step.moves] == [(w, P, B) for w in ("p0", "p1", "p2")]
    roles = applied(roles, step.moves)
    seen: list[tuple[float, str, WorkerRole, WorkerRole]] = []
    for now in range(20, 40, 2):
        step = planner.step(signals(roles, prefill_ms=700, itl_ms=42), now=now)   # the burst: busy, ITL 1.05
        assert step.decisions[0].condition is Condition.MIXING_COSTLY
        if 28 <= now < 38:   # past the settling window, inside the cooldown
            assert step.moves == () and step.decisions[0].held == "no movable worker: cooldown"
        seen += [(now, m.worker_id, m.from_role, m.to_role) for m in step.moves]
        roles = applied(roles, step.moves)
    # the cooldown over (20 s after the move), a breach that outlasted it splits them back
    assert seen == [(38, w, B, P) for w in ("p0", "p1", "p2")]

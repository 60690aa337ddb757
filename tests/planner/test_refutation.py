"""A crossing to aggregated serving decided on the TTFT that its first tokens refuted (``planner/refutation.py``):
back to the split it came from, and no crossing again at that load.

Before it, a split missing its TTFT SLO whose estimate said ``both`` would hold crossed, and when every worker
``both`` missed the TTFT too (on two real CPU workers: 12.5 s over a 9.9 s SLO before, 18 s after) nothing led
back: ``prefill_bound`` has no move from an all-``both`` layout, and the ITL, which the estimate prices, held."""

from __future__ import annotations

from litellm_disagg.planner import ClusterSignals, Condition, LatencyWindow, ModelSignals, Planner, PlannerSettings
from litellm_disagg.planner.mixing import EngineProfile
from litellm_disagg.planner.refutation import TtftRefutation
from litellm_disagg.planner.signals import WorkerSignals
from litellm_disagg.runtime_config import WorkerRole

P, D, B = WorkerRole.PREFILL, WorkerRole.DECODE, WorkerRole.BOTH
MODEL = "m"
PROFILE = EngineProfile(weight_read_ms=19.81, per_sequence_ms=0.19, prefill_tokens_per_s=20_000,
                        max_num_batched_tokens=512)
RATE = 6.5  # prompt-heavy requests/s (4,608-token prompts, 80-token answers): two `both` workers hold the ITL


def settings(**kw: object) -> PlannerSettings:
    base: dict[str, object] = {"ttft_ms": 1000, "itl_ms": 40, "hysteresis_steps": 2, "cooldown_s": 60,
                               "min_samples": 1, "max_moves_per_step": 3, "window_s": 10, "engine_profile": PROFILE}
    return PlannerSettings.model_validate(base | kw)


def signals(workers: tuple[WorkerSignals, ...], prefill_ms: float, rate: float = RATE) -> ClusterSignals:
    """The ITL well within its SLO; the prefill time ``prefill_ms`` against the 1 s TTFT SLO."""
    return ClusterSignals((ModelSignals(MODEL, workers, ttft=LatencyWindow(prefill_ms + 100, 50),
                                        itl=LatencyWindow(25, 50), prefill_time=LatencyWindow(prefill_ms, 50),
                                        prompt_tokens_per_s=rate * 4608.0, output_tokens_per_s=rate * 80.0),))


class Run:
    """A planner stepped every 2 s, its moves applied at once; the prefill time each layout shows is the test's."""

    def __init__(self, planner: Planner, workers: tuple[WorkerSignals, ...]):
        self.planner, self.workers, self.t = planner, workers, 0.0
        self.log: list[tuple[float, Condition, list[tuple[WorkerRole, WorkerRole]], bool]] = []

    def roles(self) -> list[WorkerRole]:
        return sorted((w.role for w in self.workers), key=lambda r: r.value)

    def step(self, prefill_ms: float, rate: float = RATE):
        decision = self.planner.step(signals(self.workers, prefill_ms, rate), self.t).decision(MODEL)
        assert decision is not None
        to = {m.worker_id: m.to_role for m in decision.moves}
        self.log.append((self.t, decision.condition, [(m.from_role, m.to_role) for m in decision.moves],
                         decision.pressures.aggregation_refuted))
        self.workers = tuple(WorkerSignals(w.worker_id, MODEL, to.get(w.worker_id, w.role)) for w in self.workers)
        self.t += 2.0
        return decision

    def cross(self, split_ms: float = 1600.0) -> None:
        """The split (TTFT p90 1.6x its SLO) crosses to every worker ``both`` on the estimate."""
        while any(w.role is not B for w in self.workers):
            assert self.t <= 10.0, self.log
            self.step(split_ms)
        assert {c for _, c, moves, _ in self.log if moves} == {Condition.AGGREGATION_PAYS}


def split_1p1d() -> tuple[WorkerSignals, ...]:
    return (WorkerSignals("w0", MODEL, P), WorkerSignals("w1", MODEL, D))


def test_a_crossing_whose_first_tokens_got_no_better_goes_back_to_its_split_and_stays_there() -> None:
    run = Run(Planner(settings()), split_1p1d())
    run.cross()
    crossed_at = run.t - 2.0
    # every worker ``both`` now misses the TTFT by more than the split did, window after window; the ITL holds
    while run.roles() == [B, B]:
        assert run.t <= crossed_at + 30.0, run.log      # settled (10 s), two readings a window apart, then back
        decision = run.step(2000.0)
    assert decision.condition is Condition.AGGREGATION_REFUTED and decision.pressures.aggregation_refuted
    assert {(m.from_role, m.to_role) for m in decision.moves} == {(B, D), (B, P)}
    assert run.t - 2.0 - crossed_at < settings().cooldown_s              # inside the crossing's cooldown
    assert run.roles() == [D, P]
    # the split misses its TTFT again at the same load, the estimate still says ``both`` would hold: no crossing
    for _ in range(40):
        decision = run.step(1600.0)
        assert decision.condition is not Condition.AGGREGATION_PAYS and decision.pressures.aggregation_refuted
    assert run.roles() == [D, P]


def test_a_crossing_that_shortened_the_first_tokens_wait_stays() -> None:
    run = Run(Planner(settings()), split_1p1d())
    run.cross()
    for _ in range(20):
        decision = run.step(800.0)
        assert not decision.moves and not decision.pressures.aggregation_refuted
    assert run.roles() == [B, B]


def test_one_better_window_is_no_verdict_two_worse_ones_after_it_refute() -> None:
    """On real CPU workers a window of five first tokens read 1.19x the SLO against the split's 1.55x, and the next
    1.68x: one reading ended the check then. Ending it takes two better readings in a row, as refuting takes two."""
    run = Run(Planner(settings()), split_1p1d())
    run.cross()
    crossed_at = run.t - 2.0
    while run.t <= crossed_at + 14.0:            # the first settled reading (10-12 s after the move): better
        decision = run.step(1200.0)
        assert not decision.moves
    while run.roles() == [B, B]:
        assert run.t <= crossed_at + 50.0, run.log
        decision = run.step(2000.0)
    assert decision.condition is Condition.AGGREGATION_REFUTED and run.roles() == [D, P]


def test_a_backlog_draining_after_the_crossing_is_not_a_refutation() -> None:
    """The split's backlog drains on the ``both`` workers: the first settled window's first tokens waited longer
    than the split's did, the next window's less, and so on. A one-window check refuted such a crossing in the
    simulated evaluation (prompt-heavy goodput 15.8-27.5 requests/s against 27.0-27.5)."""
    run = Run(Planner(settings()), split_1p1d())
    run.cross()
    for i in range(30):
        decision = run.step(max(900.0, 2400.0 - 40.0 * i))              # falling a little at every step
        assert not decision.moves and not decision.pressures.aggregation_refuted, run.log
    assert run.roles() == [B, B]


def test_a_clearly_lighter_load_may_cross_again() -> None:
    run = Run(Planner(settings()), split_1p1d())
    run.cross()
    while run.roles() == [B, B]:
        run.step(2000.0)
    assert run.step(1600.0).pressures.aggregation_refuted
    # the load falls to under 1/1.5 (steady_swing_max) of the refuted one while the split still misses its TTFT
    decision = run.step(1600.0, rate=RATE / 2)
    assert not decision.pressures.aggregation_refuted
    for _ in range(2):
        decision = run.step(1600.0, rate=RATE / 2)
    assert decision.condition is Condition.AGGREGATION_PAYS


def test_only_a_crossing_for_the_prefill_side_at_an_unchanged_load_is_checked() -> None:
    swing, w = 1.5, {"window_s": 10.0}
    # decided on the decode side (prefill under 1): the mixing correction checks it, not this
    check = TtftRefutation()
    check.crossed(0.6, 1000.0, (6, 2))
    assert not check.settled(1.4, 1000.0, swing, now=0.0, **w) and not check.settled(1.4, 1000.0, swing, now=10.0, **w)
    assert check.back_to is None
    # the prompt rate doubled since the crossing: another load, no reading either way; back at the crossing's, the
    # check goes on
    check.crossed(1.3, 1000.0, (6, 2))
    for t in (0.0, 10.0, 20.0):
        assert not check.settled(1.8, 2000.0, swing, now=t, **w)
    assert not check.blocks and check.pending is not None
    assert not check.settled(1.8, 1000.0, swing, now=30.0, **w) and check.settled(1.8, 1000.0, swing, now=40.0, **w)
    # a zero or unmeasured rate is no lighter load (a few requests a minute: a 10 s window often holds no arrival)
    check.lighter(0.0, swing)
    check.lighter(100.0, swing, measured=False)
    assert check.blocks
    check.lighter(100.0, swing)
    assert not check.blocks and check.refuted_rate is None
    # another condition's move ends the check: the layout is no longer the crossing's
    check.crossed(1.3, 1000.0, (6, 2))
    check.moved()
    assert not check.settled(1.8, 1000.0, swing, now=0.0, **w) and not check.settled(1.8, 1000.0, swing, now=10.0, **w)
    # an unmeasured prefill side waits; measured, two readings a window apart no better than the split refute, once
    check.crossed(1.3, 1000.0, (6, 2))
    assert not check.settled(None, 1000.0, swing, now=0.0, **w) and check.pending is not None
    assert not check.settled(1.3, 1100.0, swing, now=0.0, **w)
    assert not check.settled(1.2, 1100.0, swing, now=5.0, **w)          # not a window later: not a reading
    assert check.settled(1.3, 1100.0, swing, now=10.0, **w) and check.pending is None
    check.lighter(5000.0, swing)                                        # a higher or unknown load: still off
    check.lighter(None, swing)
    assert check.blocks
    # the way back fits the crossing's split to the workers there are now
    assert check.way_back(8, 8) == (6, 2)
    assert check.way_back(4, 3) == (3, 1)
    assert check.way_back(8, 0) is None and check.back_to is None        # every worker back: over

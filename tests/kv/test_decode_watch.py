"""Each request's decode worker timed from the proxy (first token per path, inter-token gaps with and without a local
prefill there), fed back into the remote-or-local cost model; and ``decode_time_weight`` fitted from the gaps."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from litellm_disagg.routing.kv.decode_watch import DecodeWatch
from litellm_disagg.routing.kv.disagg_decision import DisaggDecider, DisaggInputs
from litellm_disagg.routing.kv.router import KVRouter
from litellm_disagg.routing.kv.settings import DisaggDecisionSettings, KVRoutingSettings
from litellm_disagg.routing.kv.stall_fit import StallFit
from litellm_disagg.routing.route_plan import RoutePlan
from litellm_disagg.runtime_config import WorkerRole
from tests.kv.helpers import worker


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@dataclass
class _Observer:
    seen: list[tuple[bool, int, float, int]] = field(default_factory=list)
    gaps: list[tuple[float, bool]] = field(default_factory=list)

    def observe_first_token(self, *, local: bool, tokens: int, seconds: float, queued_tokens: int = 0) -> None:
        self.seen.append((local, tokens, seconds, queued_tokens))

    def observe_decode_gap(self, seconds: float, *, during_prefill: bool) -> None:
        self.gaps.append((seconds, during_prefill))


def _warm(watch: DecodeWatch, worker_id: str, prefill_worker_id: str | None = None) -> None:
    """One call to the worker (over the pair) answered: its later calls are observed."""
    watch.dispatched("warm-up", local=prefill_worker_id is None, tokens=1, worker_id=worker_id,
                     prefill_worker_id=prefill_worker_id)
    watch.chunk("warm-up")
    watch.ended("warm-up")


def test_the_first_chunk_times_the_first_token_later_ones_the_gaps() -> None:
    clock, observer = _Clock(), _Observer()
    watch = DecodeWatch(observer, clock=clock)
    _warm(watch, "d1")
    watch.chunk("unknown")  # not dispatched through the KV router: nothing
    watch.dispatched("a", local=True, tokens=150, queued_tokens=40, worker_id="d1")
    watch.dispatched("b", local=False, tokens=790, worker_id="d1")
    clock.now += 1.5
    watch.chunk("a")
    clock.now += 0.5
    watch.chunk("b")
    assert observer.seen == [(True, 150, 1.5, 40), (False, 790, 2.0, 0)]
    clock.now += 0.25
    watch.chunk("a")
    assert observer.gaps == [(0.75, False)]
    watch.dispatched("c", local=True, tokens=10, worker_id="d1")
    watch.ended("c")  # not streamed: no first token to time
    watch.chunk("c")
    assert len(observer.seen) == 2 and len(watch) == 2
    watch.ended("a")
    watch.ended("b")
    assert len(watch) == 0


def test_a_first_call_to_a_worker_or_over_a_pair_is_not_observed() -> None:
    """A decode worker's first calls, and a remote request's first over its prefill-decode pair, pay one-off costs
    (the proxy's first call to a deployment, the pair's NIXL handshake): observed, they priced their path 10x too high
    (measured: 0.28 s remote tail from 4 warm-up requests, then 0% remote)."""
    clock, observer = _Clock(), _Observer()
    watch = DecodeWatch(observer, clock=clock)
    watch.dispatched("cold-1", local=False, tokens=600, worker_id="d1", prefill_worker_id="p1")
    watch.dispatched("cold-2", local=True, tokens=600, worker_id="d1")  # sent before d1 answered anything: cold too
    assert watch.prefilling("d1") == 1  # a cold call still prefills there
    clock.now += 0.3
    watch.chunk("cold-1")
    watch.chunk("cold-2")
    assert observer.seen == [] and watch.cold_calls == 2
    assert watch.prefilling("d1") == 0
    clock.now += 0.1
    watch.chunk("cold-1")  # its gaps are observed
    assert observer.gaps == [(pytest.approx(0.1), False)]
    watch.dispatched("local", local=True, tokens=100, worker_id="d1")  # d1 has answered: warm
    watch.dispatched("same-pair", local=False, tokens=100, worker_id="d1", prefill_worker_id="p1")
    watch.dispatched("new-pair", local=False, tokens=100, worker_id="d1", prefill_worker_id="p2")  # p2 -> d1: cold
    clock.now += 0.05
    for call in ("local", "same-pair", "new-pair"):
        watch.chunk(call)
    assert observer.seen == [(True, 100, pytest.approx(0.05), 0), (False, 100, pytest.approx(0.05), 0)]
    watch.dispatched("p2-warm", local=False, tokens=100, worker_id="d1", prefill_worker_id="p2")
    clock.now += 0.05
    watch.chunk("p2-warm")
    assert len(observer.seen) == 3 and watch.cold_calls == 3


def test_a_gap_is_marked_when_its_worker_prefilled_a_prompt_within_it() -> None:
    clock, observer = _Clock(), _Observer()
    watch = DecodeWatch(observer, clock=clock)
    watch.dispatched("running", local=False, tokens=100, worker_id="d1")
    watch.dispatched("elsewhere", local=False, tokens=100, worker_id="d2")
    clock.now += 0.1
    watch.chunk("running")
    watch.chunk("elsewhere")
    clock.now += 0.1
    watch.dispatched("new", local=True, tokens=500, worker_id="d1")  # d1 prefills a prompt itself
    assert watch.prefilling("d1") == 1 and watch.prefilling("d2") == 0
    clock.now += 0.1
    watch.chunk("running")  # the prefill is under way: marked
    watch.chunk("elsewhere")  # another worker: not marked
    clock.now += 0.6
    watch.chunk("new")  # the prefill's first token ...
    watch.chunk("running")  # ... ends in the same step as this gap: marked, whichever chunk the proxy saw first
    clock.now += 0.1
    watch.chunk("running")  # after the prefill: not marked
    assert observer.gaps == [(pytest.approx(0.2), True), (pytest.approx(0.2), False), (pytest.approx(0.6), True),
                             (pytest.approx(0.1), False)]
    assert watch.prefilling("d1") == 0


def test_a_retry_replaces_its_attempt_and_entries_are_bounded() -> None:
    clock, observer = _Clock(), _Observer()
    watch = DecodeWatch(observer, clock=clock, max_age_s=60, max_entries=3)
    _warm(watch, "d1")
    watch.dispatched("a", local=True, tokens=100, worker_id="d1")
    clock.now += 5
    watch.dispatched("a", local=False, tokens=100, worker_id="d1")  # the retry went remote
    assert watch.prefilling("d1") == 0
    clock.now += 1
    watch.chunk("a")
    assert observer.seen == [(False, 100, 1.0, 0)]
    for i in range(5):
        watch.dispatched(f"x{i}", local=True, tokens=1, worker_id="d1")
    assert len(watch) == 1 + 3 and watch.prefilling("d1") == 3  # the stream of "a" and the 3 newest
    watch.chunk("x0")  # dropped, oldest first
    assert len(observer.seen) == 1
    clock.now += 61
    watch.chunk("x4")  # its first token came too late to be this request's (a lost end event): not observed
    assert len(observer.seen) == 1


@pytest.mark.parametrize("local", [True, False])
async def test_the_kv_router_feeds_the_path_the_request_took(local: bool) -> None:
    clock = _Clock()
    router = KVRouter(KVRoutingSettings.model_validate({"enabled": True}), clock=clock)
    decode = worker("d", role=WorkerRole.DECODE)
    inputs = DisaggInputs(prompt_tokens=790, decode_cached_tokens=640, decode_queued_tokens=60)
    plan = RoutePlan(decode, (), "local", "local", decision_inputs=inputs)
    router.observe(plan, None if local else "p", None if local else 0.8, call_id="cold")  # first call: not observed
    router.decode_watch.chunk("cold")
    router.decode_watch.ended("cold")
    router.observe(plan, None if local else "p", None if local else 0.8, call_id="call-1")
    router.observe(plan, None if local else "p", None)  # no call id (a caller that does not know it): nothing awaited
    clock.now += 1.6
    router.decode_watch.chunk("call-1")
    estimates = router.decider.estimates()
    if local:
        assert (estimates.local_observations, estimates.remote_tail_observations) == (1, 0)
        assert estimates.local is not None and estimates.local.seconds(150 + 60) == pytest.approx(1.6)
    else:
        assert (estimates.local_observations, estimates.remote_tail_observations) == (0, 1)
        assert estimates.remote_tail is not None and estimates.remote_tail.seconds(150) == pytest.approx(1.6)
    clock.now += 0.1
    router.decode_watch.chunk("call-1")
    assert router.decider.stall.observations == 1
    await router.stop()


# -- decode_time_weight from the gaps ----------------------------------------------------------------------------------


def test_stall_fit_needs_both_kinds_of_gap_then_measures_the_delay_share() -> None:
    fit = StallFit(min_gaps=5)
    for _ in range(10):
        fit.observe(0.1, during_prefill=False)
    assert fit.estimate().weight is None  # no gap during a prefill yet: the prior rules
    for _ in range(4):
        fit.observe(0.4, during_prefill=True)
    assert fit.estimate().weight is None
    fit.observe(0.4, during_prefill=True)
    assert fit.estimate().weight == pytest.approx(0.75)  # a quarter of the tokens while prefilling
    same = StallFit(min_gaps=1)
    same.observe(0.1, during_prefill=False)
    same.observe(0.09, during_prefill=True)
    assert same.estimate().weight == 0.0  # prefills do not slow decoding: no charge
    same.observe(float("nan"), during_prefill=True)
    same.observe(-1.0, during_prefill=True)
    assert same.observations == 2


def test_a_decider_with_measured_stall_prices_local_prefill_by_it() -> None:
    held = DisaggInputs(prompt_tokens=790, decode_cached_tokens=640, prefill_cached_tokens=640, decode_running=3)
    prior = DisaggDecider(DisaggDecisionSettings(stall_min_gaps=5))
    assert prior.decide(held).remote  # the prior weight (1 per running request) sends it away
    fed = DisaggDecider(DisaggDecisionSettings(stall_min_gaps=5))
    off = DisaggDecider(DisaggDecisionSettings(stall_min_gaps=5, fit_decode_time_weight=False))
    for d in (fed, off):
        for _ in range(20):  # measured: a local prefill barely slows the streams on its worker
            d.observe_decode_gap(0.100, during_prefill=False)
            d.observe_decode_gap(0.105, during_prefill=True)
    weight, fitted = fed.decode_time_weight()
    assert fitted and weight == pytest.approx(1 - 0.1 / 0.105)
    assert fed.estimates().decode_time_weight == pytest.approx(weight)
    assert not fed.decide(held).remote
    assert off.decode_time_weight() == (1.0, False) and off.decide(held).remote


async def test_the_kv_router_tells_the_decider_which_path_each_priced_request_took() -> None:
    """Requests sent one way in a row age the other way's lines (``DisaggDecider.dispatched``); an unpriced plan
    (not splittable: no decision inputs) is not counted."""
    router = KVRouter(KVRoutingSettings.model_validate({"enabled": True}), clock=_Clock())
    decode = worker("d", role=WorkerRole.DECODE)
    priced = RoutePlan(decode, (), "local", "local", decision_inputs=DisaggInputs(prompt_tokens=790))
    router.decider.observe_first_token(local=True, tokens=790, seconds=0.5)
    fitted = router.decider.estimates().local
    for _ in range(3):
        router.observe(priced, "p", 0.08)
    router.observe(RoutePlan(decode, (), "not splittable", "not splittable"), "p", None)
    streak = router.decider.estimates().streak
    assert streak is not None and (streak.remote, streak.requests) == (True, 3)
    assert router.decider.estimates().local != fitted  # three remote requests: the local line moved toward its prior
    router.observe(priced, None, None)
    streak = router.decider.estimates().streak
    assert streak is not None and (streak.remote, streak.requests) == (False, 1)
    assert router.decider.estimates().local == fitted
    await router.stop()

"""The decision's measurements pooled between proxy replicas (``routing/kv/shared_estimates.py``): pooled moments fit
as all the replicas' observations together, a hostile entry never counts, and over a real Redis each replica's
decisions use the others' measurements."""

from __future__ import annotations

import json
import logging
from unittest.mock import MagicMock

import pytest

from litellm_disagg.routing.controller import DisaggController
from litellm_disagg.routing.kv.disagg_decision import (
    DeciderMoments,
    DisaggDecider,
    DisaggInputs,
    LinearEstimate,
    OnlineLinearFit,
)
from litellm_disagg.routing.kv.settings import DisaggDecisionSettings
from litellm_disagg.routing.kv.shared_estimates import Limits, SharedEstimates, encode, parse, parse_others
from litellm_disagg.routing.kv.stall_fit import StallFit
from litellm_disagg.routing.shared_inflight import SharedInflightSettings
from litellm_disagg.settings import DisaggSettings

from ..support.redis_server import redis_fixtures

KEY = "test:estimates"
SETTINGS = DisaggDecisionSettings()
LIMITS = Limits(SETTINGS)

# Remote prefills as a prefill worker answers them: 15 ms + 1 ms per 20 tokens, over varied prompt sizes.
PREFILLS = [(tokens, 0.015 + tokens / 20_000) for tokens in (300, 2000, 800, 1500, 500, 1200, 2500, 900)]


def _observed(observations) -> DisaggDecider:
    d = DisaggDecider(SETTINGS)
    for tokens, seconds in observations:
        d.observe_prefill(tokens, seconds)
    return d


# -- pure: the moments ---------------------------------------------------------------------------------------------------


def test_pooled_moments_fit_as_all_the_observations_together() -> None:
    prior = LinearEstimate(0.02, 10_000.0)
    whole, a, b = (OnlineLinearFit(prior, halflife_observations=1e9) for _ in range(3))
    for i, (tokens, seconds) in enumerate(PREFILLS):
        whole.observe(tokens, seconds)
        (a if i % 4 == 0 else b).observe(tokens, seconds)
    # Alone, A's two observations cannot pin a line down: the prior's overhead, a rate through their mean.
    assert a.estimate().tokens_per_s != pytest.approx(whole.estimate().tokens_per_s, rel=0.1)
    a.others = b.moments()
    pooled, together = a.estimate(), whole.estimate()
    assert pooled.tokens_per_s == pytest.approx(together.tokens_per_s, rel=1e-6) == pytest.approx(20_000, rel=1e-3)
    assert pooled.overhead_s == pytest.approx(together.overhead_s, rel=1e-6) == pytest.approx(0.015, rel=1e-3)
    assert a.pooled_observations == 8 and a.observations == 2
    assert a.moments().observations == 2  # what A publishes is its own, never the others' (no echo)


def test_pooled_gaps_measure_the_stall_no_replica_can_alone() -> None:
    whole, a, b = StallFit(min_gaps=10), StallFit(min_gaps=10), StallFit(min_gaps=10)
    for i in range(12):
        for fit in (whole, a if i % 2 else b):
            fit.observe(0.018, during_prefill=False)
            fit.observe(0.024, during_prefill=True)
    assert a.estimate().weight is None  # 6 gaps of each kind: under min_gaps, the prior rules
    a.others = b.moments()
    assert a.estimate().weight == pytest.approx(whole.estimate().weight) == pytest.approx(0.25)
    assert a.estimate().during_gaps == 12


def test_a_replica_without_remote_prefills_prices_them_on_the_others() -> None:
    seen, unseen = _observed(PREFILLS), DisaggDecider(SETTINGS)
    inputs = DisaggInputs(prompt_tokens=2000)
    # Transfers come from the decode workers' counters, which every replica scrapes itself: never pooled (each
    # replica would count every transfer N times).
    seen.observe_transfers(transfers=4, seconds=0.08, tokens=4000)
    unseen.observe_transfers(transfers=4, seconds=0.08, tokens=4000)
    alone = unseen.costs(inputs)
    unseen.set_others(parse(encode(seen.moments()), LIMITS))
    assert unseen.estimates().prefill == seen.estimates().prefill
    assert unseen.estimates().prefill_observations == 8
    assert unseen.estimates().transfer_observations == 1 and unseen.transfer.others is None
    assert unseen.costs(inputs) == pytest.approx(seen.costs(inputs)) and unseen.costs(inputs) != alone
    assert unseen.moments() == DeciderMoments()  # it publishes nothing it did not observe itself
    unseen.set_others(None)
    assert unseen.costs(inputs) == alone


def test_the_encoding_round_trips() -> None:
    d = _observed(PREFILLS)
    d.observe_transfers(transfers=4, seconds=0.08, tokens=4000)
    d.observe_first_token(local=True, tokens=500, seconds=0.06)
    d.observe_first_token(local=False, tokens=500, seconds=0.01)
    for gap in (0.018, 0.02):
        d.observe_decode_gap(gap, during_prefill=False)
        d.observe_decode_gap(gap * 1.3, during_prefill=True)
    assert parse(encode(d.moments()), LIMITS) == d.moments()


def _entry(**changes: object) -> str:
    data = json.loads(encode(_observed(PREFILLS).moments()))
    data.update(changes)
    return json.dumps(data)


@pytest.mark.parametrize("payload", [
    "not json",
    "[1, 2]",
    _entry(prefill=None),
    _entry(prefill=[1.0, 2.0, 3.0]),
    _entry(prefill=[1.0, 100.0, 0.1, 10_000.0, 10.0, float("nan"), 1]),
    _entry(prefill=[1.0, -100.0, 0.1, 10_000.0, 10.0, 0.01, 1]),
    _entry(prefill=[True, 100.0, 0.1, 10_000.0, 10.0, 0.01, 1]),
    _entry(prefill=[1.0, 100.0, 0.1, 10_000.0, 10.0, 0.01, 1.5]),
    _entry(prefill=[1e6, 1e8, 1e5, 1e13, 1e10, 1e4, 5]),  # more weight than a half-life of 50 lets a fit hold
    _entry(prefill=[1.0, 100.0, 0.1, 10_000.0, 10.0, 0.01, 0]),  # weight without observations
    _entry(prefill=[1.0, 1e12, 0.1, 1e24, 1e11, 0.01, 1]),  # a trillion-token prompt
    _entry(prefill=[2.0, 200.0, 0.2, 100.0, 10.0, 0.02, 2]),  # Σx² below (Σx)²/w: no real observations give it
    _entry(stall=[1.0, 0.02, 1, 1.0, 0.03]),
    _entry(stall=[1.0, 1e5, 1, 1.0, 0.03, 1]),  # a gap of a day
])
def test_an_entry_that_is_not_what_a_replica_publishes_is_skipped_whole(payload: str) -> None:
    assert parse(payload, LIMITS) is None
    good = encode(_observed(PREFILLS[:4]).moments())
    summed, counted, bad = parse_others([("liar", payload), ("good", good)], LIMITS)
    assert bad == ["liar"] and counted == 1 and summed == parse(good, LIMITS)


def test_the_weight_limit_follows_the_half_life() -> None:
    d = _observed(PREFILLS * 100)  # 800 observations: the weight settles at its bound, and stays under it
    assert parse(encode(d.moments()), LIMITS) is not None
    assert parse(encode(d.moments()), Limits(DisaggDecisionSettings(halflife_observations=5))) is None


# -- over a real Redis ------------------------------------------------------------------------------------------------


redis_port, client = redis_fixtures(KEY)


def _replica(client, name: str, decider: DisaggDecider) -> SharedEstimates:
    settings = SharedInflightSettings(enabled=True, estimates_key=KEY, estimates_interval_s=0.05)
    return SharedEstimates(decider, lambda: client, settings, replica=name)


async def test_each_replica_decides_on_every_replicas_measurements(client, caplog) -> None:
    a_decider, b_decider = _observed(PREFILLS[::2]), _observed(PREFILLS[1::2])
    a, b = _replica(client, "a", a_decider), _replica(client, "b", b_decider)
    assert await a.exchange() and await b.exchange() and await a.exchange()
    whole = _observed(PREFILLS).estimates().prefill
    for d in (a_decider, b_decider):
        assert d.estimates().prefill_observations == 8
        assert d.estimates().prefill.tokens_per_s == pytest.approx(whole.tokens_per_s, rel=0.02)
    # A hostile field is skipped and logged once; the good one still counts.
    seconds, micros = await client.time()
    await client.hset(KEY, "liar", f"{seconds * 1000 + micros // 1000} " + _entry(prefill=[1e9, 0, 0, 0, 0, 0, 1]))
    with caplog.at_level(logging.WARNING, logger="litellm_disagg.routing.kv.shared_estimates"):
        assert await b.exchange() and await b.exchange()
    assert caplog.text.count("'liar'") == 1 and b.replicas == 1
    assert b_decider.estimates().prefill_observations == 8
    # A replica that stops leaves at once: the other is back on its own measurements.
    await a.stop()
    assert a_decider.estimates().prefill_observations == 4
    assert await b.exchange() and b_decider.estimates().prefill_observations == 4 and b.replicas == 0
    await b.stop()
    assert await client.hkeys(KEY) == [b"liar"]


async def test_without_redis_a_replica_decides_on_its_own() -> None:
    d = _observed(PREFILLS[:4])
    alone = SharedEstimates(d, lambda: None, SharedInflightSettings(enabled=True), replica="a")
    assert not await alone.exchange()
    assert d.estimates().prefill_observations == 4


def test_the_controller_pools_estimates_with_kv_routing_and_a_redis() -> None:
    def controller(**shared: object) -> DisaggController:
        settings = DisaggSettings(kv_routing={"enabled": True},
                                  shared_inflight={"redis_url": "redis://127.0.0.1:1/0", **shared})
        return DisaggController(MagicMock(), settings, MagicMock())

    c = controller()
    assert c.shared_estimates is not None and c.shared_estimates.decider is c.kv.decider
    assert controller(estimates=False).shared_estimates is None
    plain = DisaggController(MagicMock(), DisaggSettings(kv_routing={"enabled": True},
                                                         shared_inflight={"enabled": False}), MagicMock())
    assert plain.shared_estimates is None

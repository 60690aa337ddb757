"""The selection pipeline: filters, profiles (least_inflight and round_robin are profiles of it), scorers, picker."""

import random

import pytest
from pydantic import ValidationError

from litellm_disagg.routing.accounting import Accounting, FlightKey
from litellm_disagg.routing.cooldown import FailureCooldown
from litellm_disagg.routing.pipeline import filters
from litellm_disagg.routing.pipeline.pipeline import Pipeline
from litellm_disagg.routing.pipeline.profile import PICKER_PROFILES, ProfileSettings
from litellm_disagg.routing.pipeline.providers import LoadProvider
from litellm_disagg.routing.pipeline.scorers import SCORERS, make_scorer
from litellm_disagg.runtime_config import WorkerRole

from ..test_routing_units import w


def pick(pipeline: Pipeline, provider: LoadProvider, candidates) -> str:
    return pipeline.select(provider.context(None, candidates), candidates).worker_id


def test_least_inflight_prefers_idle_and_rotates_ties():
    accounting = Accounting()
    provider = LoadProvider(accounting)
    pipeline = Pipeline(PICKER_PROFILES["least_inflight"]())
    a, b, c = w("a"), w("b"), w("c")
    accounting.start(FlightKey.decode("r1"), "a")
    picks = [pick(pipeline, provider, [a, b, c]) for _ in range(4)]
    assert picks == ["b", "c", "b", "c"]
    accounting.finish(FlightKey.decode("r1"))
    assert pipeline.select(provider.context(None, []), []).worker is None


def test_round_robin_cycles_whatever_the_load():
    accounting = Accounting()
    accounting.start(FlightKey.decode("r1"), "a")
    pipeline = Pipeline(PICKER_PROFILES["round_robin"]())
    ws = [w("a"), w("b")]
    assert [pick(pipeline, LoadProvider(accounting), ws) for _ in range(4)] == ["a", "b", "a", "b"]


def test_ranking_is_the_failover_order():
    accounting = Accounting()
    for i, worker_id in enumerate(["a", "a", "b"]):
        accounting.start(FlightKey.decode(str(i)), worker_id)
    provider = LoadProvider(accounting)
    ws = [w("a"), w("b"), w("c")]
    selection = Pipeline(PICKER_PROFILES["least_inflight"]()).select(provider.context(None, ws), ws)
    assert selection.ranking() == ["c", "b", "a"]


def test_profiles_name_only_known_scorers_and_some_weight():
    assert set(SCORERS) == {"prefix_overlap", "load", "kv_free", "kv_cost", "live_sessions"}
    with pytest.raises(ValidationError, match="unknown scorer"):
        ProfileSettings(weights={"nope": 1.0})
    with pytest.raises(ValidationError, match="positive weight"):
        ProfileSettings(weights={"load": 0.0})
    with pytest.raises(ValueError, match="unknown scorer"):
        make_scorer("nope", ProfileSettings(weights={}))


def test_filters_narrow_in_order():
    cooldown = FailureCooldown(cooldown_s=60)
    ws = [w("p1", "prefill"), w("p2", "prefill", "draining"), w("b1", "both"), w("d1"), w("p3", "prefill")]
    cooldown.failed("p3")
    chain = (filters.routable, filters.role(WorkerRole.PREFILL), filters.excluded({"b1"}), filters.cooldown(cooldown))
    assert [x.worker_id for x in filters.apply(chain, ws)] == ["p1"]
    cooldown.failed("p1")  # every one cooling: never refuse the last ones
    assert [x.worker_id for x in filters.apply(chain, ws)] == ["p1", "p3"]


def test_temperature_samples_and_least_loaded_breaks_ties_randomly():
    accounting = Accounting()
    provider = LoadProvider(accounting)
    ws = [w("a"), w("b"), w("c")]
    sampled = Pipeline(ProfileSettings(weights={"load": 1.0}, temperature=5.0), rng=random.Random(1))
    assert {pick(sampled, provider, ws) for _ in range(60)} == {"a", "b", "c"}
    ties = Pipeline(ProfileSettings(weights={"load": 1.0}), rng=random.Random(1))
    selection = ties.select(provider.context(None, ws), ws)
    assert selection.how == "tie_random"

"""Bounded load (a hot prefix spreads over replicas) and live sessions (new conversations placed by the sessions a
worker is expected to continue): pure pipeline tests on fake snapshots, plus the tracker and its KVRouter hook."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from litellm_disagg.routing.kv.block_hash import PromptBlocks
from litellm_disagg.routing.kv.live_sessions import LiveSessions
from litellm_disagg.routing.kv.router import KVRouter
from litellm_disagg.routing.kv.settings import KVRoutingSettings
from litellm_disagg.routing.pipeline.bounded_load import load_bound, within_bound
from litellm_disagg.routing.pipeline.context import ScoringContext
from litellm_disagg.routing.pipeline.pipeline import Pipeline
from litellm_disagg.routing.pipeline.profile import (
    BoundedLoadSettings,
    ProfileSettings,
    SessionSettings,
    kv_decode_profile,
)
from litellm_disagg.routing.pipeline.scorers.live_sessions import LiveSessionsScorer
from litellm_disagg.routing.pool import WorkerPool
from tests.kv.helpers import load, worker

A, B, C, D = (worker(x) for x in "abcd")
WORKERS = [A, B, C, D]


def ctx(
    prompt: int, cached: dict[str, int], active: dict[str, int], live: dict[str, int] | None = None
) -> ScoringContext:
    loads = {x.worker_id: load(x.worker_id, inflight=active.get(x.worker_id, 0)) for x in WORKERS}
    return ScoringContext(prompt_tokens=prompt, cached_tokens=cached, loads=loads, live_sessions=live or {})


def without(profile: ProfileSettings, **changes: object) -> ProfileSettings:
    return profile.model_copy(update=changes)


# -- bounded load ---------------------------------------------------------------------------------------------------


def test_the_kv_profiles_bound_the_load_by_default() -> None:
    decode = kv_decode_profile()
    assert decode.bounded_load == BoundedLoadSettings()
    assert KVRoutingSettings().decode.bounded_load is not None


def test_a_hot_holder_over_the_bound_is_passed_over_for_the_next_best() -> None:
    hot = ctx(2048, {"a": 2032, "b": 1024}, {"a": 7, "b": 1, "c": 0, "d": 0})
    unbounded = Pipeline(without(kv_decode_profile(), bounded_load=None)).select(hot, WORKERS)
    assert unbounded.worker_id == "a"  # following the cache blindly: the hot spot
    bounded = Pipeline(kv_decode_profile()).select(hot, WORKERS)
    assert bounded.over_bound == frozenset({"a"})
    assert bounded.worker_id == "b"  # the next best by score (half the prompt cached), not merely the idlest
    assert bounded.ranking()[-1] == "a"  # failover tries the overloaded holder last
    assert "over the load bound: a" in bounded.describe()


def test_within_the_bound_the_cache_still_wins() -> None:
    warm = ctx(2048, {"a": 2032}, {"a": 3, "b": 1, "c": 0, "d": 0})  # mean 1, bound 1.5 * 1 + 2 = 3.5
    selection = Pipeline(kv_decode_profile()).select(warm, WORKERS)
    assert selection.worker_id == "a" and not selection.over_bound


def test_the_bound_never_leaves_no_candidate() -> None:
    settings = BoundedLoadSettings(factor=1.0, slack=0.0)
    busy = ctx(100, {}, {"a": 5, "b": 5, "c": 5, "d": 5})
    kept, over = within_bound(busy, WORKERS, settings)
    assert kept == WORKERS and not over
    uneven = ctx(100, {}, {"a": 9, "b": 1, "c": 1, "d": 1})
    kept, over = within_bound(uneven, WORKERS, settings)
    assert [w.worker_id for w in kept] == ["b", "c", "d"] and over == {"a"}
    assert load_bound([], settings) == 0.0


def test_bounded_load_settings_are_validated() -> None:
    with pytest.raises(ValidationError):
        BoundedLoadSettings(factor=0.9)
    with pytest.raises(ValidationError):
        BoundedLoadSettings(slack=-1)
    with pytest.raises(ValidationError):
        BoundedLoadSettings.model_validate({"factor": 2, "c": 1})
    settings = KVRoutingSettings.model_validate({"decode": {"weights": {"kv_cost": 1}, "bounded_load": {"factor": 2}}})
    assert settings.decode.bounded_load == BoundedLoadSettings(factor=2.0)


# -- live sessions --------------------------------------------------------------------------------------------------


def test_a_new_conversation_goes_where_fewer_sessions_live() -> None:
    # No cache hit anywhere; c and d look equally idle this instant, but c serves 4 live conversations, d 1.
    new = ctx(2048, {}, {"a": 2, "b": 2, "c": 0, "d": 0}, live={"a": 1, "b": 1, "c": 4, "d": 1})
    without_sessions = ProfileSettings(
        weights={"kv_cost": 1.0, "kv_free": 0.25, "prefix_overlap": 0.5}, cost=kv_decode_profile().cost
    )
    assert Pipeline(kv_decode_profile()).select(new, WORKERS).worker_id == "d"
    picks = {Pipeline(without_sessions).select(new, WORKERS).worker_id for _ in range(40)}
    assert picks == {"c", "d"}  # instantaneous load alone cannot tell them apart


def test_live_sessions_are_neutral_for_a_request_with_a_cache_hit() -> None:
    scorer = LiveSessionsScorer(SessionSettings())
    turn = ctx(2048, {"c": 1600}, {}, live={"a": 0, "c": 6})
    assert scorer.score(turn, WORKERS) == dict.fromkeys("abcd", 1.0)
    assert Pipeline(kv_decode_profile()).select(turn, WORKERS).worker_id == "c"
    shared_system_prompt = ctx(2048, dict.fromkeys("abcd", 1024), {}, live={"a": 3, "b": 0, "c": 3, "d": 3})
    assert scorer.score(shared_system_prompt, WORKERS)["b"] == 1.0
    assert scorer.score(shared_system_prompt, WORKERS)["a"] == 0.25


def test_the_tracker_counts_sessions_not_requests_and_forgets_them() -> None:
    now = [0.0]
    sessions = LiveSessions(SessionSettings(window_s=10, max_tracked=3), clock=lambda: now[0])
    sessions.routed("a", [1, 2, 3])
    sessions.routed("b", [7])
    assert sessions.counts() == {"a": 1, "b": 1}
    now[0] = 5
    sessions.routed("a", [1, 2, 3, 4])  # the same conversation's next turn
    assert sessions.counts() == {"a": 1, "b": 1}
    sessions.routed("b", [1, 2, 3, 4, 5])  # continued elsewhere: it left a
    assert sessions.counts() == {"b": 2}
    now[0] = 12  # b's first session (seen at 0) is past the window; the conversation (seen at 5) is not
    assert sessions.counts() == {"b": 1}
    sessions.routed("c", [20])
    sessions.routed("c", [21])
    sessions.routed("d", [22])  # a fourth tail: the oldest goes
    assert sessions.counts() == {"c": 2, "d": 1}
    sessions.forget("c")
    assert sessions.counts() == {"d": 1}
    sessions.routed("d", [])
    assert sessions.counts() == {"d": 1}


def test_the_kv_router_feeds_placements_to_the_scoring_context() -> None:
    router = KVRouter(KVRoutingSettings())
    a, b = worker("a"), worker("b")
    router.sync(WorkerPool.of([a, b]))
    first = PromptBlocks(list(range(16 * 4)))
    router.observe(SimpleNamespace(prompt=first, decode=a, decision_inputs=None), None, None)  # type: ignore[arg-type]
    other = PromptBlocks(list(range(1000, 1000 + 16 * 3)))
    assert router.context(other, [a, b]).live_sessions == {"a": 1}
    router.sync(WorkerPool.of([b]))
    assert router.context(other, [b]).live_sessions == {}

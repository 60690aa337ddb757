"""Live sessions as next turns expected soon (``decode.sessions.expect: next_turns``): a conversation whose answer
has just ended comes back within the measured gaps between an answer and the next turn; a new conversation's cold
prompt avoids the workers about to get them."""

from __future__ import annotations

import random

from litellm_disagg.routing.kv.block_hash import PromptBlocks
from litellm_disagg.routing.kv.live_sessions import LiveSessions, NextTurns
from litellm_disagg.routing.kv.router import KVRouter
from litellm_disagg.routing.kv.settings import KVRoutingSettings
from litellm_disagg.routing.pipeline.context import ScoringContext
from litellm_disagg.routing.pipeline.pipeline import Pipeline
from litellm_disagg.routing.pipeline.profile import SessionSettings, kv_decode_profile
from litellm_disagg.routing.pipeline.scorers.base import relative_values
from litellm_disagg.routing.pipeline.scorers.live_sessions import LiveSessionsScorer
from tests.kv.helpers import load, worker


def conversation(sessions: LiveSessions, now: list[float], worker_id: str, sid: int, *, gap: float) -> None:
    """One conversation of two turns on ``worker_id``: its first answer ends 1 s after it was sent, its second turn
    comes ``gap`` later (one measured gap), and that turn is still running."""
    sessions.routed(worker_id, [sid, sid + 1], call_id=f"{sid}-0")
    now[0] += 1.0
    sessions.ended(f"{sid}-0")
    now[0] += gap
    sessions.routed(worker_id, [sid, sid + 1, sid + 2], call_id=f"{sid}-1")


def test_ended_calls_come_back_within_the_measured_gaps_and_running_ones_count_nothing() -> None:
    now = [0.0]
    sessions = LiveSessions(SessionSettings(), clock=lambda: now[0])
    assert sessions.next_turns(1.0) == {}  # no gap measured: nothing expected anywhere
    for i, gap in enumerate((0.5, 0.5, 0.6)):
        conversation(sessions, now, "x", 100 * i, gap=gap)
    assert sessions.next_turns(1.0) == {}  # every conversation is running its next turn
    sessions.routed("a", [1000], call_id="a1")
    sessions.routed("b", [2000], call_id="b1")
    sessions.routed("c", [3000], call_id="c1")  # still running
    sessions.ended("a1")
    now[0] += 0.55
    sessions.ended("b1")
    now[0] += 0.2  # a ended 0.75 s ago (past every measured gap), b 0.2 s ago
    assert sessions.next_turns(1.0) == {"b": 1.0}
    assert sessions.next_turns(0.35) == {"b": 2 / 3}  # by 0.55 s after its end: two of the three gaps
    assert sessions.next_turns(0.25) == {}  # by 0.45 s: none
    now[0] += 0.35  # b ended 0.55 s ago: only the 0.6 s gap is still longer
    assert sessions.next_turns(1.0) == {"b": 1.0}
    sessions.routed("b", [2000, 2001], call_id="b2")  # it came back (a fourth gap, 0.55 s), running again
    assert sessions.next_turns(1.0) == {}
    sessions.ended("b2")
    sessions.ended("b2")  # twice: nothing more
    sessions.ended("unknown")
    assert sessions.next_turns(1.0) == {"b": 1.0}
    sessions.forget("b")
    assert sessions.next_turns(1.0) == {}


def test_single_questions_never_come_back_so_nothing_is_expected() -> None:
    now = [0.0]
    sessions = LiveSessions(SessionSettings(), clock=lambda: now[0])
    for i in range(20):
        sessions.routed(f"w{i % 4}", [i, 1000 + i], call_id=f"q{i}")
        now[0] += 0.3
        sessions.ended(f"q{i}")
    assert sessions.next_turns(1.0) == {} and sessions.counts() == dict.fromkeys(("w0", "w1", "w2", "w3"), 5)


def test_a_cold_prompt_avoids_the_worker_about_to_get_a_next_turn_and_a_cached_one_never_asks() -> None:
    a, b = worker("a"), worker("b")
    loads = {"a": load("a"), "b": load("b")}  # both idle: instantaneous load cannot tell them apart

    class Counting(dict):
        reads = 0

        def __len__(self) -> int:
            Counting.reads += 1
            return super().__len__()

    soon = Counting({"a": 1.0})
    cold = ScoringContext(prompt_tokens=4000, cached_tokens={}, loads=loads, next_turns=soon)
    assert Pipeline(kv_decode_profile(), rng=random.Random(0)).select(cold, [a, b]).worker_id == "b"
    assert LiveSessionsScorer(SessionSettings()).score(cold, [a, b]) == {"a": 0.5, "b": 1.0}
    Counting.reads = 0
    hit = ScoringContext(prompt_tokens=4000, cached_tokens={"a": 3000}, loads=loads, next_turns=soon)
    assert Pipeline(kv_decode_profile(), rng=random.Random(0)).select(hit, [a, b]).worker_id == "a"
    assert Counting.reads == 0  # a cache hit decides: the expectation is never computed


def test_the_router_hands_the_scorer_next_turns_when_asked() -> None:
    now = [0.0]
    profile = kv_decode_profile().model_dump(mode="json")
    profile["sessions"]["expect"] = "next_turns"
    router = KVRouter(KVRoutingSettings.model_validate({"enabled": True, "decode": profile}), clock=lambda: now[0])
    counted = kv_decode_profile().model_dump(mode="json")
    counted["sessions"]["expect"] = "count"
    counting = KVRouter(KVRoutingSettings.model_validate({"enabled": True, "decode": counted}), clock=lambda: now[0])
    assert counting.context(None, [worker("a")]).next_turns is None
    router.sessions._clock = lambda: now[0]  # type: ignore[attr-defined]
    conversation(router.sessions, now, "x", 1, gap=0.5)
    router.sessions.routed("a", [50], call_id="a1")
    router.sessions.ended("a1")
    now[0] += 0.1
    ctx = router.context(PromptBlocks(list(range(4000))), [worker("a"), worker("b")])
    assert isinstance(ctx.next_turns, NextTurns) and dict(ctx.next_turns) == {"a": 1.0}
    assert ctx.live_sessions == {"x": 1, "a": 1}  # the count rides along: the bound


def test_the_count_bounds_the_order_by_next_turns() -> None:
    """``count_bound``: ordered by next turns soon, yet a worker holding more than the candidates' mean + bound live
    conversations is passed over for a new one (the cost seen without the bound: workers whose conversations were all
    generating took 7 while others held 4, and decoded bigger batches). Within the bound, next turns decide."""
    ws = [worker(n) for n in "abcd"]
    loads = {w.worker_id: load(w.worker_id) for w in ws}
    counts = {"a": 7, "b": 6, "c": 4, "d": 3}  # mean 5
    soon = {"b": 0.2, "c": 0.9, "d": 0.6}  # a's conversations are all generating: none expected soon
    ctx = ScoringContext(prompt_tokens=4000, cached_tokens={}, loads=loads, live_sessions=counts, next_turns=soon)
    loose = LiveSessionsScorer(SessionSettings(expect="next_turns", count_bound=1.0))
    costs = loose.costs(ctx, ws)
    assert costs is not None and costs[0] > max(costs[1:])  # a (over mean + 1) last, by its excess over the bound
    assert costs[1:] == [0.2, 0.9, 0.6]  # the rest by next turns soon
    assert loose.values(ctx, ws, []) == list(relative_values(costs))
    assert max(loose.score(ctx, ws).items(), key=lambda kv: kv[1])[0] == "b"
    # the default bound, 0: at most the mean; b (6) is passed over too, and d, expected the fewest next turns, wins
    assert LiveSessionsScorer(SessionSettings()).costs(ctx, ws)[2:] == [0.9, 0.6]
    assert Pipeline(kv_decode_profile(), rng=random.Random(0)).select(ctx, ws).worker_id == "d"
    unbounded = LiveSessionsScorer(SessionSettings(expect="next_turns", count_bound=None))
    assert unbounded.costs(ctx, ws) == [0.0, 0.2, 0.9, 0.6]  # without the bound a takes it
    # nothing expected anywhere (no gap measured, or none answered lately): the bound alone; without it, neutral.
    # On real workers (0.5 s between turns) most decisions see no next turn: without the bound there, 6 / 3 / 3
    quiet = ScoringContext(prompt_tokens=4000, cached_tokens={}, loads=loads, live_sessions=counts, next_turns={})
    held = LiveSessionsScorer(SessionSettings()).costs(quiet, ws)
    assert held is not None and held[2:] == [0.0, 0.0] and min(held[:2]) > 0  # a and b (over the mean) last
    assert unbounded.costs(quiet, ws) is None and set(unbounded.score(quiet, ws).values()) == {1.0}
    even = ScoringContext(prompt_tokens=4000, cached_tokens={}, loads=loads, live_sessions=dict.fromkeys("abcd", 2),
                          next_turns={})
    assert LiveSessionsScorer(SessionSettings()).costs(even, ws) is None  # all alike: neutral

"""A decode call's prefill seen over in its worker's KV events: its prompt stops counting as queued there before its
end, streamed or not (before this, a non-streamed call's prompt counted as queued for its whole generation)."""

from __future__ import annotations

import asyncio

from litellm_disagg.routing.accounting import FlightKey
from litellm_disagg.routing.kv.block_hash import PromptBlocks
from litellm_disagg.routing.kv.disagg_decision import DisaggInputs
from litellm_disagg.routing.kv.prefill_seen import PrefillSeen
from litellm_disagg.routing.kv.prefix_index import PrefixIndex
from litellm_disagg.routing.kv.router import KVRouter
from litellm_disagg.routing.kv.settings import KVRoutingSettings
from litellm_disagg.routing.route_plan import RoutePlan
from litellm_disagg.runtime_config import WorkerRole
from tests.kv.helpers import worker


def test_a_call_is_done_once_its_worker_holds_the_last_block() -> None:
    index = PrefixIndex()
    index.add_worker("d1", capacity_blocks=100)  # precise: no TTL
    index.add_worker("d2", capacity_blocks=100)
    seen = PrefillSeen(max_entries=3)
    assert seen.sent("a", "d1", 11, index.holds)
    assert seen.sent("b", "d2", 22, index.holds)
    assert not seen.sent("short", "d1", None, index.holds)  # under one block: no signal
    index.stored("d2", [21, 22])
    assert not seen.sent("cached", "d2", 22, index.holds)  # already held when sent: no signal either
    index.stored("d2", [11])  # another worker holding "a"'s block says nothing about d1
    assert seen.done(index.holds) == ["b"]
    assert seen.done(index.holds) == []
    index.stored("d1", [11])
    assert seen.done(index.holds) == ["a"] and seen.seen == 2 and len(seen) == 0


def test_ended_forgotten_and_bounded() -> None:
    index = PrefixIndex()
    index.add_worker("d1", capacity_blocks=100)
    seen = PrefillSeen(max_entries=2)
    seen.sent("a", "d1", 1, index.holds)
    seen.ended("a")  # its first chunk came, or it ended
    seen.sent("b", "d1", 2, index.holds)
    seen.sent("c", "d1", 3, index.holds)
    seen.sent("d", "d1", 4, index.holds)  # the oldest ("b") is dropped
    index.stored("d1", [1, 2, 3, 4])
    assert seen.done(index.holds) == ["c", "d"]
    seen.sent("e", "d1", 5, index.holds)
    seen.sent("e", "d1", 6, index.holds)  # a retry replaces the earlier attempt
    seen.forget("d1")
    index.stored("d1", [5, 6])
    assert seen.done(index.holds) == []


def _plan(decode_id: str, prompt: PromptBlocks) -> RoutePlan:
    decode = worker(decode_id, role=WorkerRole.DECODE)
    inputs = DisaggInputs(prompt_tokens=prompt.num_tokens)
    return RoutePlan(decode, (), "local", "local", prompt=prompt, decision_inputs=inputs)


async def test_a_non_streamed_calls_prompt_stops_counting_when_its_blocks_are_stored() -> None:
    router = KVRouter(KVRoutingSettings.model_validate({"enabled": True}))
    router.index.add_worker("d", capacity_blocks=1000)  # a worker whose KV events the router reads
    prompt = PromptBlocks(list(range(100)))  # 6 full blocks of 16 and 4 tokens
    key = FlightKey.decode("call-1")
    router.accounting.start(key, "d", prefill_tokens=100)  # as the strategy does for a local prefill
    router.observe(_plan("d", prompt), None, None, call_id="call-1")
    assert router.decode_watch.prefilling("d") == 1
    await router.start()
    try:
        router.index.stored("d", prompt.hashes(16)[:5])  # the prefill is under way: not over yet
        await asyncio.sleep(0.2)
        assert router.accounting.prefill_tokens("d") == 100
        router.index.stored("d", prompt.hashes(16)[5:])  # the worker's event for the last full block
        for _ in range(200):  # the watch polls every 50 ms
            if router.accounting.prefill_tokens("d") == 0:
                break
            await asyncio.sleep(0.05)
        assert router.accounting.prefill_tokens("d") == 0
        assert router.accounting.requests("d") == 1  # still decoding: only its prefill is over
        assert router.decode_watch.prefilling("d") == 0  # no longer marks its worker as prefilling
        assert router.prefill_seen.seen == 1
    finally:
        await router.stop()


def test_an_approximate_worker_gives_no_signal() -> None:
    router = KVRouter(KVRoutingSettings.model_validate({"enabled": True}))
    router.index.add_worker("d", capacity_blocks=1000, ttl_s=60.0)  # approximate: entries are the router's guesses
    prompt = PromptBlocks(list(range(100)))
    router.accounting.start(FlightKey.decode("call-1"), "d", prefill_tokens=100)
    router.observe(_plan("d", prompt), None, None, call_id="call-1")  # records the blocks as held at once
    assert router.prefills_seen() == []
    assert router.accounting.prefill_tokens("d") == 100


def test_a_streamed_first_token_is_still_timed_after_its_prefill_was_seen() -> None:
    router = KVRouter(KVRoutingSettings.model_validate({"enabled": True}))
    router.index.add_worker("d", capacity_blocks=1000)
    router.decode_watch.dispatched("first", local=True, tokens=1, worker_id="d")  # d's first call: not timed
    router.decode_watch.chunk("first")
    router.decode_watch.ended("first")
    prompt = PromptBlocks(list(range(100)))
    router.observe(_plan("d", prompt), None, None, call_id="call-1")
    router.index.stored("d", prompt.hashes(16))
    assert router.prefills_seen() == ["call-1"]
    assert router.decode_watch.prefilling("d") == 0
    router.decode_watch.chunk("call-1")  # the first chunk: the local line still learns from it
    assert router.decider.estimates().local_observations == 1
    assert router.decode_watch.prefilling("d") == 0  # not decremented twice

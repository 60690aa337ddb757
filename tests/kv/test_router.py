"""KVRouter end to end in one process: discovery snapshots, real ZMQ event streams on 127.0.0.1, selection (the
router's context through the profiles' pipelines), the sibling race, AllBlocksCleared, a worker leaving, approximate
mode, and the P/D decision."""

from __future__ import annotations

import random

import pytest

from litellm_disagg.engines.base import Endpoint
from litellm_disagg.routing.accounting import FlightKey
from litellm_disagg.routing.kv.block_hash import PromptBlocks
from litellm_disagg.routing.kv.router import KVRouter
from litellm_disagg.routing.kv.settings import KVRoutingSettings
from litellm_disagg.routing.pipeline.pipeline import Pipeline
from litellm_disagg.routing.pipeline.profile import ProfileSettings
from litellm_disagg.routing.pipeline.selection import Selection
from litellm_disagg.routing.pool import WorkerPool
from litellm_disagg.routing.request import DisaggRequest
from litellm_disagg.runtime_config import RuntimeConfig, WorkerRole
from tests.kv import vllm_wire as wire
from tests.kv.helpers import worker
from tests.kv.zmq_pub import FakeEnginePublisher, joined, until

BS = 16


def toks(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 30_000) for _ in range(n)]


def engine_hashes(tokens: list[int], salt: int) -> list[int]:
    out, h = [], salt
    for i in range(0, len(tokens) - BS + 1, BS):
        h = hash((h, "engine", tuple(tokens[i : i + BS]))) & (2**64 - 1)
        out.append(h)
    return out


def request(tokens: list[int]) -> DisaggRequest:
    return DisaggRequest(endpoint=Endpoint.COMPLETIONS, fields={"prompt": tokens}, request_id="r")


def settings(**over: object) -> KVRoutingSettings:
    return KVRoutingSettings.model_validate({"enabled": True, "seed": 1, "load": {"scrape_interval_s": 60}} | over)


@pytest.fixture
async def cluster():  # type: ignore[no-untyped-def]
    """Two prefill workers publishing events, one without events, one decode worker publishing events."""
    pubs = {name: FakeEnginePublisher() for name in ("p1", "p2", "d1")}
    workers = {
        "p1": worker("p1", role=WorkerRole.PREFILL, events=pubs["p1"].endpoint, port=9001),
        "p2": worker("p2", role=WorkerRole.PREFILL, events=pubs["p2"].endpoint, port=9002),
        "p3": worker("p3", role=WorkerRole.PREFILL, port=9003),
        "d1": worker("d1", role=WorkerRole.DECODE, events=pubs["d1"].endpoint, port=9004),
    }
    router = KVRouter(settings())
    router.sync(WorkerPool.of(workers.values()))
    await router.start()
    for name, pub in pubs.items():
        await joined(pub, lambda name=name: router._subscribers[name].messages)  # type: ignore[misc]
    yield router, pubs, workers
    await router.stop()
    for pub in pubs.values():
        pub.close()


def prefill_candidates(workers: dict[str, object]) -> list:  # type: ignore[type-arg]
    return [workers["p1"], workers["p2"], workers["p3"]]


def select(
    router: KVRouter, profile: ProfileSettings, prompt: PromptBlocks | None, candidates: list[RuntimeConfig]
) -> Selection:
    """One pool's choice as the route planner makes it: the router's context, the profile's pipeline (its picker
    seeded as the router's settings say)."""
    pipeline = Pipeline(profile, rng=random.Random(router.settings.seed))
    return pipeline.select(router.context(prompt, candidates), candidates)


def select_prefill(router: KVRouter, prompt: PromptBlocks | None, candidates: list[RuntimeConfig]) -> Selection:
    return select(router, router.settings.prefill, prompt, candidates)


def select_decode(router: KVRouter, prompt: PromptBlocks | None, candidates: list[RuntimeConfig]) -> Selection:
    return select(router, router.settings.decode, prompt, candidates)


async def test_a_repeated_prefix_goes_to_the_worker_that_holds_it(cluster) -> None:  # type: ignore[no-untyped-def]
    router, pubs, workers = cluster
    system = toks(BS * 40, seed=1)
    pubs["p2"].send([wire.stored(engine_hashes(system, 2), None, system, BS)])
    await until(lambda: router.index.blocks("p2") == 40)
    prompt = await router.prompt(request(system + toks(50, seed=2)), prefill_candidates(workers))
    assert prompt is not None and prompt.num_tokens == BS * 40 + 50
    selection = select_prefill(router, prompt, prefill_candidates(workers))
    assert selection.worker_id == "p2"
    assert selection.breakdown["p2"].cached_tokens == BS * 40
    assert selection.breakdown["p1"].cached_tokens == 0
    assert router.event_stats()["p2"].stored_blocks == 40
    assert router.index.is_precise("p2") and not router.index.is_precise("p3")


async def test_sibling_requests_see_each_others_predictions(cluster) -> None:  # type: ignore[no-untyped-def]
    router, pubs, workers = cluster
    shared = toks(BS * 30, seed=3)
    first = await router.prompt(request(shared + [1, 2, 3]), prefill_candidates(workers))
    pick = select_prefill(router, first, prefill_candidates(workers))
    router.routed(first, pick.worker)
    # the first request's prefill ran (its tokens no longer queue there) but its BlockStored has not arrived yet
    router.accounting.start(FlightKey.prefill("first"), pick.worker_id, prefill_tokens=first.num_tokens)
    router.accounting.prefill_done(FlightKey.prefill("first"))
    second = await router.prompt(request(shared + [4, 5, 6]), prefill_candidates(workers))
    sibling = select_prefill(router, second, prefill_candidates(workers))
    assert sibling.worker_id == pick.worker_id
    assert sibling.breakdown[pick.worker_id].cached_tokens == BS * 30
    # the worker's BlockStored replaces the prediction
    if pick.worker_id in pubs:
        pubs[pick.worker_id].send([wire.stored(engine_hashes(shared, 9), None, shared, BS)])
        await until(lambda: router.index.stats().predicted_blocks == 0)
        assert router.index.blocks(pick.worker_id) == 30


async def test_all_blocks_cleared_and_a_worker_leaving(cluster) -> None:  # type: ignore[no-untyped-def]
    router, pubs, workers = cluster
    doc = toks(BS * 8, seed=4)
    for name in ("p1", "d1"):
        pubs[name].send([wire.stored(engine_hashes(doc, 5), None, doc, BS)])
    await until(lambda: router.index.blocks("p1") == 8 and router.index.blocks("d1") == 8)
    prompt = PromptBlocks(doc)
    assert router.index.overlap(prompt.hashes(BS)) == {"p1": 8, "d1": 8}
    pubs["d1"].send([wire.cleared()])
    await until(lambda: router.index.overlap(prompt.hashes(BS)) == {"p1": 8})
    router.sync(WorkerPool.of([workers["p2"], workers["p3"], workers["d1"]]))  # p1 left discovery
    assert router.index.overlap(prompt.hashes(BS)) == {}
    assert "p1" not in router._subscribers and "p1" not in router.index.workers()
    router.index.maintain()
    assert router.index.stats().pending_release == 0


async def test_a_restarted_worker_starts_from_an_empty_index(cluster) -> None:  # type: ignore[no-untyped-def]
    router, pubs, workers = cluster
    doc = toks(BS * 4, seed=6)
    pubs["p1"].send([wire.stored(engine_hashes(doc, 5), None, doc, BS)])
    await until(lambda: router.index.blocks("p1") == 4)
    again = workers["p1"].model_copy(update={"started_at": 2.0})
    router.sync(WorkerPool.of([again, workers["p2"], workers["p3"], workers["d1"]]))
    assert router.index.blocks("p1") == 0
    await joined(pubs["p1"], lambda: router._subscribers["p1"].messages)


async def test_decide_uses_both_selections(cluster) -> None:  # type: ignore[no-untyped-def]
    router, pubs, workers = cluster
    long_prompt = PromptBlocks(toks(8000, seed=7))
    decode = select_decode(router, long_prompt, [workers["d1"]])
    prefill = select_prefill(router, long_prompt, prefill_candidates(workers))
    assert router.decide(long_prompt, decode, prefill).remote
    router.accounting.start(FlightKey.prefill("backlog"), prefill.worker_id, prefill_tokens=2_000_000)
    assert not router.decide(long_prompt, decode, prefill).remote
    none = select_prefill(router, long_prompt, [])
    assert router.decide(long_prompt, decode, none).reason == "no prefill worker"


async def test_without_tokens_selection_falls_back_to_load(cluster) -> None:  # type: ignore[no-untyped-def]
    router, pubs, workers = cluster
    assert (
        await router.prompt(
            DisaggRequest(
                endpoint=Endpoint.CHAT, fields={"messages": [{"role": "user", "content": "x"}]}, request_id="r"
            ),
            [],
        )
        is None
    )  # no model dir, no worker to ask
    router.accounting.start(FlightKey.decode("busy"), "p1")
    router.accounting.start(FlightKey.decode("busy2"), "p2")
    selection = select_prefill(router, None, prefill_candidates(workers))
    assert selection.worker_id == "p3"


async def test_approximate_mode_indexes_from_decisions() -> None:
    router = KVRouter(settings(index={"mode": "approximate", "approximate_ttl_s": 30}))
    a = worker("a", events="tcp://127.0.0.1:1")
    b = worker("b")
    router.sync(WorkerPool.of([a, b]))
    await router.start()
    try:
        assert router._subscribers == {}
        prompt = PromptBlocks(toks(BS * 10, seed=8))
        router.routed(prompt, b)
        assert router.index.blocks("b") == 10
        assert select_prefill(router, prompt, [a, b]).worker_id == "b"
    finally:
        await router.stop()


async def test_sync_before_start_and_stop_without_start() -> None:
    router = KVRouter(settings())
    router.sync(WorkerPool.of([worker("a", events="tcp://127.0.0.1:1"), worker("b", events="tcp://*:5557")]))
    assert set(router._subscribers) == {"a"}  # b's wildcard endpoint cannot be connected to: approximate
    assert not router.index.is_precise("b")
    router.sync(WorkerPool.of([]))
    assert router._subscribers == {}
    await router.stop()

"""A prefix a worker is still computing is no cache hit there yet (``routing/kv/in_flight_prefix.py``): a request
for a document whose first prefill is still running goes to an idle worker instead of queueing behind it; once that
prefill is done the prediction counts again (before its BlockStored arrives), and blocks a worker holds always
count, whatever else it is prefilling. The same for a prompt prefilled remotely whose KV the decode worker is still
pulling: a sibling does not prefill it there (locally, from scratch) but remotely on the prefill worker holding it."""

from __future__ import annotations

import random

import pytest

from litellm_disagg.routing.accounting import FlightKey
from litellm_disagg.routing.kv.block_hash import PromptBlocks
from litellm_disagg.routing.kv.in_flight_prefix import usable_now
from litellm_disagg.routing.kv.router import KVRouter
from litellm_disagg.routing.kv.settings import KVRoutingSettings
from litellm_disagg.routing.pipeline.pipeline import Pipeline
from litellm_disagg.routing.pool import WorkerPool
from litellm_disagg.runtime_config import WorkerRole
from tests.kv import vllm_wire as wire
from tests.kv.helpers import worker
from tests.kv.zmq_pub import FakeEnginePublisher, joined, until

BS = 16


@pytest.mark.parametrize(
    ("cached", "held", "inflight", "usable"),
    [
        (480, 480, 5000, 480),  # all held: counts whatever else is prefilling there
        (480, 0, 0, 480),  # predicted, its prefill done (event on its way): counts
        (480, 0, 5000, 0),  # predicted while a prefill runs there: not yet
        (480, 160, 200, 280),  # at most the tokens being prefilled are discounted
        (0, 0, 5000, 0),
    ],
)
def test_usable_now(cached: int, held: int, inflight: int, usable: int) -> None:
    assert usable_now(cached, held, inflight) == usable


def toks(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 30_000) for _ in range(n)]


def engine_hashes(tokens: list[int]) -> list[int]:
    out, h = [], 7
    for i in range(0, len(tokens) - BS + 1, BS):
        h = hash((h, "engine", tuple(tokens[i : i + BS]))) & (2**64 - 1)
        out.append(h)
    return out


@pytest.fixture
async def decode_pair():  # type: ignore[no-untyped-def]
    """Two aggregated workers publishing KV events (precise), scraping off (the router's own counts only)."""
    pubs = {name: FakeEnginePublisher() for name in ("w1", "w2")}
    workers = [worker(name, role=WorkerRole.BOTH, events=pub.endpoint, port=9101 + i)
               for i, (name, pub) in enumerate(pubs.items())]
    router = KVRouter(KVRoutingSettings.model_validate(
        {"enabled": True, "seed": 1, "load": {"scrape_interval_s": 60}}))
    router.sync(WorkerPool.of(workers))
    await router.start()
    for name, pub in pubs.items():
        await joined(pub, lambda name=name: router._subscribers[name].messages)  # type: ignore[misc]
    yield router, pubs, workers
    await router.stop()
    for pub in pubs.values():
        pub.close()


def pick(router: KVRouter, prompt: PromptBlocks, workers: list) -> tuple[str | None, dict[str, int]]:  # type: ignore[type-arg]
    ctx = router.context(prompt, workers)
    selection = Pipeline(router.settings.decode, rng=random.Random(1)).select(ctx, workers)
    return selection.worker_id, dict(ctx.cached_tokens)


async def test_a_document_still_being_prefilled_is_not_a_hit_until_its_prefill_is_done(decode_pair) -> None:  # type: ignore[no-untyped-def]
    router, _pubs, workers = decode_pair
    doc = toks(BS * 60, seed=1)
    first = PromptBlocks(doc + toks(20, seed=2))
    router.routed(first, workers[0])  # the first request for the document went to w1 ...
    key = FlightKey.prefill("first")
    router.accounting.start(key, "w1", prefill_tokens=first.num_tokens)  # ... and is still being prefilled there
    second = PromptBlocks(doc + toks(20, seed=3))
    chosen, cached = pick(router, second, workers)
    assert cached.get("w1", 0) == 0
    assert chosen == "w2"  # not behind w1's running prefill, whose blocks it would mostly compute again
    router.accounting.prefill_done(key)  # w1 computed it; its BlockStored is not here yet
    chosen, cached = pick(router, second, workers)
    assert cached["w1"] == BS * 60 and chosen == "w1"


async def test_blocks_a_worker_holds_count_while_it_prefills_something_else(decode_pair) -> None:  # type: ignore[no-untyped-def]
    router, pubs, workers = decode_pair
    doc = toks(BS * 60, seed=4)
    pubs["w1"].send([wire.stored(engine_hashes(doc), None, doc, BS)])
    await until(lambda: router.index.blocks("w1") == 60)
    other = PromptBlocks(toks(BS * 40, seed=5))
    router.routed(other, workers[0])  # another document being prefilled on w1: a prediction there
    router.accounting.start(FlightKey.prefill("other"), "w1", prefill_tokens=other.num_tokens)
    chosen, cached = pick(router, PromptBlocks(doc + toks(20, seed=6)), workers)
    assert cached["w1"] == BS * 60 and chosen == "w1"


async def test_a_prompt_still_being_pulled_is_not_a_hit_on_its_decode_worker() -> None:
    """Seen on ``bench.serving.pd``: a document's second request went to the decode worker still pulling the
    first one's KV, was decided local on that predicted hit, computed the whole prompt there and held up the pulls
    headed to that worker. Precise index (its event subscribers not started: predictions only), one prefill and
    two decode workers."""
    router = KVRouter(KVRoutingSettings.model_validate(
        {"enabled": True, "seed": 1, "load": {"scrape_interval_s": 60}}))
    prefill = worker("p1", role=WorkerRole.PREFILL, port=9201, events="tcp://127.0.0.1:9301")
    decodes = [worker(name, role=WorkerRole.DECODE, port=9202 + i, events=f"tcp://127.0.0.1:{9302 + i}")
               for i, name in enumerate(("d1", "d2"))]
    router.sync(WorkerPool.of([prefill, *decodes]))
    try:
        await _pulled_prompt(router, prefill, decodes)
    finally:
        await router.stop()


async def _pulled_prompt(router: KVRouter, prefill, decodes) -> None:  # type: ignore[no-untyped-def]
    doc = toks(BS * 120, seed=7)
    first = PromptBlocks(doc + toks(20, seed=8))
    key = FlightKey.decode("first")
    # The strategy counts the first request's decode on d1 when it chooses it: prefilled on p1, pulled by d1.
    router.accounting.start(key, "d1", decode_blocks=first.num_blocks(BS), pull_tokens=first.num_tokens)
    router.routed(first, prefill)  # its remote prefill is done (the planner's observe) ...
    router.routed(first, decodes[0])  # ... and d1 is predicted to hold the prompt, while it still pulls it
    second = PromptBlocks(doc + toks(20, seed=9))

    def plan() -> tuple[str | None, int, bool]:
        ctx = router.context(second, [*decodes, prefill])
        decode = Pipeline(router.settings.decode, rng=random.Random(1)).select(ctx, decodes)
        prefill_selection = Pipeline(router.settings.prefill, rng=random.Random(1)).select(ctx, [prefill])
        return decode.worker_id, ctx.cached("d1"), router.decide(second, decode, prefill_selection).remote

    chosen, cached_d1, remote = plan()
    assert cached_d1 == 0 and chosen == "d2"  # not behind d1's pull, where it would compute the prompt again
    assert remote  # prefilled on p1, which holds the document, rather than from scratch on d2
    router.accounting.prefill_done(key)  # d1's first token: the KV arrived, the prediction counts again
    chosen, cached_d1, remote = plan()
    assert cached_d1 == BS * 120 and chosen == "d1" and not remote  # 20 tokens left: computed where it is held

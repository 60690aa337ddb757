"""KVRouter against simulated vLLM workers (litellm_disagg.sim, in-process, real HTTP and ZMQ on 127.0.0.1): events in
vLLM's wire format from an engine's block pool, tokens from the worker's /tokenize, load from its /metrics."""

from __future__ import annotations

import random

import httpx
import pytest

from litellm_disagg.engines.base import Endpoint
from litellm_disagg.routing.kv.router import KVRouter
from litellm_disagg.routing.kv.settings import KVRoutingSettings
from litellm_disagg.routing.pipeline.pipeline import Pipeline
from litellm_disagg.routing.pool import WorkerPool
from litellm_disagg.routing.request import DisaggRequest
from litellm_disagg.runtime_config import WorkerRole
from litellm_disagg.sim import SimSettings
from litellm_disagg.sim.settings import EngineSettings
from litellm_disagg.sim.worker import SimWorker
from tests.kv.zmq_pub import until

SYSTEM = "You are a careful assistant. " + " ".join(f"rule{i} is to be followed at all times." for i in range(60))


def sim_settings() -> SimSettings:
    engine = EngineSettings.model_validate({"num_gpu_blocks": 2048, "max_model_len": 4096, "block_size": 16})
    return SimSettings(engine=engine, kv_events=True).with_speedup(200.0)


def chat(user: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


@pytest.fixture
async def sims():  # type: ignore[no-untyped-def]
    workers = [SimWorker(f"sim-kv-{i}", WorkerRole.BOTH, sim_settings()) for i in range(2)]
    for w in workers:
        await w.start()
    client = httpx.AsyncClient(timeout=20)
    router = KVRouter(KVRoutingSettings.model_validate({"enabled": True, "seed": 0}), http_client=client)
    router.sync(WorkerPool.of([w.config for w in workers]))  # type: ignore[misc]
    await router.start()
    yield router, workers, client
    await router.stop()
    await client.aclose()
    for w in workers:
        await w.stop()


async def send(client: httpx.AsyncClient, worker: SimWorker, messages: list[dict[str, str]]) -> None:
    r = await client.post(
        f"{worker.base_url}/chat/completions",
        json={"model": worker.config.model, "messages": messages, "max_tokens": 2},
    )  # type: ignore[union-attr]
    assert r.status_code == 200, r.text


async def test_routing_follows_the_cache_of_a_simulated_engine(sims) -> None:  # type: ignore[no-untyped-def]
    router, (a, b), client = sims
    # ZMQ drops what a PUB sends before the SUB joined: warm up until the router hears from a
    i = 0

    async def warm() -> None:
        nonlocal i
        i += 1
        await send(client, a, [{"role": "user", "content": f"warm up {i} " + "word " * 30}])

    while router.event_stats()["sim-kv-0"].batches == 0:
        await warm()
    await send(client, a, chat("first question"))
    request = DisaggRequest(endpoint=Endpoint.CHAT, fields={"messages": chat("a different question")}, request_id="r")
    prompt = await router.prompt(request, [b.config])  # type: ignore[list-item]  # tokens from b's /tokenize
    assert prompt is not None and prompt.num_tokens > 500
    system_blocks = (prompt.num_tokens - 10) // 16
    await until(lambda: router.index.overlap(prompt.hashes(16)).get("sim-kv-0", 0) >= system_blocks - 2)

    candidates = [a.config, b.config]
    pipeline = Pipeline(router.settings.prefill, rng=random.Random(router.settings.seed))
    selection = pipeline.select(router.context(prompt, candidates), candidates)  # type: ignore[arg-type]
    assert selection.worker_id == "sim-kv-0"
    assert selection.breakdown["sim-kv-0"].cached_tokens >= (system_blocks - 2) * 16
    assert selection.breakdown["sim-kv-1"].cached_tokens == 0
    assert router.event_stats()["sim-kv-0"].skipped_blocks == 0

    # the engine's load, scraped
    await router.scraper.scrape_once()
    assert not router.scraper.get("sim-kv-0").stale

    # a reset cache (AllBlocksCleared) takes the entries with it
    assert (await client.post(f"{a.server_url}/reset_prefix_cache")).status_code == 200
    await until(lambda: router.index.overlap(prompt.hashes(16)) == {})
    assert router.event_stats()["sim-kv-0"].clears >= 1

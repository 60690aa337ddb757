"""KV-aware routing in precise mode against real vLLM CPU workers: the workers publish KV events over ZMQ, the
router's tokens (the model's own tokenizer and chat template, read by the proxy) hash to the same blocks the engines
report, and a repeated prefix goes to the worker that holds it; a cleared cache (AllBlocksCleared) and a departed
worker take their entries out of the index."""

from __future__ import annotations

import asyncio

import httpx
import litellm
import pytest

from litellm_disagg.discovery.file.settings import FileRegistrySettings
from litellm_disagg.plugin import DisaggPlugin
from litellm_disagg.settings import DisaggSettings

from .support.net import free_port, metric
from .support.procs import WorkerProc

pytestmark = pytest.mark.vllm

SYSTEM = "You are the archivist of a very long manual. " + " ".join(f"Section {i} says the value is {i * 7}." for i in range(45))


@pytest.fixture(scope="module")
def workers(tiny_model, tmp_path_factory):
    base = tmp_path_factory.mktemp("kv-vllm")
    registry = base / "registry"
    procs = [WorkerProc("decode", tiny_model, registry, base, wrapper_args=["--kv-events-port", str(free_port())],
                        env={"VLLM_SERVER_DEV_MODE": "1"}) for _ in range(2)]
    try:
        for p in procs:
            p.start()
        for p in procs:
            p.wait_ready()
        yield registry, procs
    finally:
        for p in procs:
            p.kill()


async def kv_router(registry, tiny_model):
    """A Router with the plugin attached, KV routing in precise mode, aggregated (the workers are decode workers).
    Predictions of where blocks land expire at once: routing must come from the engines' own events."""
    plugin = DisaggPlugin()
    router = litellm.Router(model_list=[], num_retries=0)
    settings = DisaggSettings(
        # A long TTL: a worker starved past the default 10 s (two shared cores) would leave the pool and the index,
        # which is not what these tests are about (the departure test withdraws its worker explicitly).
        registry=FileRegistrySettings(path=str(registry), poll_interval_s=0.1, ttl_s=120),
        kv_routing={"enabled": True, "seed": 0, "disaggregation": {"mode": "never"}, "index": {"predicted_ttl_s": 0.05},
                    "tokenizer": {"model_dirs": {"tiny": str(tiny_model)}}},
    )
    return plugin, router, await plugin.attach(router, settings)


async def both_workers(controller) -> None:
    """Until discovery has listed both workers to the router (bounded: the assertions that follow say the rest)."""
    for _ in range(100):
        if len(controller.pool.decode_candidates("tiny")) == 2:
            return
        await asyncio.sleep(0.1)


async def test_repeated_prefix_goes_to_the_worker_holding_it(workers, tiny_model, caplog):
    import logging
    caplog.set_level(logging.DEBUG, logger="litellm_disagg.routing.strategy")
    registry, procs = workers
    plugin, router, controller = await kv_router(registry, tiny_model)
    try:
        await both_workers(controller)

        async def ask(user: str) -> None:
            data = {"model": "tiny", "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}],
                    "max_tokens": 2, "temperature": 0}
            await plugin.async_pre_call_hook(None, None, data, "acompletion")
            await router.acompletion(**data)
            for _ in range(200):  # LiteLLM's background success event has ended this call's in-flight entry
                if all(controller.accounting.requests(p.worker_id) == 0 for p in procs):
                    return
                await asyncio.sleep(0.01)

        def served() -> list[float]:
            return [metric(p.url, "vllm:request_success_total") for p in procs]

        await ask("first question")
        first = served()
        holder = first.index(max(first))
        # The engine's BlockStored events arrive and rebuild the same hashes the router computes.
        for _ in range(50):
            if sum(s.stored_blocks for s in controller.kv.event_stats().values()) > 0:
                break
            await asyncio.sleep(0.1)
        assert sum(s.stored_blocks for s in controller.kv.event_stats().values()) > 0
        await asyncio.sleep(0.2)  # the prediction made when routing the first request has expired
        for i in range(4):
            # A conversation's next turn comes after the last one ended and was accounted for: LiteLLM reports the
            # end of a call from a background task and load is scraped every 0.25 s (a busier-looking holder with a
            # small cached prefix can otherwise lose to an idle worker: that trade-off is the scorer weights' job).
            await asyncio.sleep(1.0)
            await ask(f"follow-up question number {i}")
        after = served()
        assert after[holder] - first[holder] == 4, (first, after, [r.getMessage()[:600] for r in caplog.records if 'decode' in r.getMessage()])
        assert after[1 - holder] == first[1 - holder]
        # ... and the holder really reused its cache.
        hits = metric(procs[holder].url, "vllm:prompt_tokens_by_source_total", source="local_cache_hit")
        assert hits >= 4 * 128
    finally:
        await plugin.detach()


async def test_a_non_streamed_prompt_stops_counting_as_queued_before_its_answer(workers, tiny_model, monkeypatch):
    """A non-streamed call has no first chunk to say its prefill is over: the engine's own BlockStored event for the
    prompt's last full block does (``prefill_seen.py``), while the call is still generating."""
    from litellm_disagg.routing.kv import router as kv_router_module

    # The tiny model answers 700 tokens in a few tenths of a second: checked every 5 ms rather than the product's
    # 50, the test is about the signal, not about the interval (a CI run saw the answer come back first).
    monkeypatch.setattr(kv_router_module, "PREFILL_POLL_S", 0.005)
    registry, procs = workers
    plugin, router, controller = await kv_router(registry, tiny_model)
    try:
        await both_workers(controller)
        # The router's event subscriptions are fresh: until one of their batches has arrived, a prefill's events could
        # be published before the subscription took hold (ZMQ drops what a not-yet-joined subscriber would get).
        for i in range(20):
            if all(s.batches for s in controller.kv.event_stats().values()):
                break
            warm = {"model": "tiny", "max_tokens": 1, "temperature": 0,
                    "messages": [{"role": "system", "content": f"Warm-up {i}. {SYSTEM}"}, {"role": "user", "content": "hi"}]}
            await plugin.async_pre_call_hook(None, None, warm, "acompletion")
            await router.acompletion(**warm)
            for _ in range(20):
                if all(s.batches for s in controller.kv.event_stats().values()):
                    break
                await asyncio.sleep(0.1)
        assert all(s.batches for s in controller.kv.event_stats().values()), controller.kv.event_stats()
        for _ in range(200):  # LiteLLM's background success events have ended the warm-ups' in-flight entries
            if all(controller.accounting.requests(p.worker_id) == 0 for p in procs):
                break
            await asyncio.sleep(0.01)
        # A short prompt and a long answer: the window between the prefill's events and the answer is wide even on
        # two shared cores (the model's context is 1,024 tokens).
        manual = "A manual never seen before by either engine. " + " ".join(f"Clause {i} reads {i * 3}." for i in range(30))
        data = {"model": "tiny", "stream": False, "temperature": 0, "max_tokens": 700,
                "messages": [{"role": "system", "content": manual}, {"role": "user", "content": "recite it"}],
                "extra_body": {"min_tokens": 700, "ignore_eos": True}}
        await plugin.async_pre_call_hook(None, None, data, "acompletion")
        call = asyncio.create_task(router.acompletion(**data))
        queued_then_not: list[tuple[str, int, int]] = []
        while not call.done():
            for p in procs:
                if controller.accounting.requests(p.worker_id):
                    queued_then_not.append((p.worker_id, controller.accounting.requests(p.worker_id),
                                            controller.accounting.prefill_tokens(p.worker_id)))
            await asyncio.sleep(0.01)
        response = await call
        assert response.usage.completion_tokens == 700
        assert queued_then_not and queued_then_not[0][2] > 0  # sent: its prompt queued for prefill there
        # ... and while it was still generating, its prompt stopped counting as queued.
        assert any(inflight == 1 and queued == 0 for _, inflight, queued in queued_then_not), queued_then_not[::20]
        assert controller.kv.prefill_seen.seen >= 1
    finally:
        await plugin.detach()


async def test_a_cleared_cache_and_a_departed_worker_leave_the_index(workers, tiny_model):
    # Runs last in this module: it stops one of the module's workers.
    registry, procs = workers
    plugin, _router, controller = await kv_router(registry, tiny_model)
    kv = controller.kv
    assert kv is not None
    ids = [p.worker_id for p in procs]

    async def until(check, what: str, timeout_s: float = 20.0) -> None:
        for _ in range(int(timeout_s / 0.05)):
            if check():
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}: index {kv.index_stats()}, events {kv.event_stats()}")

    async def ask(user: str, worker: int) -> None:
        # Pinned by the request itself is not something the router offers: send straight to a worker's engine, as
        # another router would; the engine's events must still reach this router's index. A system prompt of its
        # own: blocks an engine cached before this router subscribed have parents it never saw (skipped, by design).
        system = f"Manual {worker} of this test, unlike the others. " + SYSTEM
        body = {"model": "tiny", "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
                "max_tokens": 2, "temperature": 0}
        async with httpx.AsyncClient(timeout=120) as client:
            r = await client.post(f"{procs[worker].url}/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text

    try:
        await until(lambda: len(controller.pool.decode_candidates("tiny")) == 2, "both workers")
        await ask("what is stored where?", 0)
        await ask("and here too?", 1)
        await until(lambda: kv.index.blocks(ids[0]) > 0 and kv.index.blocks(ids[1]) > 0, "both workers' blocks")

        async with httpx.AsyncClient(timeout=30) as client:
            r = await client.post(f"{procs[0].url}/reset_prefix_cache")
            assert r.status_code == 200, r.text
        # vLLM publishes the event with the next engine step's batch: a short request (under one block) makes one.
        async with httpx.AsyncClient(timeout=120) as client:
            r = await client.post(f"{procs[0].url}/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 1})
            assert r.status_code == 200, r.text
        await until(lambda: kv.event_stats()[ids[0]].clears >= 1 and kv.index.blocks(ids[0]) == 0, "AllBlocksCleared")
        assert kv.index.blocks(ids[1]) > 0  # the other worker's entries are untouched

        procs[1].terminate()  # drains, withdraws from discovery, stops vLLM
        await until(lambda: ids[1] not in kv.index.workers(), "the departed worker's slot to go", timeout_s=60)
        assert kv.index.blocks(ids[1]) == 0
        assert ids[1] not in kv.event_stats()
    finally:
        await plugin.detach()

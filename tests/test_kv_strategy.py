"""KV-aware routing through the strategy, in a real LiteLLM Router over simulated workers that publish KV events in
vLLM's wire format (precise mode): a repeated prefix goes where it is cached; conditional disaggregation."""

from __future__ import annotations

import asyncio

import litellm
import pytest

from litellm_disagg.discovery.file.registry import FileRegistry
from litellm_disagg.discovery.file.settings import FileRegistrySettings
from litellm_disagg.plugin import DisaggPlugin
from litellm_disagg.routing.accounting import FlightKey
from litellm_disagg.runtime_config import WorkerRole
from litellm_disagg.settings import DisaggSettings
from litellm_disagg.sim import SimCluster, SimSettings
from litellm_disagg.sim.settings import EngineSettings

SYSTEM = "You are a careful assistant. " + " ".join(f"rule{i} must be followed at all times." for i in range(80))


def sim_settings() -> SimSettings:
    engine = EngineSettings.model_validate({"num_gpu_blocks": 4096, "max_model_len": 8192, "block_size": 16})
    return SimSettings(engine=engine, kv_events=True).with_speedup(200.0)


async def routed_stack(tmp_path, disaggregation: dict, *, prefill: int = 2, decode: int = 3):
    registry = tmp_path / "registry"
    cluster = SimCluster(registry=FileRegistry(registry), settings=sim_settings(), heartbeat_interval_s=0.2, name="kv")
    await cluster.start(prefill=prefill, decode=decode)
    plugin = DisaggPlugin()
    router = litellm.Router(model_list=[], num_retries=0)
    settings = DisaggSettings(
        registry=FileRegistrySettings(path=str(registry), poll_interval_s=0.05),
        kv_routing={"enabled": True, "seed": 0, "disaggregation": disaggregation},
    )
    controller = await plugin.attach(router, settings)
    for _ in range(200):
        if len(controller.pool.decode_candidates("sim-model")) == decode:
            break
        await asyncio.sleep(0.05)
    return cluster, plugin, router, controller


async def ask(plugin, router, user: str) -> None:
    data = {"model": "sim-model", "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}], "max_tokens": 4}
    await plugin.async_pre_call_hook(None, None, data, "acompletion")
    await router.acompletion(**data)
    # The next turn of a conversation comes after this one ended and LiteLLM's (background) success event told the
    # router so; back to back, the holder would still look busy with this request.
    # Likewise the workers' own /metrics, which the router scrapes every 0.25 s, must show them idle again.
    controller = plugin.controller
    lookup = controller.kv.scraper.lookup
    for _ in range(300):
        loads = [lookup()(w.worker_id) for w in controller.pool.workers]
        if all(controller.accounting.requests(w.worker_id) == 0 for w in controller.pool.workers) and not any(
            load.running or load.waiting for load in loads
        ):
            return
        await asyncio.sleep(0.01)


def served(cluster: SimCluster, role: WorkerRole) -> dict[str, int]:
    return {w.worker_id: w.engine.stats.finished for w in cluster.workers_with(role)}


async def test_repeated_prefix_goes_where_it_is_cached(tmp_path, caplog):
    import logging

    caplog.set_level(logging.DEBUG, logger="litellm_disagg.routing.strategy")
    cluster, plugin, router, controller = await routed_stack(tmp_path, {"mode": "always"})
    try:
        await ask(plugin, router, "first question")
        first_decode = {k for k, v in served(cluster, WorkerRole.DECODE).items() if v}
        first_prefill = {k for k, v in served(cluster, WorkerRole.PREFILL).items() if v}
        assert len(first_decode) == 1 and len(first_prefill) == 1
        # KV events from both workers that served reach the index (the predicted entries would do meanwhile); on two
        # loaded cores a fixed pause was not always enough, so wait for the events themselves.
        served_by = first_decode | first_prefill
        for _ in range(400):
            stats = controller.kv.event_stats()
            if all(stats.get(w) is not None and stats[w].stored_blocks > 0 for w in served_by):
                break
            await asyncio.sleep(0.025)
        for i in range(6):
            await ask(plugin, router, f"follow-up {i}")
        decode_counts = served(cluster, WorkerRole.DECODE)
        prefill_counts = served(cluster, WorkerRole.PREFILL)
        picks = [r.getMessage().split(": ", 1)[-1][:260] for r in caplog.records if "decode picked" in r.getMessage()]
        assert {k for k, v in decode_counts.items() if v} == first_decode, (decode_counts, picks)
        assert {k for k, v in prefill_counts.items() if v} == first_prefill, prefill_counts
        stats = controller.kv.event_stats()
        assert sum(s.batches for s in stats.values()) > 0  # precise mode: the index was fed by events
    finally:
        await plugin.detach()
        await cluster.close()


@pytest.mark.parametrize(
    ("disaggregation", "remote"),
    [
        ({"mode": "never"}, False),
        ({"mode": "auto", "min_remote_prefill_tokens": 100_000}, False),
        ({"mode": "auto", "min_remote_prefill_tokens": 16}, True),
    ],
)
async def test_conditional_disaggregation(tmp_path, disaggregation, remote):
    cluster, plugin, router, _ = await routed_stack(tmp_path, disaggregation, prefill=1, decode=1)
    try:
        await ask(plugin, router, "a question")
        prefilled = sum(served(cluster, WorkerRole.PREFILL).values())
        [decode] = cluster.workers_with(WorkerRole.DECODE)
        assert (prefilled == 1) is remote
        assert (decode.engine.stats.prompt_tokens_external_kv_transfer > 0) is remote
    finally:
        await plugin.detach()
        await cluster.close()


async def test_saturated_prefill_pool_makes_the_decode_worker_prefill(tmp_path):
    cluster, plugin, router, controller = await routed_stack(tmp_path, {"mode": "auto"}, prefill=1, decode=1)
    try:
        [prefill] = cluster.workers_with(WorkerRole.PREFILL)
        # The router believes a huge backlog of prompt tokens is queued on the only prefill worker.
        controller.accounting.start(FlightKey.prefill("backlog"), prefill.worker_id, prefill_tokens=5_000_000)
        await ask(plugin, router, "a question while the prefill pool is saturated")
        assert prefill.engine.stats.finished == 0
        controller.accounting.finish(FlightKey.prefill("backlog"))
    finally:
        await plugin.detach()
        await cluster.close()


async def test_a_completed_answer_is_handed_to_the_token_cache(tmp_path):
    """Through a real LiteLLM Router: the success event carries the request's messages, the worker that served it
    and the answer, which the plugin hands to ``KVRouter.answered`` (the next turn then only tokenizes its question)."""
    cluster, plugin, router, controller = await routed_stack(tmp_path, {"mode": "never"})
    calls: list[tuple] = []

    async def answered(worker_id, fields, answer):
        calls.append((worker_id, fields, answer))
        return 0

    controller.kv.answered = answered
    try:
        await ask(plugin, router, "first question")
        for _ in range(200):
            if calls:
                break
            await asyncio.sleep(0.01)
        assert len(calls) == 1, calls
        worker_id, fields, answer = calls[0]
        decode = {k for k, v in served(cluster, WorkerRole.DECODE).items() if v}
        assert {worker_id} == decode
        assert fields["messages"][-1] == {"role": "user", "content": "first question"}
        assert isinstance(answer, str) and answer
    finally:
        await plugin.detach()
        await cluster.close()


async def test_a_remote_prefill_counts_its_pull_on_the_decode_worker_until_it_ends(tmp_path):
    """The decode of a remotely prefilled request is counted with the prompt tokens it pulls (``pull_tokens``): until
    they arrive, the router's prediction that the decode worker holds the prompt is not a hit there yet
    (``routing/kv/in_flight_prefix.py``)."""
    cluster, plugin, router, controller = await routed_stack(tmp_path, {"mode": "always"}, prefill=1, decode=1)
    accounting = controller.accounting
    started: list[tuple[FlightKey, str, int]] = []
    start = accounting.start

    def recording_start(key, worker_id, **kwargs):
        started.append((key, worker_id, kwargs.get("pull_tokens", 0)))
        start(key, worker_id, **kwargs)

    accounting.start = recording_start
    try:
        await ask(plugin, router, "a question prefilled remotely")
        [decode] = cluster.workers_with(WorkerRole.DECODE)
        assert decode.engine.stats.prompt_tokens_external_kv_transfer > 0
        pulls = [(wid, tokens) for key, wid, tokens in started if key.phase == "decode"]
        assert len(pulls) == 1 and pulls[0][0] == decode.worker_id and pulls[0][1] > 200, started
        assert accounting.pull_tokens(decode.worker_id) == 0  # the request ended
    finally:
        await plugin.detach()
        await cluster.close()

"""A Consul outage seen from the router: it keeps routing on the last known workers and picks up changes when Consul
is back (Consul is the test double of its HTTP API; no Consul server can run here)."""

import asyncio

import litellm

from litellm_disagg.discovery.consul.registry import ConsulRegistry
from litellm_disagg.discovery.consul.settings import ConsulRegistrySettings
from litellm_disagg.plugin import DisaggPlugin
from litellm_disagg.runtime_config import RuntimeConfig, WorkerState
from litellm_disagg.settings import DisaggSettings

from .consul_double import ConsulDouble
from .support.fake_worker import ANSWER, FakeWorker
from .support.net import free_port
from .test_consul_registry import FAST

MODEL = "fake-model"


def config(worker: FakeWorker, role: str) -> RuntimeConfig:
    return RuntimeConfig(worker_id=worker.name, model=MODEL, role=role, base_url=f"{worker.url}/v1",
                         transfer=worker.transfer, kv_capacity_blocks=100,
                         block_size=16, state=WorkerState.READY)


async def test_router_routes_through_a_consul_outage_and_follows_changes_after():
    workers = [FakeWorker(name, free_port()) for name in ("p1", "d1", "d2")]
    for w in workers:
        await w.start()
    p1, d1, d2 = workers
    plugin = DisaggPlugin()
    router = litellm.Router(model_list=[], num_retries=0)
    async with ConsulDouble() as consul:
        settings = ConsulRegistrySettings(address=consul.address, check_ttl_s=60, **FAST)
        writer = ConsulRegistry(settings, environ={})
        try:
            await writer.publish(config(p1, "prefill"))
            await writer.publish(config(d1, "decode"))
            controller = await plugin.attach(router, DisaggSettings(registry=settings, sync_interval_s=0.05))
            for _ in range(100):
                if controller.pool.decode_candidates(MODEL):
                    break
                await asyncio.sleep(0.05)

            async def ask() -> str:
                data = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
                await plugin.async_pre_call_hook(None, None, data, "acompletion")
                return (await router.acompletion(**data)).choices[0].message.content

            assert await ask() == ANSWER
            await consul.stop()
            await asyncio.sleep(1.0)  # the watch fails and retries meanwhile
            for _ in range(3):
                assert await ask() == ANSWER  # the last known workers still serve, disaggregated
            assert [w.worker_id for w in controller.pool.decode_candidates(MODEL)] == ["d1"]

            await consul.start()
            await writer.publish(config(d2, "decode"))
            for _ in range(100):
                if len(controller.pool.decode_candidates(MODEL)) == 2:
                    break
                await asyncio.sleep(0.05)
            assert {w.worker_id for w in controller.pool.decode_candidates(MODEL)} == {"d1", "d2"}
            assert router.get_deployment(model_id="litellm-disagg/d2") is not None
        finally:
            await plugin.detach()
            await writer.close()
            for w in workers:
                await w.stop()

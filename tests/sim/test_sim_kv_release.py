"""Prefill KV that no decode reads is released at once (routing/kv_release.py), through the real LiteLLM Router over
simulated vLLM workers, which hold a prefill's blocks for its decode (a 480 s lease here) and free them when a decode
worker refuses a request carrying their transfer params, as vLLM does (sim/rejection.py)."""

from __future__ import annotations

import asyncio
import os

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

litellm = pytest.importorskip("litellm")

from litellm_disagg.discovery.file.registry import FileRegistry  # noqa: E402
from litellm_disagg.discovery.file.settings import FileRegistrySettings  # noqa: E402
from litellm_disagg.engines.vllm.transfer import KVTransferParams, VllmNixlProtocol  # noqa: E402
from litellm_disagg.plugin import DisaggPlugin  # noqa: E402
from litellm_disagg.runtime_config import WorkerRole  # noqa: E402
from litellm_disagg.settings import DisaggSettings  # noqa: E402
from litellm_disagg.sim import SimCluster  # noqa: E402

from .conftest import fast_settings  # noqa: E402

MESSAGES = [{"role": "system", "content": "You are a simulated model. " * 30}, {"role": "user", "content": "Hi."}]


async def eventually(check, what: str, deadline_s: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    while not check():
        assert loop.time() < end, what
        await asyncio.sleep(0.05)


@pytest.fixture
def plugin() -> DisaggPlugin:
    return DisaggPlugin()


async def test_a_refused_decode_frees_the_prefill_lease(client):
    async with SimCluster(settings=fast_settings(), name="rej") as cluster:
        await cluster.start(prefill=1, decode=1)
        prefill = cluster.workers_with(WorkerRole.PREFILL)[0]
        decode = cluster.workers_with(WorkerRole.DECODE)[0]
        body = {"model": "sim-model", "messages": MESSAGES, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}}
        r = await client.post(f"{prefill.base_url}/chat/completions", json=body)
        handle = KVTransferParams.model_validate(r.json()["kv_transfer_params"])
        assert prefill.engine.scheduler.leases
        path, release = VllmNixlProtocol().release_unread(handle)
        r = await client.post(f"{decode.server_url}/{path}", json=release)
        assert r.status_code == 404
        assert not prefill.engine.scheduler.leases and prefill.engine.pool.usage == 0


async def test_a_decode_call_that_fails_after_the_prefill_releases_its_kv(tmp_path, plugin):
    registry_dir = tmp_path / "registry"
    async with SimCluster(
        registry=FileRegistry(registry_dir, ttl_s=60), settings=fast_settings(), heartbeat_interval_s=0.2
    ) as cluster:
        await cluster.start(prefill=1, decode=2)
        prefill = cluster.workers_with(WorkerRole.PREFILL)[0]
        dead, live = cluster.workers_with(WorkerRole.DECODE)
        router = litellm.Router(model_list=[], num_retries=0)
        settings = DisaggSettings(
            registry=FileRegistrySettings(path=str(registry_dir), ttl_s=60, poll_interval_s=0.05),
            sync_interval_s=0.05, failure_cooldown_s=120,
        )
        controller = await plugin.attach(router, settings)
        try:
            await eventually(lambda: len(controller.pool.decode_candidates("sim-model")) == 2, "both decode workers")
            # The dead worker is still in discovery (its entry lives until its TTL); the live one cools down, so the
            # dead one is chosen: the prefill runs, then LiteLLM's decode call finds the port closed.
            await cluster.crash(dead.worker_id)
            controller.cooldown.failed(live.worker_id)
            data = {"model": "sim-model", "messages": MESSAGES, "max_tokens": 5}
            await plugin.async_pre_call_hook(None, None, data, "acompletion")
            with pytest.raises(Exception):  # noqa: B017 (LiteLLM's connection error, whichever class it maps to)
                await router.acompletion(**data)
            assert prefill.engine.stats.finished == 1  # the prefill did run and holds the prompt's blocks
            await eventually(lambda: not prefill.engine.scheduler.leases, "the unread KV to be released")
            assert prefill.engine.pool.usage == 0 and controller.releases.sent == 1
        finally:
            await plugin.detach()

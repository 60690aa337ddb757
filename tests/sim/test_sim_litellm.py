"""The real LiteLLM Router with our plugin, routing to simulated workers it discovers through a FileRegistry:
the simulator is a drop-in for vLLM as far as the router is concerned."""

from __future__ import annotations

import asyncio
import os

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network fetch at import

litellm = pytest.importorskip("litellm")

from litellm_disagg.discovery.file.registry import FileRegistry  # noqa: E402
from litellm_disagg.discovery.file.settings import FileRegistrySettings  # noqa: E402
from litellm_disagg.plugin import DisaggPlugin  # noqa: E402
from litellm_disagg.runtime_config import WorkerRole  # noqa: E402
from litellm_disagg.settings import DisaggSettings  # noqa: E402
from litellm_disagg.sim import SimCluster  # noqa: E402

from .conftest import by_source, fast_settings  # noqa: E402

MESSAGES = [
    {"role": "system", "content": "You are a simulated model. " * 8},
    {"role": "user", "content": "Route me through prefill and decode."},
]


@pytest.fixture
def plugin() -> DisaggPlugin:
    # Built outside the event loop (a sync fixture): inside a running loop the plugin assumes it runs in the proxy
    # and imports litellm.proxy.proxy_server to follow its router, a synchronous import of many seconds.
    return DisaggPlugin()


async def test_litellm_router_disaggregates_across_simulated_workers(tmp_path, client, plugin):
    registry_dir = tmp_path / "registry"
    async with SimCluster(
        registry=FileRegistry(registry_dir), settings=fast_settings(), heartbeat_interval_s=0.2
    ) as cluster:
        await cluster.start(prefill=1, decode=1)
        prefill = cluster.workers_with(WorkerRole.PREFILL)[0]
        decode = cluster.workers_with(WorkerRole.DECODE)[0]
        router = litellm.Router(model_list=[], num_retries=0)
        settings = DisaggSettings(
            registry=FileRegistrySettings(path=str(registry_dir), poll_interval_s=0.05), sync_interval_s=0.05
        )
        controller = await plugin.attach(router, settings)
        try:
            for _ in range(100):
                if controller.pool.decode_candidates("sim-model"):
                    break
                await asyncio.sleep(0.02)
            data = {"model": "sim-model", "messages": MESSAGES, "max_tokens": 9}
            await plugin.async_pre_call_hook(None, None, data, "acompletion")
            response = await router.acompletion(**data)
            routed = response.choices[0].message.content

            stream_data = {"model": "sim-model", "messages": MESSAGES, "max_tokens": 9, "stream": True}
            await plugin.async_pre_call_hook(None, None, stream_data, "acompletion")
            streamed = "".join(
                [c.choices[0].delta.content or "" async for c in await router.acompletion(**stream_data)]
            )
        finally:
            await plugin.detach()

        sources = await by_source(client, decode)
        assert sources["external_kv_transfer"] > 0 and sources["local_compute"] == 0  # decode computed no prompt
        assert prefill.engine.stats.finished == 2 and decode.engine.stats.finished == 2
        direct = await client.post(f"{decode.base_url}/chat/completions", json={"messages": MESSAGES, "max_tokens": 9})
        assert routed == streamed == direct.json()["choices"][0]["message"]["content"]

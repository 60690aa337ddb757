"""The planner in the proxy: the controller starts it when ``planner.enabled`` (an SDK Router with the plugin
attached, file discovery, fake workers), it reads the proxy's own TTFT histogram and asks a worker through the
registry to change role; off by default."""

from __future__ import annotations

import asyncio
from pathlib import Path

import litellm
from prometheus_client import REGISTRY

from litellm_disagg.discovery.file.registry import FileRegistry
from litellm_disagg.discovery.file.settings import FileRegistrySettings
from litellm_disagg.observability import metrics as m
from litellm_disagg.plugin import DisaggPlugin
from litellm_disagg.runtime_config import RuntimeConfig, WorkerRole, WorkerState
from litellm_disagg.settings import DisaggSettings

from ..support.fake_worker import FakeWorker
from ..support.net import free_port

MODEL = "planner-proxy-model"


def config(worker: FakeWorker, role: WorkerRole) -> RuntimeConfig:
    return RuntimeConfig(worker_id=worker.name, model=MODEL, role=role, base_url=f"{worker.url}/v1",
                         transfer=worker.transfer, kv_capacity_blocks=100, block_size=16, state=WorkerState.READY,
                         allowed_roles=(WorkerRole.PREFILL, WorkerRole.DECODE, WorkerRole.BOTH))


async def test_controller_runs_the_planner_which_requests_a_role_change(tmp_path: Path) -> None:
    workers = [FakeWorker(name, free_port()) for name in ("pp-p1", "pp-d1", "pp-d2")]
    for w in workers:
        await w.start()
    # Published once, never heartbeated: a TTL past the loop's minute, so late steps on a loaded machine do not see
    # the entries lapse (the default 10 s) before the move is requested.
    registry_settings = FileRegistrySettings(path=str(tmp_path / "registry"), poll_interval_s=0.05, ttl_s=600)
    writer = FileRegistry.from_settings(registry_settings)
    plugin = DisaggPlugin()
    router = litellm.Router(model_list=[], num_retries=0)
    try:
        await writer.publish(config(workers[0], WorkerRole.PREFILL))
        for w in workers[1:]:
            await writer.publish(config(w, WorkerRole.DECODE))
        settings = DisaggSettings(registry=registry_settings, sync_interval_s=0.05, planner={
            "enabled": True, "interval_s": 0.1, "hysteresis_steps": 2, "min_samples": 1, "ttft_ms": 500,
            "window_s": 5})
        controller = await plugin.attach(router, settings)
        loop = controller.planner_loop
        assert loop is not None
        # requests whose TTFT misses the 500 ms SLO by far, as the proxy's request metrics record them
        for _ in range(600):  # a minute at most: the loop's steps come late on a loaded machine
            m.TTFT.labels(MODEL, "disaggregated").observe(2.5)
            m.ITL.labels(MODEL, "disaggregated").observe(0.005)
            if (tmp_path / "registry" / "pp-d1.role.json").exists():
                break
            await asyncio.sleep(0.1)
        assert loop.leader and REGISTRY.get_sample_value("litellm_disagg_planner_enabled") == 1
        requests = [r async for r in _first(writer.role_requests("pp-d1"))]
        assert requests[0] is not None and requests[0].role is WorkerRole.PREFILL
        await controller.stop()
        assert controller.planner_loop is None and REGISTRY.get_sample_value("litellm_disagg_planner_enabled") == 0
    finally:
        if plugin.controller is not None:
            await plugin.controller.stop()
        await writer.close()
        for w in workers:
            await w.stop()


async def _first(stream):  # type: ignore[no-untyped-def]
    async for item in stream:
        yield item
        return


def test_planner_is_off_by_default() -> None:
    assert DisaggSettings().planner.enabled is False

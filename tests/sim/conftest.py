"""Helpers shared by the simulator's tests: fast settings, a client, metric reading."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from litellm_disagg.sim import SimSettings
from litellm_disagg.sim.settings import EngineSettings, TimingSettings
from litellm_disagg.sim.worker import SimWorker

SPEEDUP = 200.0


def fast_settings(*, timing: dict[str, object] | None = None, kv_events: bool = False, **engine: object) -> SimSettings:
    """Default timing at ``SPEEDUP`` (a 64-token decode takes about 6 ms) unless ``timing`` overrides it, a modest
    cache; ``engine`` overrides EngineSettings fields."""
    base = {"num_gpu_blocks": 2048, "max_model_len": 4096} | engine
    timing_settings = TimingSettings.model_validate({"speedup": SPEEDUP} | (timing or {}))
    return SimSettings(engine=EngineSettings.model_validate(base), timing=timing_settings, kv_events=kv_events)


@pytest.fixture
async def client():
    async with httpx.AsyncClient(timeout=httpx.Timeout(20.0)) as c:
        yield c


async def metric(client: httpx.AsyncClient, worker: SimWorker, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels``, read from the worker's /metrics."""
    text = (await client.get(f"{worker.server_url}/metrics")).text
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


async def by_source(client: httpx.AsyncClient, worker: SimWorker) -> dict[str, float]:
    return {
        source: await metric(client, worker, "vllm:prompt_tokens_by_source_total", source=source)
        for source in ("local_compute", "local_cache_hit", "external_kv_transfer")
    }


def chat_body(content: str = "Tell me about paged attention.", **extra: object) -> dict[str, object]:
    return {"model": "sim-model", "messages": [{"role": "user", "content": content}], "max_tokens": 12} | extra

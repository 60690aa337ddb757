"""SGLang, TensorRT-LLM and vLLM push-connector workers (simulated) behind the real LiteLLM proxy (``python -m litellm.proxy.proxy_cli``)
with KV routing on: answers equal the aggregated ones, the KV arrives by transfer, and a crashed prefill worker
(failover) or a draining one costs no request."""

from __future__ import annotations

import asyncio
import os

import httpx
import pytest
import yaml

from litellm_disagg.discovery.file.registry import FileRegistry
from litellm_disagg.runtime_config import WorkerRole
from litellm_disagg.sim import SimCluster

from ..support.procs import MASTER_KEY, ProxyProc
from ..support.proxy_configs import plugin_only
from .conftest import fast_settings, metric

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

SYSTEM = {"role": "system", "content": "You are a simulated model answering about disaggregated serving. " * 6}


def proxy_config(registry_dir, *, events: bool) -> dict:
    return plugin_only({
        "registry": {"backend": "file", "path": str(registry_dir), "poll_interval_s": 0.1},
        "sync_interval_s": 0.2,
        "kv_routing": {
            "enabled": True,
            "disaggregation": {"mode": "always"},
            "index": {"mode": "precise" if events else "approximate"},
        },
    }, router={"num_retries": 2, "timeout": 60})


def messages(i: int) -> list[dict]:
    return [SYSTEM, {"role": "user", "content": f"Question {i}: how does the KV cache move?"}]


async def chat(c: httpx.AsyncClient, i: int, **extra) -> httpx.Response:
    return await c.post("/v1/chat/completions", json={"model": "sim-model", "messages": messages(i), "max_tokens": 8} | extra)


async def aggregated(c: httpx.AsyncClient, worker, i: int) -> str:
    r = await c.post(f"{worker.base_url}/chat/completions", json={"messages": messages(i), "max_tokens": 8})
    return r.json()["choices"][0]["message"]["content"]


async def streamed(c: httpx.AsyncClient, i: int) -> str:
    parts = []
    async with c.stream("POST", "/v1/chat/completions",
                        json={"model": "sim-model", "messages": messages(i), "max_tokens": 8, "stream": True}) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                import json

                chunk = json.loads(line[6:])
                parts += [(ch.get("delta") or {}).get("content") or "" for ch in chunk.get("choices", [])]
    return "".join(parts)


@pytest.mark.parametrize("engine_name", ["sglang", "trtllm", "vllm-push"])
async def test_engine_behind_the_litellm_proxy(engine_name, tmp_path):
    registry_dir = tmp_path / "registry"
    events = engine_name != "trtllm"  # trtllm-serve publishes no KV event stream
    engine, _, transfer = engine_name.partition("-")  # vllm-push: vLLM's NixlPushConnector, concurrent
    settings = fast_settings(kv_events=events).model_copy(update={"engine_name": engine, "kv_transfer": transfer or "pull"})
    config_path = tmp_path / "proxy.yaml"
    config_path.write_text(yaml.safe_dump(proxy_config(registry_dir, events=events)))
    async with SimCluster(registry=FileRegistry(registry_dir), settings=settings, heartbeat_interval_s=0.2,
                          name=f"sim-{engine_name}") as cluster:
        await cluster.start(prefill=2, decode=1)
        decode = cluster.workers_with(WorkerRole.DECODE)[0]
        proxy = ProxyProc(registry_dir, tmp_path, config=config_path).start()
        try:
            await asyncio.to_thread(proxy.wait_ready, "sim-model", 180)
            headers = {"Authorization": f"Bearer {MASTER_KEY}"}
            async with httpx.AsyncClient(base_url=proxy.url, headers=headers, timeout=60) as c:
                await asyncio.sleep(0.5)  # both prefill workers known to the router
                # Disaggregated, equal to aggregated, the prompt's KV moved to the decode worker.
                before = await metric(c, decode, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer")
                r = await chat(c, 0)
                assert r.status_code == 200, r.text
                assert r.json()["choices"][0]["message"]["content"] == await aggregated(c, decode, 0)
                assert await streamed(c, 1) == await aggregated(c, decode, 1)
                after = await metric(c, decode, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer")
                assert after > before
                prefills = cluster.workers_with(WorkerRole.PREFILL)
                assert sum(p.engine.stats.finished for p in prefills) >= 2

                # Failover: a prefill worker crashes (its registry entry stays until its TTL); no request fails.
                await cluster.crash(prefills[0].worker_id)
                for i in range(2, 6):
                    r = await chat(c, i)
                    assert r.status_code == 200, r.text
                    assert r.json()["choices"][0]["message"]["content"] == await aggregated(c, decode, i)

                # Drain: a new prefill worker joins, the survivor drains while requests keep coming.
                await cluster.add(WorkerRole.PREFILL)
                await asyncio.sleep(0.5)
                drain = asyncio.create_task(cluster.drain(prefills[1].worker_id, timeout_s=30, settle_s=0.5))
                results = await asyncio.gather(*(chat(c, i) for i in range(6, 12)))
                assert [x.status_code for x in results] == [200] * 6
                assert await drain
                r = await chat(c, 12)
                assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == await aggregated(c, decode, 12)
        finally:
            await asyncio.to_thread(proxy.stop)

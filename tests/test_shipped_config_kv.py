"""The shipped ``proxy_config.yaml``, as ``litellm-disagg up`` completes it (``stack_config.py``), in the real LiteLLM
proxy over simulated prefill and decode workers that publish KV events: the router is KV-aware by default.

- the prefix index fills from the workers' KV events;
- a conversation's second turn is routed to a worker the index says holds its prefix, and that worker reuses it;
- each request is disaggregated or not as the cost model decides; where the proxy's ``mode`` label says it was, the
  prompt's KV arrived on the decode worker by transfer.

(The same with real vLLM workers through ``up`` itself: ``tests/test_up.py``.) About 30-60 s on 2 loaded cores,
most of it the proxy's start.
"""

from __future__ import annotations

import asyncio

import httpx
from prometheus_client.parser import text_string_to_metric_families

from litellm_disagg.discovery.file.registry import FileRegistry
from litellm_disagg.runtime_config import WorkerRole
from litellm_disagg.sim import SimCluster
from litellm_disagg.stack_config import write_stack_config

from .sim.conftest import fast_settings
from .support.net import free_port, metric
from .support.procs import MASTER_KEY, ROOT, ProxyProc

MODEL = "sim-model"
SIM_TOKENIZER = "python:litellm_disagg.sim.hf_tokenizer:load"
DOCUMENT = " ".join(f"Item {i}: the {c} box holds {i * 7} marbles and sits on shelf {i % 5}." for i, c in
                    enumerate(["red", "green", "blue", "amber", "violet", "white", "black", "grey"] * 4))


async def proxy_samples(port: int, name: str) -> list[tuple[dict[str, str], float]]:
    async with httpx.AsyncClient(timeout=10) as c:
        text = (await c.get(f"http://127.0.0.1:{port}/metrics")).text
    return [(s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]


async def total(port: int, name: str, **labels: str) -> float:
    return sum(v for lab, v in await proxy_samples(port, name) if all(lab.get(k) == w for k, w in labels.items()))


async def modes(port: int) -> dict[str, float]:
    out: dict[str, float] = {}
    for labels, value in await proxy_samples(port, "litellm_disagg_requests_total"):
        out[labels["mode"]] = out.get(labels["mode"], 0.0) + value
    return out


async def test_the_shipped_config_routes_kv_aware_from_events_and_decides_per_request(tmp_path):
    import yaml

    registry_dir = tmp_path / "registry"
    path, kv_on = write_stack_config(ROOT / "proxy_config.yaml", tmp_path, served_model=MODEL, model_dir=SIM_TOKENIZER)
    assert kv_on
    config = yaml.safe_load(path.read_text())
    metrics_port = free_port()
    config["litellm_disagg"]["metrics"] = {"port": metrics_port}  # read without the master key
    path.write_text(yaml.safe_dump(config, sort_keys=False))

    sim = SimCluster(registry=FileRegistry(registry_dir), settings=fast_settings(kv_events=True),
                     heartbeat_interval_s=0.5, name="shipped")
    await sim.__aenter__()
    proxy = None
    try:
        await sim.start(prefill=1, decode=1)
        decode = sim.workers_with(WorkerRole.DECODE)[0]
        urls = [w.server_url for w in (*sim.workers_with(WorkerRole.PREFILL), decode)]
        proxy = ProxyProc(registry_dir, tmp_path, config=path).start()
        await asyncio.to_thread(proxy.wait_ready, MODEL, 300)

        async with httpx.AsyncClient(base_url=proxy.url, headers={"Authorization": f"Bearer {MASTER_KEY}"},
                                     timeout=60) as client:

            async def ask(messages: list[dict[str, str]]) -> tuple[dict, str]:
                before, external = await modes(metrics_port), await asyncio.to_thread(
                    metric, decode.server_url, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer")
                r = await client.post("/v1/chat/completions", json={"model": MODEL, "messages": messages,
                                                                    "max_tokens": 6, "temperature": 0})
                assert r.status_code == 200, r.text
                reply = r.json()
                after = await modes(metrics_port)
                [mode] = [m for m, n in after.items() if n > before.get(m, 0)]
                if mode == "disaggregated":
                    arrived = await asyncio.to_thread(metric, decode.server_url, "vllm:prompt_tokens_by_source_total",
                                                      source="external_kv_transfer")
                    assert arrived > external
                return reply, mode

            first = [{"role": "system", "content": DOCUMENT}, {"role": "user", "content": "Summarise in one line."}]
            reply, first_mode = await ask(first)
            for _ in range(100):  # the workers' BlockStored events reach the proxy's index
                if (await total(metrics_port, "litellm_disagg_kv_event_batches_total") > 0
                        and await total(metrics_port, "litellm_disagg_kv_index_blocks", kind="held") > 0):
                    break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError("the prefix index never filled from KV events")

            cached = await total(metrics_port, "litellm_disagg_cached_prompt_tokens_total")
            hits = sum([await asyncio.to_thread(metric, u, "vllm:prompt_tokens_by_source_total", source="local_cache_hit")
                        for u in urls])
            second = [*first, {"role": "assistant", "content": reply["choices"][0]["message"]["content"]},
                      {"role": "user", "content": "Which colour comes first?"}]
            _, second_mode = await ask(second)
            assert await total(metrics_port, "litellm_disagg_cached_prompt_tokens_total") - cached >= 64
            after_hits = sum([await asyncio.to_thread(metric, u, "vllm:prompt_tokens_by_source_total",
                                                      source="local_cache_hit") for u in urls])
            assert after_hits - hits >= 64
            assert {first_mode, second_mode} <= {"disaggregated", "local_prefill"}
            # the start-up heap is out of full garbage collections (gc_freeze.py: one took 0.8 s in front of 32 workers)
            assert "left out of full garbage collections" in proxy.log.read_text()
    finally:
        if proxy is not None:
            await asyncio.to_thread(proxy.stop)
        await sim.__aexit__(None, None, None)

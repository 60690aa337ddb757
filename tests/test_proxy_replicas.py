"""Two replicas of the real LiteLLM proxy (``python -m litellm.proxy.proxy_cli``) over the same simulated workers, KV
routing on, as users run them behind one address: each replica subscribes to every worker's KV event stream itself.

A document is sent through replica A only; replica B has never routed anything, has no channel to A, and still holds
the document's blocks in its prefix index (from the workers' events) and routes the document's follow-up question to
the worker that cached it. Without B's own subscription its index would be empty (``held`` blocks stay 0) and its
pick would be a random one of four idle workers per document.

About 40-70 s on 2 loaded cores, most of it the two proxies' start.
"""

from __future__ import annotations

import asyncio

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

from litellm_disagg.discovery.file.registry import FileRegistry
from litellm_disagg.runtime_config import WorkerRole
from litellm_disagg.sim import SimCluster
from litellm_disagg.sim.worker import SimWorker

from .sim.conftest import fast_settings
from .support.net import free_port
from .support.procs import MASTER_KEY, ProxyProc

MODEL = "sim-model"
SIM_TOKENIZER = "python:litellm_disagg.sim.hf_tokenizer:load"
WORKERS = 4
DOCUMENTS = 4


def document(i: int) -> str:
    colours = ["red", "green", "blue", "amber", "violet", "white", "black", "grey"]
    return f"Inventory {i} of warehouse {i * 13}. " + " ".join(
        f"Shelf {i}.{k}: the {colours[(k + i) % 8]} box holds {k * 7 + i} marbles." for k in range(40))


def proxy_config(registry_dir: str, metrics_port: int) -> dict:
    return {
        "model_list": [],
        "litellm_settings": {"callbacks": ["litellm_disagg.plugin.handler"], "drop_params": False},
        "general_settings": {"master_key": "os.environ/LITELLM_MASTER_KEY"},
        "router_settings": {"num_retries": 1, "timeout": 60},
        "litellm_disagg": {
            "registry": {"backend": "file", "path": registry_dir, "poll_interval_s": 0.1},
            "sync_interval_s": 0.2,
            "metrics": {"port": metrics_port},
            "kv_routing": {
                "enabled": True,
                "disaggregation": {"mode": "never"},
                "index": {"mode": "precise"},
                "tokenizer": {"model_dirs": {MODEL: SIM_TOKENIZER}},
            },
        },
    }


async def proxy_metric(port: int, name: str, **labels: str) -> float:
    async with httpx.AsyncClient(timeout=10) as c:
        text = (await c.get(f"http://127.0.0.1:{port}/metrics")).text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def finished(workers: list[SimWorker]) -> dict[str, int]:
    return {w.worker_id: w.engine.stats.finished for w in workers}


async def idle(workers: list[SimWorker]) -> None:
    """Every worker's /metrics shows nothing running or waiting again (both replicas scrape it every 0.25 s)."""
    async with httpx.AsyncClient(timeout=10) as c:
        for _ in range(300):
            busy = 0.0
            for w in workers:
                text = (await c.get(f"{w.server_url}/metrics")).text
                busy += sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
                            if s.name in ("vllm:num_requests_running", "vllm:num_requests_waiting"))
            if busy == 0:
                await asyncio.sleep(0.6)  # two scrape periods, so both replicas have seen it
                return
            await asyncio.sleep(0.05)
    raise AssertionError("the workers never went idle")


async def test_a_second_proxy_replica_routes_to_the_holder_from_its_own_kv_subscription(tmp_path):
    registry_dir = tmp_path / "registry"
    ports = {"A": free_port(), "B": free_port()}
    proxies: dict[str, ProxyProc] = {}
    async with SimCluster(registry=FileRegistry(registry_dir), settings=fast_settings(kv_events=True),
                          heartbeat_interval_s=0.2, name="replicas") as sim:
        try:
            await sim.start(both=WORKERS)
            workers = sim.workers_with(WorkerRole.BOTH)
            for name, port in ports.items():
                (tmp_path / name).mkdir()
                path = tmp_path / name / "proxy.yaml"
                path.write_text(yaml.safe_dump(proxy_config(str(registry_dir), port), sort_keys=False))
                proxies[name] = ProxyProc(registry_dir, tmp_path / name, config=path).start()
            await asyncio.gather(*(asyncio.to_thread(p.wait_ready, MODEL, 300) for p in proxies.values()))

            async with httpx.AsyncClient(timeout=60) as client:
                # ZMQ drops what a worker publishes before a subscriber has joined: wait until B hears every worker
                # (short requests straight to the workers, past both proxies).
                for attempt in range(200):
                    heard = [await proxy_metric(ports["B"], "litellm_disagg_kv_event_batches_total",
                                                worker=w.worker_id) for w in workers]
                    if all(heard):
                        break
                    for w in workers:
                        r = await client.post(f"{w.base_url}/chat/completions", json={
                            "messages": [{"role": "user", "content": f"warm-up {attempt} " + "word " * 40}],
                            "max_tokens": 2})
                        assert r.status_code == 200, r.text
                    await asyncio.sleep(0.1)
                else:
                    raise AssertionError(f"replica B never received KV events from every worker: {heard}")
                await idle(workers)
                held_before = await proxy_metric(ports["B"], "litellm_disagg_kv_index_blocks", kind="held")

                async def ask(proxy: str, messages: list[dict[str, str]]) -> str:
                    """Send through one replica; the worker that served it."""
                    before = finished(workers)
                    r = await client.post(f"{proxies[proxy].url}/v1/chat/completions",
                                          headers={"Authorization": f"Bearer {MASTER_KEY}"},
                                          json={"model": MODEL, "messages": messages, "max_tokens": 4,
                                                "temperature": 0})
                    assert r.status_code == 200, r.text
                    await idle(workers)
                    [served] = [w for w, n in finished(workers).items() if n > before[w]]
                    return served

                holders: dict[int, str] = {}
                for i in range(DOCUMENTS):
                    batches = await proxy_metric(ports["B"], "litellm_disagg_kv_event_batches_total")
                    holders[i] = await ask("A", [{"role": "system", "content": document(i)},
                                                 {"role": "user", "content": "How many shelves are there?"}])
                    for _ in range(200):  # the holder's BlockStored events reach B too
                        if await proxy_metric(ports["B"], "litellm_disagg_kv_event_batches_total") > batches:
                            break
                        await asyncio.sleep(0.05)

                # B has routed nothing, yet its index holds the documents' blocks: it learned them from the events.
                held = await proxy_metric(ports["B"], "litellm_disagg_kv_index_blocks", kind="held")
                assert held - held_before >= DOCUMENTS * 20, (held_before, held)
                assert await proxy_metric(ports["B"], "litellm_disagg_requests_total") == 0

                # Follow-ups through B, in the reverse order, each to its document's holder.
                picks = {i: await ask("B", [{"role": "system", "content": document(i)},
                                            {"role": "user", "content": "Which box is on shelf 3?"}])
                         for i in reversed(range(DOCUMENTS))}
                assert picks == holders, f"B's picks {picks} against the holders {holders} (A's placements)"
                cached = await proxy_metric(ports["B"], "litellm_disagg_cached_prompt_tokens_total")
                assert cached >= DOCUMENTS * 20 * 16
        finally:
            for p in proxies.values():
                await asyncio.to_thread(p.stop)

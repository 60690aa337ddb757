"""Two replicas of the real LiteLLM proxy (``python -m litellm.proxy.proxy_cli``) over the same simulated workers, KV
routing on, as users run them behind one address: each replica subscribes to every worker's KV event stream itself;
and two replicas that share their in-flight counts through LiteLLM's Redis (a real ``redis-server``).

A document is sent through replica A only; replica B has never routed anything, has no channel to A, and still holds
the document's blocks in its prefix index (from the workers' events) and routes the document's follow-up question to
the worker that cached it. Without B's own subscription its index would be empty (``held`` blocks stay 0) and its
pick would be a random one of four idle workers per document.

About 40-70 s on 2 loaded cores, most of it the two proxies' start.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client import CollectorRegistry, multiprocess
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis

from litellm_disagg.discovery.file.registry import FileRegistry
from litellm_disagg.runtime_config import WorkerRole
from litellm_disagg.sim import SimCluster
from litellm_disagg.sim.worker import SimWorker

from .sim.conftest import fast_settings
from .support.net import free_port
from .support.procs import MASTER_KEY, ProxyProc
from .support.redis_server import redis_server

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


@asynccontextmanager
async def long_stream(client: httpx.AsyncClient, url: str, headers: dict[str, str]) -> AsyncIterator[AsyncIterator[str]]:
    """A 400-token chat stream through the proxy at ``url``, read up to its first data line (its call is in flight);
    the rest of its lines, to read or to drop (leaving the block cuts the stream)."""
    async with client.stream("POST", f"{url}/v1/chat/completions", headers=headers, json={
        "model": MODEL, "messages": [{"role": "user", "content": "Tell me a long story."}],
        "max_tokens": 400, "stream": True, "temperature": 0,
    }) as stream:
        assert stream.status_code == 200
        lines = stream.aiter_lines()
        async for line in lines:
            if line.startswith("data:"):
                break
        yield lines


def shared_inflight_config(registry_dir: str, metrics_port: int, redis_port: int) -> dict:
    """Least-inflight routing (no KV routing, so no /metrics scrape shows a replica the other's requests), with the
    Redis LiteLLM's ``router_settings`` name for its replicas, which the in-flight exchange uses too."""
    return {
        "model_list": [],
        "litellm_settings": {"callbacks": ["litellm_disagg.plugin.handler"], "drop_params": False},
        "general_settings": {"master_key": "os.environ/LITELLM_MASTER_KEY"},
        "router_settings": {"num_retries": 0, "timeout": 120, "redis_host": "127.0.0.1", "redis_port": redis_port},
        "litellm_disagg": {
            "registry": {"backend": "file", "path": registry_dir, "poll_interval_s": 0.1},
            "sync_interval_s": 0.2,
            "metrics": {"port": metrics_port},
            "picker": "least_inflight",
            "shared_inflight": {"interval_s": 0.1},
        },
    }


async def test_replicas_sharing_litellms_redis_count_each_others_requests_in_flight(tmp_path):
    """A long stream runs through replica A; replica B, which has routed nothing, places its request on the other
    worker. Least-inflight ties rotate in candidate order, the same in both replicas: without the exchange B's first
    pick is the worker A's first pick loaded. Two decode workers and no prefill worker: each request runs whole on
    one worker (the aggregated fallback), so a worker's finished count says where a request ran."""
    registry_dir = tmp_path / "registry"
    ports = {"A": free_port(), "B": free_port()}
    proxies: dict[str, ProxyProc] = {}
    slow = fast_settings(timing={"speedup": 1.0})  # 400 tokens stream for about 8 s
    with redis_server(tmp_path / "redis") as redis_port:
        async with SimCluster(registry=FileRegistry(registry_dir), settings=slow, heartbeat_interval_s=0.2,
                              name="shared-inflight") as sim:
            try:
                await sim.start(decode=2)
                workers = sim.workers_with(WorkerRole.DECODE)
                for name, port in ports.items():
                    (tmp_path / name).mkdir()
                    path = tmp_path / name / "proxy.yaml"
                    path.write_text(yaml.safe_dump(shared_inflight_config(str(registry_dir), port, redis_port),
                                                   sort_keys=False))
                    proxies[name] = ProxyProc(registry_dir, tmp_path / name, config=path).start()
                await asyncio.gather(*(asyncio.to_thread(p.wait_ready, MODEL, 300) for p in proxies.values()))
                for name in proxies:  # each hears the other through Redis
                    await _until_metric(ports[name], "litellm_disagg_shared_inflight_replicas", 1)

                headers = {"Authorization": f"Bearer {MASTER_KEY}"}
                async with httpx.AsyncClient(timeout=120) as client:
                    before = finished(workers)
                    async with long_stream(client, proxies["A"].url, headers) as lines:  # A's call in flight
                        await _until_metric(ports["B"], "litellm_disagg_shared_inflight_requests", 1)
                        r = await client.post(f"{proxies['B'].url}/v1/chat/completions", headers=headers, json={
                            "model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
                        assert r.status_code == 200, r.text
                        middle = finished(workers)
                        [b_ran_on] = [w for w, n in middle.items() if n > before[w]]
                        async for _line in lines:  # A's stream to its end
                            pass
                    for _ in range(200):
                        [*a_ran_on] = [w for w, n in finished(workers).items() if n > middle[w]]
                        if a_ran_on:
                            break
                        await asyncio.sleep(0.05)
                    assert a_ran_on != [b_ran_on], f"B sent its request to {b_ran_on}, where A's stream ran"
                    assert await proxy_metric(ports["B"], "litellm_disagg_shared_inflight_up") == 1
            finally:
                for p in proxies.values():
                    await asyncio.to_thread(p.stop)


async def _settled(port: int, *, idle: list[str]) -> None:
    """The proxy's processes count nothing in flight on ``idle`` workers, and the most any of them hears from the
    others through Redis is the one stream."""
    for _ in range(600):
        own = [await proxy_metric(port, "litellm_disagg_worker_inflight_requests", worker=w) for w in idle]
        if not any(own) and await proxy_metric(port, "litellm_disagg_shared_inflight_requests") == 1:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"in-flight counts on :{port} never settled")


async def _until_metric(port: int, name: str, at_least: float) -> None:
    for _ in range(600):
        if await proxy_metric(port, name) >= at_least:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{name} on :{port} never reached {at_least}")


def routed_by_process(multiproc_dir: Path) -> dict[str, float]:
    """``litellm_disagg_requests_total`` per proxy process, read from prometheus_client's per-process files (one
    ``counter_<pid>.db`` each; the proxy's own exposition sums them)."""
    counts: dict[str, float] = {}
    for db in multiproc_dir.glob("counter_*.db"):
        with tempfile.TemporaryDirectory() as one:
            shutil.copy(db, one)
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry, path=one)
            counts[db.stem.removeprefix("counter_")] = sum(
                s.value for f in registry.collect() for s in f.samples if s.name == "litellm_disagg_requests_total")
    return counts


async def test_proxy_processes_of_one_proxy_share_in_flight_counts_through_redis(tmp_path):
    """``litellm --num_workers 2``: two processes behind one port, each with its own router and plugin. With LiteLLM's
    Redis both join the exchange under their own replica ids, so whichever process takes a request sees the stream
    the other one is running: while it runs, every short request (on a fresh connection, so the kernel hands them
    to either process) goes to the other worker. Without the exchange the process that did not route the stream
    sees two idle workers and sends every other request to the busy one."""
    registry_dir = tmp_path / "registry"
    multiproc = tmp_path / "prometheus"
    multiproc.mkdir()
    port = free_port()
    # 400 tokens stream for about 80 s: longer than the short requests below take on a loaded machine (at 8 s, one
    # CI run's stream had ended by the fourth); the stream is cut when the test has its answer.
    slow = fast_settings(timing={"speedup": 0.1})
    with redis_server(tmp_path / "redis") as redis_port:
        async with SimCluster(registry=FileRegistry(registry_dir), settings=slow, heartbeat_interval_s=0.2,
                              name="shared-inflight-processes") as sim:
            proxy: ProxyProc | None = None
            try:
                await sim.start(decode=2)
                workers = sim.workers_with(WorkerRole.DECODE)
                path = tmp_path / "proxy.yaml"
                path.write_text(yaml.safe_dump(shared_inflight_config(str(registry_dir), port, redis_port),
                                               sort_keys=False))
                proxy = ProxyProc(registry_dir, tmp_path, config=path, args=["--num_workers", "2"],
                                  env={"PROMETHEUS_MULTIPROC_DIR": str(multiproc)}).start()
                await asyncio.to_thread(proxy.wait_ready, MODEL, 300)
                store = Redis(host="127.0.0.1", port=redis_port)
                try:
                    for _ in range(600):  # both processes write their field
                        if await store.hlen("litellm_disagg:inflight") == 2:
                            break
                        await asyncio.sleep(0.05)
                    else:
                        raise AssertionError(f"fields in Redis: {await store.hkeys('litellm_disagg:inflight')}")
                finally:
                    await store.aclose()

                headers = {"Authorization": f"Bearer {MASTER_KEY}", "Connection": "close"}
                async with httpx.AsyncClient(timeout=120) as client:
                    before = finished(workers)
                    async with long_stream(client, proxy.url, headers):  # in flight on one worker
                        # the process that did not route it has read it from Redis (livemax over the processes)
                        await _until_metric(port, "litellm_disagg_shared_inflight_requests", 1)
                        streaming = [w for w in workers if w.engine.scheduler.num_running]
                        assert len(streaming) == 1, [w.engine.scheduler.num_running for w in workers]
                        stream_process = {pid for pid, n in routed_by_process(multiproc).items() if n}
                        short: list[str] = []
                        while len(short) < 40:
                            # Each request after the last one's end has reached both processes' counts (its own
                            # at once, the other's within an exchange or two): back to back, a process could still
                            # count the last short request on the other worker, tie, and take the stream's.
                            await _settled(port, idle=[w.worker_id for w in workers if w is not streaming[0]])
                            r = await client.post(f"{proxy.url}/v1/chat/completions", headers=headers, json={
                                "model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
                            assert r.status_code == 200, r.text
                            after = finished(workers)
                            [ran_on] = [w for w, n in after.items() if n > before[w]]
                            before = after
                            short.append(ran_on)
                            assert streaming[0].engine.scheduler.num_running, f"the stream ended after {short}"
                            routed = routed_by_process(multiproc)
                            others = [n for pid, n in routed.items() if pid not in stream_process]
                            if len(short) >= 6 and others and min(others) >= 3:
                                break  # the process without the stream has taken 3 or more of them
                        else:
                            pytest.fail(f"the kernel gave every short request to one process: {routed}")
                        assert streaming[0].worker_id not in short, (
                            f"short requests went to {short}; the stream runs on {streaming[0].worker_id}")
            finally:
                if proxy is not None:
                    await asyncio.to_thread(proxy.stop)


async def test_replicas_with_kv_routing_pool_the_decisions_measurements_through_redis(tmp_path):
    """KV routing and LiteLLM's Redis: both replicas publish the local-or-remote decision's measurements
    (``routing/kv/shared_estimates.py``), and replica B, which routes nothing, fits its stall charge on the
    inter-token gaps of A's stream (a replica sees only its own streams' gaps)."""
    registry_dir = tmp_path / "registry"
    ports = {"A": free_port(), "B": free_port()}
    proxies: dict[str, ProxyProc] = {}
    with redis_server(tmp_path / "redis") as redis_port:
        async with SimCluster(registry=FileRegistry(registry_dir), settings=fast_settings(), heartbeat_interval_s=0.2,
                              name="shared-estimates") as sim:
            try:
                await sim.start(decode=2)
                for name, port in ports.items():
                    config = proxy_config(str(registry_dir), port)
                    config["router_settings"] |= {"redis_host": "127.0.0.1", "redis_port": redis_port}
                    config["litellm_disagg"]["shared_inflight"] = {"estimates_interval_s": 0.2}
                    (tmp_path / name).mkdir()
                    path = tmp_path / name / "proxy.yaml"
                    path.write_text(yaml.safe_dump(config, sort_keys=False))
                    proxies[name] = ProxyProc(registry_dir, tmp_path / name, config=path).start()
                await asyncio.gather(*(asyncio.to_thread(p.wait_ready, MODEL, 300) for p in proxies.values()))
                redis = Redis(host="127.0.0.1", port=redis_port)
                try:
                    for _ in range(600):  # both replicas publish under the estimates key
                        if await redis.hlen("litellm_disagg:estimates") == 2:
                            break
                        await asyncio.sleep(0.05)
                    assert await redis.hlen("litellm_disagg:estimates") == 2
                finally:
                    await redis.aclose()
                gaps = "litellm_disagg_cost_model_decode_gaps"
                assert await proxy_metric(ports["B"], gaps, kind="base") == 0
                headers = {"Authorization": f"Bearer {MASTER_KEY}"}
                async with httpx.AsyncClient(timeout=120) as client:
                    async with long_stream(client, proxies["A"].url, headers) as lines:
                        async for _line in lines:  # A's stream to its end: hundreds of gaps, all A's own
                            pass
                await _until_metric(ports["A"], gaps, 100)
                await _until_metric(ports["B"], gaps, 100)  # A's gaps, through Redis
            finally:
                for p in proxies.values():
                    await asyncio.to_thread(p.stop)

"""Every client path through the real LiteLLM proxy (``python -m litellm.proxy.proxy_cli``), over in-process workers:
recording fakes (what exactly reaches a worker) and simulated vLLM workers (which token ids each side computed).

- client transfer metadata never reaches a worker, on any path that can carry it: top level, ``extra_body``,
  ``vllm_xargs`` (at either level), ``/v1/completions``, ``/v1/responses``, ``/v1/messages``;
- the ``/vllm/...`` pass-through route answers a clean 400 for a disaggregated group and reaches no worker;
- the prefill computes exactly the decode's prompt: Anthropic ``/v1/messages`` (system prompt, tools) and
  ``cache_salt`` are carried into the prefill; on simulated workers, whose decode compares the prompt token ids
  the prefill computed with its own, the whole prompt arrives by transfer and no transfer is refused;
- a client's own short ``timeout`` does not put a worker into failure cooldown (a worker's 500 does).

One proxy for the module (about 30-60 s on 2 loaded cores, most of it the proxy's start).
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from litellm_disagg.discovery.file.registry import FileRegistry
from litellm_disagg.runtime_config import RuntimeConfig, WorkerRole, WorkerState
from litellm_disagg.sim import SimCluster

from .sim.conftest import fast_settings, metric
from .support.fake_worker import FakeWorker
from .support.net import free_port
from .support.procs import MASTER_KEY, ProxyProc
from .support.proxy_configs import plugin_only

FAKE = "fake-model"
EVIL = {"do_remote_prefill": True, "remote_engine_id": "evil-engine", "remote_block_ids": [[0]],
        "remote_host": "10.6.6.6", "remote_port": 1}
SYSTEM = "You answer questions about disaggregated serving, briefly. " * 4
TOOLS = [{"name": "lookup", "description": "Look a term up", "input_schema": {
    "type": "object", "properties": {"term": {"type": "string"}}, "required": ["term"]}}]


class Paths:
    def __init__(self, tmp_path):
        self.tmp = tmp_path
        self.registry_dir = tmp_path / "registry"
        self.metrics_port = free_port()
        self.fakes: dict[str, FakeWorker] = {}

    async def start(self) -> None:
        writer = FileRegistry(self.registry_dir)
        for name, role in (("p1", "prefill"), ("d1", "decode")):
            worker = FakeWorker(name, free_port(), free_port())
            await worker.start()
            self.fakes[name] = worker
            await writer.publish(RuntimeConfig(worker_id=name, model=FAKE, role=role, base_url=f"{worker.url}/v1",
                                               transfer=worker.transfer, kv_capacity_blocks=1000, block_size=16,
                                               state=WorkerState.READY))
        self.sim = SimCluster(registry=FileRegistry(self.registry_dir), settings=fast_settings(),
                              heartbeat_interval_s=0.5, name="paths")
        await self.sim.__aenter__()
        await self.sim.start(prefill=1, decode=1)
        config = plugin_only({
            # The fakes do not heartbeat: a TTL longer than the module.
            "registry": {"backend": "file", "path": str(self.registry_dir), "poll_interval_s": 0.1, "ttl_s": 3600},
            "sync_interval_s": 0.2,
            "failure_cooldown_s": 30,
            "metrics": {"port": self.metrics_port},
        }, router={"num_retries": 0})
        path = self.tmp / "proxy.yaml"
        path.write_text(yaml.safe_dump(config))
        self.proxy = ProxyProc(self.registry_dir, self.tmp, config=path).start()
        await asyncio.to_thread(self.proxy.wait_ready, FAKE, 300)
        await asyncio.to_thread(self.proxy.wait_ready, "sim-model", 60)
        self.client = httpx.AsyncClient(base_url=self.proxy.url, headers={"Authorization": f"Bearer {MASTER_KEY}"},
                                        timeout=60)

    async def stop(self) -> None:
        if hasattr(self, "client"):
            await self.client.aclose()
        if hasattr(self, "proxy"):
            await asyncio.to_thread(self.proxy.stop)
        if hasattr(self, "sim"):
            await self.sim.__aexit__(None, None, None)
        for worker in self.fakes.values():
            await worker.stop()

    async def recorded(self) -> dict[str, list[dict]]:
        """What each fake worker received since the last call (then forgotten)."""
        seen = {}
        async with httpx.AsyncClient(timeout=10) as c:
            for name, worker in self.fakes.items():
                seen[name] = (await c.get(f"{worker.url}/_requests")).json()
                await c.post(f"{worker.url}/_behaviour", json={"requests": []})
        return seen

    async def proxy_metric(self, name: str, **labels: str) -> float:
        """The sum of the plugin's samples of ``name`` matching ``labels`` (its metrics port)."""
        async with httpx.AsyncClient(timeout=10) as c:
            text = (await c.get(f"http://127.0.0.1:{self.metrics_port}/metrics")).text
        return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
                   if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()))

    async def cooling(self, worker_id: str) -> float:
        await asyncio.sleep(1.0)  # five refreshes of the pool gauges (sync_interval_s)
        return await self.proxy_metric("litellm_disagg_worker_cooling_down", worker=worker_id)

    async def failures_settled(self, before: float) -> float:
        """Wait until LiteLLM's failure event (a background task) counted one more failed request."""
        for _ in range(200):
            now = await self.proxy_metric("litellm_disagg_request_failures_total", model=FAKE)
            if now > before:
                return now
            await asyncio.sleep(0.05)
        raise AssertionError("the failure event never ran")


@pytest.fixture(scope="module")
async def paths(tmp_path_factory):
    p = Paths(tmp_path_factory.mktemp("paths"))
    try:
        await p.start()
        yield p
    finally:
        await p.stop()


CHAT = {"model": FAKE, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
PATHS = [
    ("top level", "/v1/chat/completions", CHAT | {"kv_transfer_params": EVIL}),
    ("extra_body", "/v1/chat/completions", CHAT | {"extra_body": {"kv_transfer_params": EVIL}}),
    ("vllm_xargs", "/v1/chat/completions", CHAT | {"vllm_xargs": {"kv_transfer_params": json.dumps(EVIL)}}),
    ("vllm_xargs as a string", "/v1/chat/completions", CHAT | {"vllm_xargs": {"kv_transfer_params": "evil-engine"}}),
    ("extra_body's vllm_xargs", "/v1/chat/completions",
     CHAT | {"extra_body": {"vllm_xargs": {"kv_transfer_params": json.dumps(EVIL)}}}),
    ("text completion", "/v1/completions", {"model": FAKE, "prompt": "hello", "max_tokens": 4, "kv_transfer_params": EVIL}),
    ("responses", "/v1/responses", {"model": FAKE, "input": "hello", "kv_transfer_params": EVIL,
                                    "extra_body": {"kv_transfer_params": EVIL}}),
    ("anthropic messages", "/v1/messages", {"model": FAKE, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}],
                                            "kv_transfer_params": EVIL, "extra_body": {"kv_transfer_params": EVIL}}),
]


@pytest.mark.parametrize(("case", "path", "body"), PATHS, ids=[c for c, _, _ in PATHS])
async def test_client_transfer_metadata_reaches_no_worker_on_any_path(paths, case, path, body):
    await paths.recorded()
    r = await paths.client.post(path, json=body)
    assert r.status_code == 200, r.text[:500]
    seen = await paths.recorded()
    assert seen["d1"], "the request reached no decode worker"
    for worker, requests in seen.items():
        for request in requests:
            assert "evil" not in json.dumps(request["body"]), (worker, request["body"])


@pytest.mark.parametrize("path", ["/vllm/v1/chat/completions", "/vllm/chat/completions", "/vllm/v1/completions"])
async def test_the_passthrough_route_refuses_a_disaggregated_group_cleanly(paths, path):
    await paths.recorded()
    r = await paths.client.post(path, json=CHAT | {"kv_transfer_params": EVIL})
    assert r.status_code == 400, r.text[:500]
    assert "served disaggregated" in r.json()["error"]["message"]
    assert await paths.recorded() == {"p1": [], "d1": []}
    assert (await paths.client.post("/v1/chat/completions", json=CHAT)).status_code == 200  # the proxy keeps serving


async def test_anthropic_messages_and_cache_salt_reach_the_prefill_as_the_decode_sees_them(paths):
    await paths.recorded()
    r = await paths.client.post("/v1/messages", json={
        "model": FAKE, "max_tokens": 4, "system": SYSTEM, "tools": TOOLS,
        "messages": [{"role": "user", "content": "What is a KV cache?"}]})
    assert r.status_code == 200, r.text[:500]
    r = await paths.client.post("/v1/chat/completions", json=CHAT | {"cache_salt": "tenant-a"})
    assert r.status_code == 200, r.text[:500]
    seen = await paths.recorded()
    assert len(seen["p1"]) == len(seen["d1"]) == 2
    for prefill, decode in zip(seen["p1"], seen["d1"], strict=True):
        for key in ("messages", "tools", "cache_salt"):
            assert prefill["body"].get(key) == decode["body"].get(key), key
    assert seen["p1"][0]["body"]["messages"][0] == {"role": "system", "content": SYSTEM}
    assert seen["p1"][1]["body"]["cache_salt"] == "tenant-a"


async def test_the_prefill_computes_the_decodes_prompt_token_for_token(paths):
    # Simulated vLLM: the decode compares the token ids the prefill computed (its lease) with its own prompt's; any
    # difference is a refused transfer (vllm:nixl_num_failed_transfers_total) and a local recompute.
    decode = paths.sim.workers_with(WorkerRole.DECODE)[0]
    async with httpx.AsyncClient(timeout=30) as c:
        moved = await metric(c, decode, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer")
        failed = await metric(c, decode, "vllm:nixl_num_failed_transfers_total")
        prompts = await metric(c, decode, "vllm:prompt_tokens_total")
        for body in (
            {"path": "/v1/messages", "model": "sim-model", "max_tokens": 6, "system": SYSTEM, "tools": TOOLS,
             "messages": [{"role": "user", "content": "Which worker holds the KV?"}]},
            {"path": "/v1/chat/completions", "model": "sim-model", "max_tokens": 6, "cache_salt": "tenant-b",
             "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "And after a crash?"}]},
        ):
            r = await paths.client.post(body.pop("path"), json=body)
            assert r.status_code == 200, r.text[:500]
        prompts = await metric(c, decode, "vllm:prompt_tokens_total") - prompts
        assert prompts > 2 * 40  # both prompts (the system prompt alone is longer) reached the decode worker
        assert await metric(c, decode, "vllm:nixl_num_failed_transfers_total") == failed
        # The decode recomputes only the last prompt token of each (as vLLM does); the rest came by transfer.
        assert await metric(c, decode, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer") - moved >= prompts - 2


async def test_a_clients_own_short_timeout_puts_no_worker_in_cooldown(paths):
    for _ in range(60):  # an earlier test's failure may still cool d1 (failure_cooldown_s)
        if await paths.cooling("d1") == 0:
            break
    failures = await paths.proxy_metric("litellm_disagg_request_failures_total", model=FAKE)
    faults = await paths.proxy_metric("litellm_disagg_request_failures_total", model=FAKE, cause="worker")
    # The decode worker stalls far longer than the client's own timeout: the timeout fires whatever the machine's
    # load (a 1 ms timeout on an instant fake answered 200 in a fresh-clone CI run).
    async with httpx.AsyncClient(timeout=10) as c:
        await c.post(f"{paths.fakes['d1'].url}/_behaviour", json={"decode_delay_s": 30})
        try:
            r = await paths.client.post("/v1/chat/completions", json=CHAT | {"timeout": 0.5})
        finally:
            await c.post(f"{paths.fakes['d1'].url}/_behaviour", json={"decode_delay_s": 0})
    assert r.status_code == 408, r.text[:500]
    failures = await paths.failures_settled(failures)
    assert await paths.proxy_metric("litellm_disagg_request_failures_total", model=FAKE, cause="worker") == faults
    assert await paths.cooling("d1") == 0
    # The worker's own failure, for contrast: a 500 from the decode worker is its fault and cools it down.
    async with httpx.AsyncClient(timeout=10) as c:
        await c.post(f"{paths.fakes['d1'].url}/_behaviour", json={"decode_status": 500})
        try:
            r = await paths.client.post("/v1/chat/completions", json=CHAT)
            assert r.status_code >= 500
            await paths.failures_settled(failures)
        finally:
            await c.post(f"{paths.fakes['d1'].url}/_behaviour", json={"decode_status": 200})
    assert await paths.proxy_metric("litellm_disagg_request_failures_total", model=FAKE, cause="worker") == faults + 1
    assert await paths.cooling("d1") == 1

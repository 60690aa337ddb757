"""The NixlConnector prefill -> decode protocol across simulated workers in one process."""

from __future__ import annotations

import asyncio
import json

import pytest

from litellm_disagg.engines.base import Endpoint
from litellm_disagg.engines.vllm.transfer import KVTransferParams, build_prefill_body
from litellm_disagg.runtime_config import WorkerRole
from litellm_disagg.sim import SimCluster

from .conftest import by_source, chat_body, fast_settings, metric

PROMPT = "Explain disaggregated serving: prefill on one worker, decode on another. " * 6


@pytest.fixture
async def cluster():
    async with SimCluster(settings=fast_settings(kv_lease_timeout_s=30)) as c:
        await c.start(prefill=1, decode=1, both=1)
        yield c


def roles(cluster: SimCluster):
    return (
        cluster.workers_with(WorkerRole.PREFILL)[0],
        cluster.workers_with(WorkerRole.DECODE)[0],
        cluster.workers_with(WorkerRole.BOTH)[0],
    )


async def prefill(client, worker, request: dict, endpoint: Endpoint = Endpoint.CHAT, request_id: str = "pd-1") -> dict:
    body = build_prefill_body(endpoint, "sim-model", request)  # exactly what the router sends
    r = await client.post(f"{worker.base_url}/{endpoint.value}", json=body, headers={"X-Request-Id": request_id})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 1
    return r.json()["kv_transfer_params"]


async def test_prefill_then_decode_moves_the_kv_and_matches_aggregated_output(cluster, client):
    p, d, both = roles(cluster)
    request = chat_body(PROMPT, max_tokens=24)
    params = await prefill(client, p, request)
    parsed = KVTransferParams.model_validate(params)
    assert parsed.usable and parsed.do_remote_prefill and not parsed.do_remote_decode
    assert parsed.remote_engine_id == p.engine.engine_id and parsed.remote_request_id.startswith("chatcmpl-pd-1")
    assert (parsed.remote_host, parsed.remote_port, parsed.tp_size) == ("127.0.0.1", p.config.transfer.port, 1)
    n_prompt = params["remote_num_tokens"]
    assert len(params["remote_block_ids"][0]) == -(-n_prompt // 16)
    assert await metric(client, p, "vllm:kv_cache_usage_perc") > 0  # the blocks wait for the decode

    before = await by_source(client, d)
    decoded = await client.post(
        f"{d.base_url}/chat/completions",
        json={**request, "kv_transfer_params": parsed.for_decode()},
        headers={"X-Request-Id": "pd-1"},
    )
    assert decoded.status_code == 200
    after = await by_source(client, d)
    assert after["external_kv_transfer"] - before["external_kv_transfer"] == n_prompt
    assert after["local_compute"] == before["local_compute"]
    assert decoded.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == n_prompt
    assert await metric(client, p, "vllm:kv_cache_usage_perc") == 0  # released once pulled
    assert await metric(client, d, "vllm:nixl_xfer_time_seconds_count") == 1

    aggregated = await client.post(f"{both.base_url}/chat/completions", json=request)
    assert decoded.json()["choices"][0]["message"]["content"] == aggregated.json()["choices"][0]["message"]["content"]
    assert len(aggregated.json()["choices"][0]["message"]["content"].split()) == 24


async def test_streaming_decode_of_a_text_completion(cluster, client):
    p, d, both = roles(cluster)
    request = {"model": "sim-model", "prompt": PROMPT, "max_tokens": 10}
    params = await prefill(client, p, request, Endpoint.COMPLETIONS, "pd-2")
    r = await client.post(f"{d.base_url}/completions", json={**request, "stream": True, "kv_transfer_params": params})
    text = "".join(
        json.loads(line[6:])["choices"][0]["text"] for line in r.text.splitlines() if line.startswith("data: {")
    )
    aggregated = await client.post(f"{both.base_url}/completions", json=request)
    assert text == aggregated.json()["choices"][0]["text"]
    assert (await by_source(client, d))["external_kv_transfer"] > 0


async def test_decode_uses_its_own_prefix_cache_and_pulls_only_the_rest(cluster, client):
    p, d, _ = roles(cluster)
    first = chat_body(PROMPT + "First question?")
    await client.post(
        f"{d.base_url}/chat/completions",
        json={**first, "kv_transfer_params": await prefill(client, p, first, request_id="a")},
    )
    before = await by_source(client, d)
    second = chat_body(PROMPT + "Second question?")
    params = await prefill(client, p, second, request_id="b")
    await client.post(f"{d.base_url}/chat/completions", json={**second, "kv_transfer_params": params})
    after = await by_source(client, d)
    hit = after["local_cache_hit"] - before["local_cache_hit"]
    assert hit >= 64 and hit % 16 == 0
    assert after["external_kv_transfer"] - before["external_kv_transfer"] == params["remote_num_tokens"] - hit
    assert after["local_compute"] == before["local_compute"]


@pytest.mark.parametrize("failure", ["prefill_crashed", "lease_expired", "unknown_engine", "other_prompt"])
async def test_failed_pull_recomputes_and_counts_a_failed_transfer(client, failure):
    settings = fast_settings(kv_lease_timeout_s=0.2 if failure == "lease_expired" else 30)
    async with SimCluster(settings=settings) as cluster:
        await cluster.start(prefill=1, decode=1, both=1)
        p, d, both = roles(cluster)
        request = chat_body(PROMPT, max_tokens=8)
        params = await prefill(client, p, request)
        decode_request = request
        if failure == "prefill_crashed":
            await cluster.crash(p.worker_id)
        elif failure == "lease_expired":
            await asyncio.sleep(0.4)
            assert await metric(client, p, "vllm:kv_cache_usage_perc") == 0
        elif failure == "unknown_engine":
            params = {**params, "remote_engine_id": "no-such-engine"}
        else:
            decode_request = chat_body(PROMPT + " A different prompt.", max_tokens=8)
        before = await by_source(client, d)
        r = await client.post(f"{d.base_url}/chat/completions", json={**decode_request, "kv_transfer_params": params})
        assert r.status_code == 200
        after = await by_source(client, d)
        assert after["external_kv_transfer"] == before["external_kv_transfer"]
        assert after["local_compute"] - before["local_compute"] == r.json()["usage"]["prompt_tokens"]
        assert await metric(client, d, "vllm:nixl_num_failed_transfers_total") == 1
        aggregated = await client.post(f"{both.base_url}/chat/completions", json=decode_request)
        assert r.json()["choices"][0]["message"]["content"] == aggregated.json()["choices"][0]["message"]["content"]
        if failure == "other_prompt":
            assert await metric(client, p, "vllm:kv_cache_usage_perc") == 0  # the mismatched lease was released


async def test_roles_gate_the_protocol(cluster, client):
    p, d, both = roles(cluster)
    request = chat_body(PROMPT)
    # A decode-only worker does not hold KV for others: no params, like vLLM as a kv_consumer.
    r = await client.post(
        f"{d.base_url}/chat/completions", json=build_prefill_body(Endpoint.CHAT, "sim-model", request)
    )
    assert r.status_code == 200 and r.json()["kv_transfer_params"] is None
    # A prefill-only worker does not pull: it computes the prompt itself.
    params = await prefill(client, both, request)
    before = await by_source(client, p)
    await client.post(f"{p.base_url}/chat/completions", json={**request, "kv_transfer_params": params})
    after = await by_source(client, p)
    assert after["external_kv_transfer"] == before["external_kv_transfer"]
    # A "both" worker does both halves.
    params = await prefill(client, p, request, request_id="x")
    r = await client.post(f"{both.base_url}/chat/completions", json={**request, "kv_transfer_params": params})
    assert (await by_source(client, both))["external_kv_transfer"] > 0


async def test_many_concurrent_disaggregated_requests(cluster, client):
    p, d, both = roles(cluster)

    async def one(i: int) -> tuple[str, str]:
        request = chat_body(f"{PROMPT} Request number {i}.", max_tokens=16)
        params = await prefill(client, p, request, request_id=f"c{i}")
        dis = client.post(f"{d.base_url}/chat/completions", json={**request, "kv_transfer_params": params})
        agg = client.post(f"{both.base_url}/chat/completions", json=request)
        a, b = await asyncio.gather(dis, agg)
        return a.json()["choices"][0]["message"]["content"], b.json()["choices"][0]["message"]["content"]

    results = await asyncio.gather(*(one(i) for i in range(24)))
    assert all(a == b for a, b in results)
    assert len({a for a, _ in results}) == 24
    assert await metric(client, d, "vllm:nixl_num_failed_transfers_total") == 0
    assert await metric(client, p, "vllm:kv_cache_usage_perc") == 0

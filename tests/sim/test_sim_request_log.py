"""The simulator's per-request traces (``request_log.py``): one line per finished request, its worker, cached tokens,
queueing and prefill, and the two halves of a transfer under one client id."""

from __future__ import annotations

import asyncio

import httpx

from litellm_disagg.runtime_config import WorkerRole
from litellm_disagg.sim import SimCluster
from litellm_disagg.sim.request_log import client_id_of, read

from .conftest import chat_body, fast_settings


def test_client_id_of_strips_the_engine_suffix_and_prefix():
    assert client_id_of("chatcmpl-disagg-abc-7") == "disagg-abc"
    assert client_id_of("cmpl-x1-12") == "x1"
    assert client_id_of("r1-3") == "r1"


async def test_each_finished_request_leaves_a_line_with_its_queue_prefill_and_cache(tmp_path, client):
    log = tmp_path / "requests.jsonl"
    settings = fast_settings(max_num_batched_tokens=256).model_copy(update={"request_log": str(log)})
    async with SimCluster(settings=settings) as cluster:
        [worker] = await cluster.start(both=1)
        long = "alpha beta gamma delta " * 200  # several 256-token chunks
        url = f"{worker.base_url}/chat/completions"

        first = client.post(url, json=chat_body(long, user="first"), headers={"X-Request-Id": "one"})
        r1 = await first
        assert r1.status_code == 200
        # The same prompt again: served from the prefix cache.
        r2 = await client.post(url, json=chat_body(long, user="again"))
        assert r2.status_code == 200
    traces, offset = read(log)
    assert offset == log.stat().st_size
    by_user = {t.user: t for t in traces}
    one, again = by_user["first"], by_user["again"]
    assert one.client_id == "one" and one.worker_id == worker.worker_id and one.role == "both"
    assert one.cached_tokens == 0 and one.prefill_steps > 1  # chunked
    assert again.cached_tokens > 0.9 * again.prompt_tokens and again.prefill_steps == 1
    for t in (one, again):
        assert t.scheduled is not None and t.first_token is not None and t.finished is not None
        assert t.arrived <= t.scheduled <= t.first_token <= t.finished
        assert t.pull_started is None and t.waiting_at_arrival == 0


async def test_a_request_arriving_behind_a_long_prefill_counts_what_was_ahead(tmp_path, client):
    log = tmp_path / "requests.jsonl"
    slow = fast_settings(timing={"speedup": 2.0}, max_num_batched_tokens=256)  # the long prompt: about 0.1 s
    settings = slow.model_copy(update={"request_log": str(log)})
    async with SimCluster(settings=settings) as cluster:
        [worker] = await cluster.start(both=1)
        url = f"{worker.base_url}/chat/completions"
        task = asyncio.ensure_future(client.post(url, json=chat_body("alpha beta gamma " * 600, user="long")))
        for _ in range(2000):
            if worker.engine is not None and worker.engine.scheduler.num_running:
                break
            await asyncio.sleep(0.001)
        short = await client.post(url, json=chat_body("hello", user="short"))
        assert short.status_code == 200 and (await task).status_code == 200
    by_user = {t.user: t for t in read(log)[0]}
    assert by_user["short"].running_at_arrival == 1 and by_user["short"].prefill_tokens_ahead > 0
    assert by_user["short"].shared_prefill_tokens > 0  # its prompt shared a step with the long one's chunk


async def test_both_halves_of_a_transfer_share_the_client_id(tmp_path):
    log = tmp_path / "requests.jsonl"
    settings = fast_settings().model_copy(update={"request_log": str(log)})
    async with SimCluster(settings=settings) as cluster, httpx.AsyncClient(timeout=20) as client:
        prefill, decode = await cluster.start(prefill=1, decode=1)
        assert prefill.role is WorkerRole.PREFILL
        body = chat_body("the same prompt " * 50)
        r = await client.post(f"{prefill.base_url}/chat/completions", headers={"X-Request-Id": "pd-1"},
                              json=body | {"max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}})
        params = r.json()["kv_transfer_params"]
        r = await client.post(f"{decode.base_url}/chat/completions", headers={"X-Request-Id": "pd-1"},
                              json=body | {"kv_transfer_params": params, "user": "u1"})
        assert r.status_code == 200
    traces = [t for t in read(log)[0] if t.client_id == "pd-1"]
    by_role = {t.role: t for t in traces}
    assert set(by_role) == {"prefill", "decode"}
    d = by_role["decode"]
    assert d.user == "u1" and d.external_tokens > 0
    assert d.pull_started is not None and d.pull_ended is not None and d.scheduled is not None
    assert d.arrived <= d.pull_started <= d.pull_ended <= d.scheduled <= d.first_token

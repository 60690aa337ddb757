"""The simulator speaking SGLang's bootstrap protocol and TensorRT-LLM's disaggregated_params, over real HTTP:
the same fields, the same order of events and the same failures as the engines' sources show."""

from __future__ import annotations

import asyncio

from litellm_disagg.runtime_config import SglangBootstrapTransfer, TrtllmDisaggTransfer
from litellm_disagg.sim import SimCluster
from litellm_disagg.sim.settings import EngineSettings
from tests.kv.zmq_pub import until

from .conftest import chat_body, fast_settings, metric


def settings(engine_name: str, **engine: object):
    base = fast_settings(**engine)
    return base.model_copy(update={"engine_name": engine_name})


def short_timeouts(engine_name: str, timeout_s: float):
    s = settings(engine_name)
    cfg = EngineSettings.model_validate(s.engine.model_dump() | {"waiting_timeout_s": timeout_s,
                                                                 "bootstrap_timeout_s": timeout_s})
    return s.model_copy(update={"engine": cfg})


def text(response) -> str:
    return response.json()["choices"][0]["message"]["content"]


# -- SGLang ------------------------------------------------------------------------------------------------------------


async def test_sglang_pair_meets_in_the_room_and_equals_aggregated(client):
    async with SimCluster(settings=settings("sglang")) as cluster:
        p, d = await cluster.start(prefill=1, decode=1)
        assert isinstance(p.config.transfer, SglangBootstrapTransfer) and p.config.engine == "sglang"
        boot = {"bootstrap_host": p.config.transfer.host, "bootstrap_port": p.config.transfer.port,
                "bootstrap_room": 2**63 - 1}
        body = chat_body(max_tokens=9)
        # As SGLang's mini_lb sends them: the same body to both, at the same time; the decode may even go first.
        decode = asyncio.create_task(client.post(f"{d.base_url}/chat/completions", json=body | boot | {"rid": "x"}))
        await asyncio.sleep(0.02)
        prefill = await client.post(f"{p.base_url}/chat/completions", json=body | boot | {"stream": False})
        decoded = await decode
        assert prefill.status_code == 200 and decoded.status_code == 200
        assert prefill.json()["usage"]["completion_tokens"] == 1  # the prefill answers one token
        assert "kv_transfer_params" not in prefill.json()
        aggregated = await client.post(f"{d.base_url}/chat/completions", json=body)
        assert text(decoded) == text(aggregated)
        assert await metric(client, d, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer") > 0
        assert await metric(client, d, "sglang:num_requests_total") == 2  # the engine's own names on /metrics
        assert p.engine.idle and not p.engine.rooms  # the pushed blocks are released, the room is gone


async def test_sglang_decode_whose_prefill_never_comes_times_out_with_500(client):
    async with SimCluster(settings=short_timeouts("sglang", 0.3)) as cluster:
        p, d = await cluster.start(prefill=1, decode=1)
        boot = {"bootstrap_host": p.config.transfer.host, "bootstrap_port": p.config.transfer.port, "bootstrap_room": 7}
        r = await client.post(f"{d.base_url}/chat/completions", json=chat_body() | boot)
        assert r.status_code == 500 and "KVPoll.WaitingForInput" in r.json()["error"]["message"]
        # And a prefill whose decode never registers gives up too (KVPoll.Bootstrapping).
        r = await client.post(f"{p.base_url}/chat/completions", json=chat_body() | boot | {"bootstrap_room": 8})
        assert r.status_code == 500 and "KVPoll.Bootstrapping" in r.json()["error"]["message"]
        assert p.engine.idle and d.engine.idle


async def test_sglang_abort_request_ends_a_waiting_decode_and_a_dead_prefill_fails_it_fast(client):
    async with SimCluster(settings=settings("sglang")) as cluster:  # 300 s timeouts: only the abort ends it
        p, d = await cluster.start(prefill=1, decode=1)
        boot = {"bootstrap_host": p.config.transfer.host, "bootstrap_port": p.config.transfer.port, "bootstrap_room": 9}
        waiting = asyncio.create_task(client.post(f"{d.base_url}/chat/completions", json=chat_body() | boot | {"rid": "r9"}))
        await until(lambda: "r9" in d.engine.rids, timeout=10)  # registered (a fixed sleep could abort before it arrives)
        assert (await client.post(f"{d.server_url}/abort_request", json={"rid": "r9"})).status_code == 200
        r = await asyncio.wait_for(waiting, 5)
        assert r.status_code == 500
        assert (await client.post(f"{d.server_url}/abort_request", json={"rid": "unknown"})).status_code == 200

        waiting = asyncio.create_task(client.post(f"{d.base_url}/chat/completions", json=chat_body() | boot | {"bootstrap_room": 10}))
        await until(lambda: not d.engine.idle, timeout=10)  # the decode waits for its KV before its prefill worker dies
        await cluster.crash(p.worker_id)  # its bootstrap server is gone: the heartbeat fails the room
        r = await asyncio.wait_for(waiting, 5)
        assert r.status_code == 500
        r = await client.post(f"{d.base_url}/chat/completions", json=chat_body() | boot | {"bootstrap_room": 11})
        assert r.status_code == 500  # nobody at that bootstrap address any more
        assert d.engine.idle


# -- TensorRT-LLM ------------------------------------------------------------------------------------------------------


async def test_trtllm_context_then_generation_equals_aggregated(client):
    async with SimCluster(settings=settings("trtllm")) as cluster:
        p, d = await cluster.start(prefill=1, decode=1)
        assert isinstance(p.config.transfer, TrtllmDisaggTransfer) and p.config.engine == "trtllm"
        body = chat_body(max_tokens=9)
        ctx = await client.post(f"{p.base_url}/chat/completions",
                                json=body | {"max_tokens": 1, "disaggregated_params": {"request_type": "context_only"}})
        assert ctx.status_code == 200
        choice = ctx.json()["choices"][0]
        params = choice["disaggregated_params"]
        assert params["request_type"] == "context_only" and params["encoded_opaque_state"]
        assert "kv_transfer_params" not in ctx.json()
        gen = await client.post(f"{d.base_url}/chat/completions",
                                json=body | {"disaggregated_params": params | {"request_type": "generation_only"}})
        assert gen.status_code == 200
        aggregated = await client.post(f"{d.base_url}/chat/completions", json=body)
        assert text(gen) == text(aggregated)
        assert text(gen).startswith(choice["message"]["content"])  # first_gen_tokens is the answer's first token
        assert await metric(client, d, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer") > 0
        page = (await client.get(f"{d.server_url}/prometheus/metrics")).text
        assert "trtllm_request_success_total" in page and "trtllm_num_requests_running" in page


async def test_trtllm_generation_without_state_is_400_and_a_lost_context_is_500(client):
    async with SimCluster(settings=settings("trtllm")) as cluster:
        p, d = await cluster.start(prefill=1, decode=1)
        body = chat_body(max_tokens=5)
        r = await client.post(f"{d.base_url}/chat/completions",
                              json=body | {"disaggregated_params": {"request_type": "generation_only"}})
        assert r.status_code == 400
        ctx = await client.post(f"{p.base_url}/chat/completions",
                                json=body | {"max_tokens": 1, "disaggregated_params": {"request_type": "context_only"}})
        params = ctx.json()["choices"][0]["disaggregated_params"]
        await cluster.crash(p.worker_id)
        r = await client.post(f"{d.base_url}/chat/completions",
                              json=body | {"disaggregated_params": params | {"request_type": "generation_only"}})
        assert r.status_code == 500  # TensorRT-LLM fails the request; it does not recompute like vLLM
        assert d.engine.idle

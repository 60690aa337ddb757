"""The HTTP surface of one simulated worker: OpenAI endpoints, streaming, errors, tokenize, health, models, metrics."""

from __future__ import annotations

import asyncio
import json

import pytest

from litellm_disagg.engines.vllm.metrics import VLLM_METRICS
from litellm_disagg.runtime_config import WorkerRole
from litellm_disagg.sim import SimWorker
from litellm_disagg.workers import engine_probe

from .conftest import chat_body, fast_settings, metric


@pytest.fixture(scope="module")
async def worker():
    w = SimWorker("sim-http-0", WorkerRole.BOTH, fast_settings(max_model_len=256, default_output_tokens=8))
    await w.start()
    yield w
    await w.stop()


def sse_events(text: str) -> list[dict | str]:
    out: list[dict | str] = []
    for line in text.splitlines():
        if line.startswith("data: "):
            data = line[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


async def test_chat_completion(worker, client):
    r = await client.post(f"{worker.base_url}/chat/completions", json=chat_body(), headers={"X-Request-Id": "req-42"})
    assert r.status_code == 200 and r.headers["x-request-id"] == "req-42"
    body = r.json()
    assert body["id"] == "chatcmpl-req-42" and body["object"] == "chat.completion" and body["model"] == "sim-model"
    [choice] = body["choices"]
    assert choice["finish_reason"] == "length" and choice["message"]["role"] == "assistant"
    assert len(choice["message"]["content"].split()) == 12
    usage = body["usage"]
    assert usage["completion_tokens"] == 12 and usage["total_tokens"] == usage["prompt_tokens"] + 12
    assert body["kv_transfer_params"] is None
    again = await client.post(f"{worker.base_url}/chat/completions", json=chat_body())
    assert again.json()["choices"][0]["message"]["content"] == choice["message"]["content"]  # deterministic


async def test_max_completion_tokens_wins_and_no_limit_stops_naturally(worker, client):
    r = await client.post(f"{worker.base_url}/chat/completions", json=chat_body(max_completion_tokens=3))
    assert r.json()["usage"]["completion_tokens"] == 3
    body = chat_body()
    del body["max_tokens"]
    r = await client.post(f"{worker.base_url}/chat/completions", json=body)
    assert r.json()["choices"][0]["finish_reason"] == "stop"
    assert 1 <= r.json()["usage"]["completion_tokens"] < 256 - r.json()["usage"]["prompt_tokens"]  # EOS, not the end


async def test_text_completion_and_echo(worker, client):
    r = await client.post(
        f"{worker.base_url}/completions", json={"model": "sim-model", "prompt": "Once upon a time", "max_tokens": 5}
    )
    body = r.json()
    assert r.status_code == 200 and body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    text = body["choices"][0]["text"]
    assert len(text.split()) == 5 and body["usage"]["prompt_tokens"] == 4
    echoed = await client.post(
        f"{worker.base_url}/completions", json={"prompt": ["Once upon a time"], "max_tokens": 5, "echo": True}
    )
    assert echoed.json()["choices"][0]["text"] == "Once upon a time" + text
    ids = (await client.post(f"{worker.server_url}/tokenize", json={"prompt": "Once upon a time"})).json()["tokens"]
    by_ids = await client.post(f"{worker.base_url}/completions", json={"prompt": ids, "max_tokens": 5})
    assert by_ids.json()["choices"][0]["text"] == text


async def test_chat_and_completions_agree_on_tokens_and_output(worker, client):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why is the sky blue?"}]
    tok = (await client.post(f"{worker.server_url}/tokenize", json={"model": "sim-model", "messages": messages})).json()
    assert tok["count"] == len(tok["tokens"]) and tok["max_model_len"] == 256
    chat = await client.post(f"{worker.base_url}/chat/completions", json={"messages": messages, "max_tokens": 6})
    completion = await client.post(f"{worker.base_url}/completions", json={"prompt": tok["tokens"], "max_tokens": 6})
    assert chat.json()["usage"]["prompt_tokens"] == tok["count"]
    assert chat.json()["choices"][0]["message"]["content"] == completion.json()["choices"][0]["text"]
    answer = completion.json()["choices"][0]["text"]
    answer_ids = (await client.post(f"{worker.server_url}/tokenize", json={"prompt": answer})).json()["tokens"]
    assert len(answer_ids) == 6  # generated text round-trips through the tokenizer
    text = (await client.post(f"{worker.server_url}/detokenize", json={"tokens": answer_ids})).json()["prompt"]
    assert text == answer


async def test_chat_stream_with_usage(worker, client):
    plain = (await client.post(f"{worker.base_url}/chat/completions", json=chat_body())).json()
    r = await client.post(
        f"{worker.base_url}/chat/completions",
        json=chat_body(stream=True, stream_options={"include_usage": True}),
        headers={"X-Request-Id": "s1"},
    )
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["id"] == "chatcmpl-s1" and c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert content == plain["choices"][0]["message"]["content"]
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finishes[-1] == "length" and set(finishes[:-1]) == {None}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 12


async def test_completion_stream_without_usage(worker, client):
    r = await client.post(f"{worker.base_url}/completions", json={"prompt": "abc def", "max_tokens": 4, "stream": True})
    events = sse_events(r.text)
    assert events[-1] == "[DONE]" and len(events) == 5
    assert all("usage" not in e for e in events[:-1])
    assert events[-2]["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize(
    ("path", "payload", "status", "fragment"),
    [
        ("chat/completions", b"{not json", 400, "invalid JSON"),
        ("chat/completions", [1, 2], 400, "JSON object"),
        ("chat/completions", {"model": "sim-model"}, 400, "messages"),
        ("chat/completions", {"messages": "hello"}, 400, "messages"),
        ("chat/completions", {"messages": []}, 400, "messages"),
        ("chat/completions", {"messages": [{"role": "user", "content": 5}]}, 400, "content"),
        ("chat/completions", {"messages": [{"role": "robot", "content": "x"}]}, 400, "role"),
        ("chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400, "text only"),
        ("chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": "5"}, 400, "max_tokens"),
        ("chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, 400, "max_tokens"),
        ("chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": 2}, 400, "n=1"),
        ("chat/completions", {"messages": [{"role": "user", "content": "x"}], "stream": "yes"}, 400, "stream"),
        ("chat/completions", {"messages": [{"role": "user", "content": "word " * 300}]}, 400, "maximum context length"),
        (
            "chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "max_tokens": 250},
            400,
            "maximum context length",
        ),
        ("chat/completions", {"model": "other", "messages": [{"role": "user", "content": "x"}]}, 404, "does not exist"),
        ("completions", {"prompt": ["a", "b"]}, 400, "prompt"),
        ("completions", {"prompt": [1, 99999999]}, 400, "prompt"),
        ("completions", {"prompt": ""}, 400, "empty"),
        ("completions", {"max_tokens": 3}, 400, "prompt"),
    ],
)
async def test_bad_input_is_an_openai_error(worker, client, path, payload, status, fragment):
    content = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    r = await client.post(f"{worker.base_url}/{path}", content=content, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert fragment in error["message"] and error["code"] == status
    assert error["type"] == ("NotFoundError" if status == 404 else "BadRequestError")


async def test_health_models_and_metrics(worker, client):
    assert (await client.get(f"{worker.server_url}/health")).status_code == 200
    worker.set_healthy(False)
    try:
        assert (await client.get(f"{worker.server_url}/health")).status_code == 503
        assert not await engine_probe.healthy(client, worker.server_url)
    finally:
        worker.set_healthy(True)
    models = (await client.get(f"{worker.base_url}/models")).json()
    assert [m["id"] for m in models["data"]] == ["sim-model"] and models["data"][0]["max_model_len"] == 256
    facts = await engine_probe.engine_facts(client, worker.server_url, VLLM_METRICS)
    assert (facts.block_size, facts.kv_capacity_blocks) == (16, 2048)
    before = await engine_probe.engine_load(client, worker.server_url, VLLM_METRICS)
    await client.post(f"{worker.base_url}/chat/completions", json=chat_body("metrics please"))
    after = await engine_probe.engine_load(client, worker.server_url, VLLM_METRICS)
    assert after.finished == before.finished + 1 and after.idle
    text = (await client.get(f"{worker.server_url}/metrics")).text
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:request_success_total",
        "vllm:nixl_num_failed_transfers_total",
    ):
        assert f'{name}{{engine="0",model_name="sim-model"}}' in text or f'{name}{{engine="0",finished_reason' in text
    for source in ("local_compute", "local_cache_hit", "external_kv_transfer"):
        assert f'vllm:prompt_tokens_by_source_total{{engine="0",model_name="sim-model",source="{source}"}}' in text


async def test_prefix_cache_hits_show_in_metrics_and_usage(worker, client):
    long_prompt = "shared system prompt " * 20
    first = await client.post(f"{worker.base_url}/completions", json={"prompt": long_prompt + "one", "max_tokens": 2})
    hits_before = await metric(client, worker, "vllm:prefix_cache_hits_total")
    second = await client.post(f"{worker.base_url}/completions", json={"prompt": long_prompt + "two", "max_tokens": 2})
    assert first.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    cached = second.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 48 and cached % 16 == 0
    assert await metric(client, worker, "vllm:prefix_cache_hits_total") == hits_before + cached


async def test_client_disconnect_aborts_the_request(client):
    slow = SimWorker("sim-http-slow", WorkerRole.BOTH, fast_settings().with_speedup(1.0))
    await slow.start()
    try:
        async with client.stream(
            "POST", f"{slow.base_url}/chat/completions", json=chat_body(max_tokens=500, stream=True)
        ) as r:
            async for line in r.aiter_lines():
                if '"content":" ' in line:
                    break  # one token arrived: hang up
        load = await engine_probe.engine_load(client, slow.server_url, VLLM_METRICS)
        for _ in range(100):
            if load.idle:
                break
            await asyncio.sleep(0.02)
            load = await engine_probe.engine_load(client, slow.server_url, VLLM_METRICS)
        assert load.idle
        assert await metric(client, slow, "vllm:request_success_total", finished_reason="abort") == 1
        assert slow.engine is not None and slow.engine.pool.usage == 0.0
    finally:
        await slow.stop()


async def test_return_token_ids_and_a_token_id_prompt_continue_the_answer(worker, client):
    # As vLLM: chat gives the prompt's ids on the first chunk and each delta's ids in its choice; /v1/completions takes
    # a token-id prompt, so prompt + the first k output ids continue the answer exactly (request migration).
    body = chat_body(stream=True, return_token_ids=True, max_tokens=10)
    r = await client.post(f"{worker.base_url}/chat/completions", json=body)
    events = [e for e in sse_events(r.text) if isinstance(e, dict)]
    prompt_ids = events[0]["prompt_token_ids"]
    out_ids = [t for e in events[1:] for t in e["choices"][0]["token_ids"]]
    text = "".join(e["choices"][0]["delta"]["content"] for e in events[1:])
    assert len(out_ids) == 10 and isinstance(prompt_ids, list) and prompt_ids
    plain = await client.post(f"{worker.base_url}/chat/completions", json=chat_body(stream=True, max_tokens=10))
    for e in sse_events(plain.text)[:-1]:
        assert isinstance(e, dict) and "prompt_token_ids" not in e and "token_ids" not in e["choices"][0]
    rest = await client.post(
        f"{worker.base_url}/completions",
        json={"prompt": prompt_ids + out_ids[:4], "max_tokens": 6, "return_token_ids": True},
    )
    choice = rest.json()["choices"][0]
    assert choice["token_ids"] == out_ids[4:] and choice["prompt_token_ids"] == prompt_ids + out_ids[:4]
    done_text = "".join(e["choices"][0]["delta"]["content"] for e in events[1:5])
    assert done_text + choice["text"] == text


async def test_a_chat_stream_opens_with_its_first_output_not_at_admission(client):
    # vLLM sends the role-only opening chunk with the first output (first_iteration). A request queued behind another
    # (one sequence at a time) must send nothing until it runs: a client that takes the first chunk for the first
    # token (the router's accounting of a prompt still prefilling) would otherwise see it computed while it waits
    queued = SimWorker("sim-http-queue", WorkerRole.BOTH, fast_settings(max_num_seqs=1).with_speedup(1.0))
    await queued.start()
    try:
        url = f"{queued.base_url}/chat/completions"
        order: list[str] = []

        async def first_chunk_of(name: str, tokens: int) -> None:
            async with client.stream("POST", url, json=chat_body(max_tokens=tokens, stream=True)) as r:
                lines = r.aiter_lines()
                async for line in lines:
                    if line.startswith("data: {"):
                        order.append(name + " opened")
                        break
                async for _ in lines:
                    pass
                order.append(name + " done")

        running = asyncio.create_task(first_chunk_of("first", 40))
        while "first opened" not in order:
            await asyncio.sleep(0.01)
        await first_chunk_of("second", 2)
        await running
        assert order.index("first done") < order.index("second opened"), order
    finally:
        await queued.stop()

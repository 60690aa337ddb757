"""The strategy inside a real LiteLLM Router, against recording fake workers over real HTTP.

These check the plumbing that vLLM cannot show directly: what exactly each worker receives.
"""

import asyncio

import httpx
import litellm
import pytest

from litellm_disagg.discovery.file.registry import FileRegistry
from litellm_disagg.discovery.file.settings import FileRegistrySettings
from litellm_disagg.plugin import DisaggPlugin
from litellm_disagg.runtime_config import RuntimeConfig, WorkerState
from litellm_disagg.settings import DisaggSettings

from .support.fake_worker import ANSWER, FakeWorker
from .support.net import free_port

MODEL = "fake-model"


def runtime_config(worker: FakeWorker, role: str) -> RuntimeConfig:
    return RuntimeConfig(worker_id=worker.name, model=MODEL, role=role, base_url=f"{worker.url}/v1",
                         transfer=worker.transfer, kv_capacity_blocks=1000,
                         block_size=16, state=WorkerState.READY)


async def recorded(worker: FakeWorker) -> list[dict]:
    async with httpx.AsyncClient() as c:
        return (await c.get(f"{worker.url}/_requests")).json()


async def set_prefill_status(worker: FakeWorker, status: int) -> None:
    async with httpx.AsyncClient() as c:
        await c.post(f"{worker.url}/_behaviour", json={"prefill_status": status})


class Stack:
    def __init__(self, tmp_path):
        self.registry_dir = tmp_path / "registry"
        self.workers: dict[str, FakeWorker] = {}
        self.writer = FileRegistry(self.registry_dir)
        self.router = litellm.Router(model_list=[{"model_name": "plain", "litellm_params": {"model": "openai/plain", "api_key": "k", "mock_response": "plain answer"}}], num_retries=0)
        self.plugin = DisaggPlugin()
        settings = DisaggSettings(registry=FileRegistrySettings(path=str(self.registry_dir), poll_interval_s=0.05), sync_interval_s=0.05, max_prefill_attempts=2)
        self.settings = settings

    async def add(self, name: str, role: str) -> FakeWorker:
        worker = FakeWorker(name, free_port())
        await worker.start()
        self.workers[name] = worker
        await self.writer.publish(runtime_config(worker, role))
        return worker

    async def start(self):
        self.controller = await self.plugin.attach(self.router, self.settings)
        await self.settle()

    async def settle(self):
        self.controller.pool_changed.clear()
        await asyncio.wait_for(self.controller.pool_changed.wait(), timeout=3)

    async def close(self):
        await self.plugin.detach()
        for worker in self.workers.values():
            await worker.stop()


@pytest.fixture
async def stack(tmp_path):
    s = Stack(tmp_path)
    yield s
    await s.close()


async def chat(stack, **kwargs):
    data = {"model": MODEL, "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 7} | kwargs
    # What the proxy's pre-call hook does before the router sees a request.
    await stack.plugin.async_pre_call_hook(None, None, data, "acompletion")
    return await stack.router.acompletion(**data)


async def test_prefill_then_decode_with_the_returned_params(stack):
    prefill = await stack.add("p1", "prefill")
    decode = await stack.add("d1", "decode")
    await stack.start()
    response = await chat(stack)
    assert response.choices[0].message.content == ANSWER
    [pre] = await recorded(prefill)
    [dec] = await recorded(decode)
    assert pre["body"]["max_tokens"] == 1 and pre["body"]["stream"] is False
    assert pre["body"]["kv_transfer_params"] == {"do_remote_decode": True}
    assert pre["body"]["messages"] == dec["body"]["messages"]
    assert dec["body"]["max_tokens"] == 7
    assert dec["body"]["kv_transfer_params"]["remote_engine_id"] == "engine-p1"
    assert pre["headers"]["x-request-id"] == dec["headers"]["x-request-id"] == dec["body"]["kv_transfer_params"]["remote_request_id"]


async def test_streaming_and_text_completion(stack):
    prefill = await stack.add("p1", "prefill")
    decode = await stack.add("d1", "decode")
    await stack.start()
    stream = await chat(stack, stream=True)
    text = "".join([chunk.choices[0].delta.content or "" async for chunk in stream])
    assert text == ANSWER
    data = {"model": MODEL, "prompt": "once upon a time", "max_tokens": 5}
    await stack.plugin.async_pre_call_hook(None, None, data, "atext_completion")
    completion = await stack.router.atext_completion(**data)
    assert completion.choices[0].text == ANSWER
    pre = await recorded(prefill)
    dec = await recorded(decode)
    assert [r["path"] for r in pre] == ["/v1/chat/completions", "/v1/completions"]
    assert [r["path"] for r in dec] == ["/v1/chat/completions", "/v1/completions"]
    assert pre[1]["body"]["prompt"] == "once upon a time" and dec[1]["body"]["prompt"] == "once upon a time"
    assert dec[0]["body"]["stream"] is True and "kv_transfer_params" in dec[0]["body"]
    assert pre[0]["body"]["stream"] is False


async def test_client_supplied_transfer_params_never_reach_a_worker(stack):
    prefill = await stack.add("p1", "prefill")
    decode = await stack.add("d1", "decode")
    await stack.start()
    evil = {"do_remote_prefill": True, "remote_engine_id": "evil", "remote_host": "10.6.6.6"}
    await chat(stack, kv_transfer_params=evil, extra_body={"kv_transfer_params": evil})
    # Straight to the router, as an SDK user of the Router would (no proxy hook): the strategy strips it too.
    await stack.router.acompletion(model=MODEL, messages=[{"role": "user", "content": "x"}], kv_transfer_params=evil)
    for worker in (prefill, decode):
        for request in await recorded(worker):
            assert "evil" not in str(request["body"]), request


async def test_prefill_server_error_fails_over_then_serves_aggregated(stack):
    bad = await stack.add("p1", "prefill")
    good = await stack.add("p2", "prefill")
    decode = await stack.add("d1", "decode")
    await stack.start()
    await set_prefill_status(bad, 500)
    for _ in range(3):
        await chat(stack)
    decodes = await recorded(decode)
    assert all(d["body"]["kv_transfer_params"]["remote_engine_id"] == "engine-p2" for d in decodes)
    await set_prefill_status(good, 503)
    response = await chat(stack)
    assert response.choices[0].message.content == ANSWER
    last = (await recorded(decode))[-1]
    assert "kv_transfer_params" not in last["body"]  # aggregated: the decode worker computes the prompt itself


async def test_prefill_client_error_goes_to_the_client(stack):
    prefill = await stack.add("p1", "prefill")
    decode = await stack.add("d1", "decode")
    await stack.start()
    await set_prefill_status(prefill, 400)
    with pytest.raises(litellm.BadRequestError, match="p1 told to fail"):
        await chat(stack)
    assert await recorded(decode) == []


async def test_no_prefill_worker_means_aggregated(stack):
    decode = await stack.add("d1", "decode")
    await stack.start()
    assert (await chat(stack)).choices[0].message.content == ANSWER
    [dec] = await recorded(decode)
    assert "kv_transfer_params" not in dec["body"]


async def test_workers_join_and_leave_at_runtime(stack):
    await stack.add("p1", "prefill")
    d1 = await stack.add("d1", "decode")
    await stack.start()
    d2 = await stack.add("d2", "decode")
    await stack.settle()
    for _ in range(4):
        await chat(stack)
    assert len(await recorded(d1)) >= 1 and len(await recorded(d2)) >= 1
    await stack.writer.publish(runtime_config(d2, "decode").with_state(WorkerState.DRAINING))
    await stack.settle()
    before = len(await recorded(d2))
    for _ in range(4):
        await chat(stack)
    assert len(await recorded(d2)) == before
    assert stack.router.get_deployment(model_id="litellm-disagg/d2") is None


async def test_other_model_groups_keep_litellm_routing(stack):
    await stack.add("d1", "decode")
    await stack.start()
    response = await stack.router.acompletion(model="plain", messages=[{"role": "user", "content": "x"}])
    assert response.choices[0].message.content == "plain answer"


async def test_strategy_is_reinstalled_after_litellm_resets_it(stack):
    await stack.add("d1", "decode")
    await stack.start()
    assert stack.controller.strategy.installed()
    stack.router.update_settings(routing_strategy="least-busy")  # a new strategy: routing_strategy_init resets ours
    assert not stack.controller.strategy.installed()
    await asyncio.sleep(0.3)
    assert stack.controller.strategy.installed()
    stack.router.routing_strategy_init(routing_strategy="simple-shuffle", routing_strategy_args={})
    await chat(stack)  # the pre-call hook re-installs at once, before the router selects
    assert stack.controller.strategy.installed()


async def test_no_ready_decode_worker_is_a_clean_error(stack):
    await stack.add("p1", "prefill")
    await stack.start()
    with pytest.raises(Exception) as info:
        await chat(stack)
    assert getattr(info.value, "status_code", None) in (400, 404, 503)


async def test_decode_crash_is_retried_elsewhere_with_a_fresh_prefill(stack):
    stack.router.num_retries = 2
    prefill = await stack.add("p1", "prefill")
    d1 = await stack.add("d1", "decode")
    d2 = await stack.add("d2", "decode")
    await stack.start()
    await d1.stop()  # crashed: no drain, still registered until its heartbeat expires
    for _ in range(4):
        response = await chat(stack)
        assert response.choices[0].message.content == ANSWER
    from litellm_disagg.engines.vllm.transfer import RELEASE_MODEL

    seen = await recorded(d2)
    decodes = [d for d in seen if d["body"]["model"] != RELEASE_MODEL]
    releases = [d for d in seen if d["body"]["model"] == RELEASE_MODEL]
    prefills = await recorded(prefill)
    assert len(decodes) == 4
    # The first attempt's prefill, which the dead d1 never read, is released through the live decode worker.
    assert len(releases) >= 1 and releases[0]["body"]["kv_transfer_params"]["remote_request_id"] == (
        prefills[0]["headers"]["x-request-id"]
    )
    # Every decode that reached d2 carries the params of its own prefill (a retry never reuses stale ones).
    request_ids = [p["headers"]["x-request-id"] for p in prefills]
    assert len(set(request_ids)) == len(request_ids) >= 4
    assert all(d["body"]["kv_transfer_params"]["remote_request_id"] == d["headers"]["x-request-id"] for d in decodes)
    assert {d["headers"]["x-request-id"] for d in decodes} <= set(request_ids)


async def test_a_decode_worker_that_dies_during_the_prefill_is_replaced_and_the_prefill_kept(stack, monkeypatch):
    # No LiteLLM retries: the request succeeds only if its decode call goes to the live worker the first time.
    from litellm_disagg.routing.accounting import FlightKey

    prefill = await stack.add("p1", "prefill")
    d1 = await stack.add("d1", "decode")
    d2 = await stack.add("d2", "decode")
    await stack.start()
    stack.controller.accounting.start(FlightKey.decode("busy"), "d2")  # d1 is the idler: the pick
    entered, gate = asyncio.Event(), asyncio.Event()
    run = stack.controller.orchestrator.run

    async def gated_prefill(request, plan):
        if not gate.is_set():  # the first request: held here while d1 dies
            assert plan.decode.worker_id == "d1"
            entered.set()
            await gate.wait()
        return await run(request, plan)

    monkeypatch.setattr(stack.controller.orchestrator, "run", gated_prefill)
    call = asyncio.create_task(chat(stack))
    await asyncio.wait_for(entered.wait(), timeout=10)
    await d1.stop()  # it dies while the request's prefill runs; discovery still lists it
    stack.controller.cooldown.failed("d1")  # another call to it failed: its port is probed and refuses
    await stack.controller.liveness.probed()
    gate.set()
    response = await asyncio.wait_for(call, timeout=30)
    assert response.choices[0].message.content == ANSWER
    [pre] = await recorded(prefill)
    [dec] = await recorded(d2)  # one prefill, read by the live decode worker
    assert dec["body"]["kv_transfer_params"]["remote_request_id"] == pre["headers"]["x-request-id"]
    # New requests go to d2 at once, though the failure cooldown is shorter than discovery's TTL.
    stack.controller.cooldown.cooldown_s = 0
    assert (await chat(stack)).choices[0].message.content == ANSWER
    assert len(await recorded(d2)) == 2


async def test_all_deployments_cooling_down_in_litellm_still_routes_our_group(stack, monkeypatch):
    await stack.add("p1", "prefill")
    decode = await stack.add("d1", "decode")
    await stack.start()

    async def everything_cooling_down(*args, **kwargs):
        raise litellm.BadRequestError(message="There are no healthy deployments for this model", model=MODEL, llm_provider="")

    monkeypatch.setattr(stack.router, "async_get_healthy_deployments", everything_cooling_down)
    assert (await chat(stack)).choices[0].message.content == ANSWER
    assert len(await recorded(decode)) == 1
    with pytest.raises(litellm.BadRequestError):  # a group that is not ours keeps LiteLLM's answer
        await stack.router.acompletion(model="plain", messages=[{"role": "user", "content": "x"}])


async def test_events_end_in_flight_entries_whichever_plugin_instance_litellm_kept(stack):
    # LiteLLM registers one CustomLogger per class: a second plugin instance's events arrive at the first one.
    other = DisaggPlugin()
    litellm.callbacks.append(other)
    try:
        await stack.add("p1", "prefill")
        await stack.add("d1", "decode")
        await stack.start()
        for _ in range(3):
            await chat(stack)
        for _ in range(50):
            if stack.controller.accounting.requests("d1") == 0:
                break
            await asyncio.sleep(0.05)
        assert stack.controller.accounting.requests("d1") == 0
    finally:
        litellm.callbacks.remove(other)


async def test_a_stream_ends_its_in_flight_entry_at_its_last_chunk(stack, monkeypatch):
    # LiteLLM's success event runs in a background task and can lag the client; the last chunk must be enough.
    async def no_event(self, *args, **kwargs):
        return None

    monkeypatch.setattr(DisaggPlugin, "async_log_success_event", no_event)
    await stack.add("p1", "prefill")
    await stack.add("d1", "decode")
    await stack.start()
    stream = await chat(stack, stream=True)
    seen_during = []
    async for _chunk in stream:
        seen_during.append(stack.controller.accounting.requests("d1"))
    assert seen_during[0] == 1  # in flight while it streams
    assert stack.controller.accounting.requests("d1") == 0  # ended with the stream, no event needed


async def test_a_lone_aggregated_worker_serves_even_with_the_fallback_turned_off(stack):
    # One `both` worker is a layout, not a prefill pool that failed: aggregated_fallback: false must not refuse it.
    stack.settings = stack.settings.model_copy(update={"aggregated_fallback": False})
    both = await stack.add("b1", "both")
    await stack.start()
    assert (await chat(stack)).choices[0].message.content == ANSWER
    [served] = await recorded(both)
    assert "kv_transfer_params" not in served["body"]


async def test_the_strategy_drops_transfer_metadata_on_every_call_and_says_so_once_per_interval(stack, caplog):
    # Past the pre-call hook (a retry's kwargs, a caller of the Router itself): the strategy strips it again.
    decode = await stack.add("d1", "decode")
    await stack.start()
    with caplog.at_level("WARNING", logger="litellm_disagg.routing.strategy"):
        for _ in range(3):
            await stack.router.acompletion(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=7,
                                           kv_transfer_params={"remote_block_ids": [[1]]})
    assert all("kv_transfer_params" not in d["body"] for d in await recorded(decode))
    lines = [r.getMessage() for r in caplog.records if "client-supplied" in r.getMessage()]
    assert len(lines) == 1 and MODEL in lines[0], lines

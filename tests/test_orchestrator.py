"""The orchestrator walks a RoutePlan: failure policy, with prefill workers behind httpx's MockTransport (no sockets)."""

import asyncio
import json

import httpx
import pytest

from litellm_disagg.engines.base import Endpoint
from litellm_disagg.engines.vllm.transfer import VllmNixlProtocol
from litellm_disagg.routing.accounting import Accounting
from litellm_disagg.routing.cooldown import FailureCooldown
from litellm_disagg.routing.orchestrator import Mode, NoPrefillAvailable, Orchestrator
from litellm_disagg.routing.request import DisaggRequest
from litellm_disagg.routing.route_plan import RoutePlan
from litellm_disagg.runtime_config import VllmNixlTransfer
from litellm_disagg.transfer.prefill import PrefillClient, PrefillRejected, PrefillUnavailable

from .test_routing_units import w

PARAMS = {"do_remote_prefill": True, "remote_engine_id": "E", "remote_block_ids": [[1]], "remote_host": "127.0.0.1", "remote_port": 5600}


def orchestrator(behaviour: dict[str, object], **kwargs) -> tuple[Orchestrator, list[str]]:
    """behaviour: worker host -> status code, "timeout", or "ok"."""
    calls: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        host = request.url.host
        calls.append(host)
        what = behaviour[host]
        if what == "timeout":
            raise httpx.ReadTimeout("slow", request=request)
        if what == "ok":
            return httpx.Response(200, json={"choices": [], "kv_transfer_params": PARAMS})
        if what == "noparams":
            return httpx.Response(200, json={"choices": []})
        return httpx.Response(int(what), json={"error": {"message": f"{host} says {what}"}})

    client = PrefillClient(client=httpx.AsyncClient(transport=httpx.MockTransport(handle)))
    kwargs.setdefault("cooldown", FailureCooldown())
    return Orchestrator(prefill_client=client, accounting=Accounting(), **kwargs), calls


def worker(name, role):
    return w(name, role).model_copy(update={"base_url": f"http://{name}/v1"})


REQ = DisaggRequest(endpoint=Endpoint.CHAT, fields={"messages": [{"role": "user", "content": "x"}]}, request_id="r1")
DECODE = worker("d", "decode")


def plan(*prefill_names: str, local_reason: str | None = None) -> RoutePlan:
    return RoutePlan(DECODE, tuple(worker(n, "prefill") for n in prefill_names), local_reason, "test")


@pytest.mark.parametrize(
    ("behaviour", "mode", "calls"),
    [
        ({"p1": "ok", "p2": "ok"}, Mode.DISAGGREGATED, 1),
        ({"p1": 500, "p2": "ok"}, Mode.DISAGGREGATED, 2),
        ({"p1": "timeout", "p2": "ok"}, Mode.DISAGGREGATED, 2),
        ({"p1": "noparams", "p2": "ok"}, Mode.DISAGGREGATED, 2),
        ({"p1": 429, "p2": 503}, Mode.AGGREGATED, 2),
    ],
)
async def test_failover_then_aggregated(behaviour, mode, calls):
    orch, seen = orchestrator(behaviour)
    outcome = await orch.run(REQ, plan("p1", "p2"))
    assert outcome.mode is mode and len(seen) == calls
    assert seen == ["p1", "p2"][:calls]  # in the plan's order, never the same worker twice
    if mode is Mode.DISAGGREGATED:
        assert outcome.decode_fields == {"kv_transfer_params": PARAMS} and outcome.prefill_worker_id == seen[-1]
    else:
        assert outcome.decode_fields == {}


async def test_client_errors_are_not_retried():
    orch, seen = orchestrator({"p1": 400, "p2": "ok"})
    with pytest.raises(PrefillRejected) as info:
        await orch.run(REQ, plan("p1", "p2"))
    assert info.value.status_code == 400 and "p1 says 400" in info.value.body and seen == ["p1"]


async def test_attempts_are_bounded_and_fallback_can_be_refused():
    orch, seen = orchestrator({"p1": 500, "p2": 500, "p3": 500}, max_attempts=2, aggregated_fallback=False)
    with pytest.raises(NoPrefillAvailable):
        await orch.run(REQ, plan("p1", "p2", "p3"))
    assert len(seen) == 2


async def test_a_local_choice_calls_no_prefill_even_without_fallback():
    orch, seen = orchestrator({"p1": "ok"}, aggregated_fallback=False)
    outcome = await orch.run(REQ, plan("p1", local_reason="mode never"))
    assert outcome.mode is Mode.AGGREGATED and outcome.reason == "mode never" and seen == []


async def test_a_lone_aggregated_worker_is_served_even_with_fallback_refused(caplog):
    from litellm_disagg.routing.route_plan import ONLY_ITSELF

    orch, seen = orchestrator({}, aggregated_fallback=False)
    both = worker("b", "both")
    with caplog.at_level("WARNING", logger="litellm_disagg.routing.orchestrator"):
        outcome = await orch.run(REQ, RoutePlan(both, (), ONLY_ITSELF, ONLY_ITSELF))
    assert outcome.mode is Mode.AGGREGATED and outcome.reason == ONLY_ITSELF and seen == []
    assert not [r for r in caplog.records if "serving aggregated" in r.getMessage()]  # the layout, not a fallback


async def test_a_worker_that_went_cooling_is_tried_last_and_load_is_released():
    cooldown = FailureCooldown(cooldown_s=60)
    cooldown.failed("p1")
    orch, seen = orchestrator({"p1": "ok", "p2": "ok"}, cooldown=cooldown)
    outcome = await orch.run(REQ, plan("p1", "p2"))
    assert seen == ["p2"] and outcome.prefill_worker_id == "p2"
    assert orch.accounting.requests("p2") == 0 and len(orch.accounting) == 0


async def test_an_answer_naming_another_engines_blocks_is_a_failed_prefill_never_forwarded():
    # p1 answers with p2's side channel and engine (a hostile or confused worker); p2 answers for itself.
    published = {name: worker(name, "prefill").model_copy(update={"transfer": VllmNixlTransfer(
        host="127.0.0.1", port=port, engine_id=f"engine-{name}")}) for name, port in (("p1", 5601), ("p2", 5602))}
    own = {name: PARAMS | {"remote_engine_id": f"engine-{name}", "remote_port": w.transfer.port} for name, w in published.items()}
    answers = {"p1": own["p2"], "p2": own["p2"]}

    def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"choices": [], "kv_transfer_params": answers[request.url.host]})

    cooldown = FailureCooldown(cooldown_s=60)
    orch = Orchestrator(prefill_client=PrefillClient(client=httpx.AsyncClient(transport=httpx.MockTransport(handle))),
                        accounting=Accounting(), cooldown=cooldown)
    outcome = await orch.run(REQ, RoutePlan(DECODE, (published["p1"], published["p2"]), None, "test"))
    assert outcome.mode is Mode.DISAGGREGATED and outcome.prefill_worker_id == "p2"
    assert outcome.decode_fields == {"kv_transfer_params": own["p2"]}
    assert cooldown.cooling("p1") and not cooldown.cooling("p2")
    # Alone, the hostile answer is never handed to a decode: aggregated instead.
    answers["p2"] = own["p1"]
    outcome = await orch.run(REQ, RoutePlan(DECODE, (published["p2"],), None, "test"))
    assert outcome.mode is Mode.AGGREGATED and outcome.decode_fields == {}


async def test_prefill_timeout_is_a_total_deadline_not_a_per_read_one():
    # A worker that trickles a valid answer a few bytes at a time: each read is quick, the whole answer is not.
    payload = json.dumps({"choices": [], "kv_transfer_params": PARAMS}).encode()
    finished = asyncio.Event()

    async def trickle():
        for i in range(0, len(payload), 8):
            await asyncio.sleep(0.05)
            yield payload[i:i + 8]
        finished.set()

    def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=trickle())

    client = PrefillClient(timeout_s=0.3, client=httpx.AsyncClient(transport=httpx.MockTransport(handle)))
    with pytest.raises(PrefillUnavailable, match="no complete answer within 0.3 s"):
        await client.prefill(worker=worker("p1", "prefill"), protocol=VllmNixlProtocol(), endpoint=Endpoint.CHAT,
                             body={}, request_id="r1")
    assert not finished.is_set()  # cut off mid-answer, not after it


async def test_an_oversized_answer_is_a_failed_prefill():
    big = {"choices": [{"text": "x" * 4096}], "kv_transfer_params": PARAMS}
    client = PrefillClient(max_answer_bytes=1024, client=httpx.AsyncClient(
        transport=httpx.MockTransport(lambda request: httpx.Response(200, json=big))))
    with pytest.raises(PrefillUnavailable, match="over 1024 bytes"):
        await client.prefill(worker=worker("p1", "prefill"), protocol=VllmNixlProtocol(), endpoint=Endpoint.CHAT,
                             body={}, request_id="r1")


async def test_the_worker_key_is_sent_and_a_refused_key_is_the_workers_fault_not_the_clients():
    seen: list[str | None] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        if request.headers.get("authorization") != "Bearer sk-worker":
            return httpx.Response(401, json={"error": "Unauthorized"})
        return httpx.Response(200, json={"choices": [], "kv_transfer_params": PARAMS})

    transport = httpx.MockTransport(handle)
    keyed = PrefillClient(api_key="sk-worker", client=httpx.AsyncClient(transport=transport))
    args = dict(worker=worker("p1", "prefill"), protocol=VllmNixlProtocol(), endpoint=Endpoint.CHAT, body={}, request_id="r1")
    assert (await keyed.prefill(**args)).remote_engine_id == "E"
    assert "sk-worker" not in repr(keyed)
    with pytest.raises(PrefillUnavailable, match="refuses this proxy's key"):
        await PrefillClient(client=httpx.AsyncClient(transport=transport)).prefill(**args)
    assert seen == ["Bearer sk-worker", None]


async def test_an_empty_prefill_pool_logs_one_fallback_line_per_interval_and_counts_every_request(caplog):
    from litellm_disagg.log_limit import LogLimit
    from litellm_disagg.observability import metrics

    orch, _ = orchestrator({})
    now = [0.0]
    orch._fallback_lines = LogLimit(30.0, clock=lambda: now[0])
    counter = metrics.AGGREGATED_FALLBACKS.labels(DECODE.model, "no_prefill_worker")
    before = counter._value.get()
    with caplog.at_level("WARNING", logger="litellm_disagg.routing.orchestrator"):
        for _ in range(5):
            assert (await orch.run(REQ, plan())).mode is Mode.AGGREGATED
        lines = [r.getMessage() for r in caplog.records if "serving aggregated on" in r.getMessage()]
        assert len(lines) == 1 and "no prefill worker" in lines[0], lines
        assert counter._value.get() - before == 5  # the metric counts every one
        now[0] = 30.0
        await orch.run(REQ, plan())
    assert caplog.records[-1].getMessage().endswith("(4 more like it not logged since the last line)")


async def test_a_remote_prefills_response_marks_its_prompt_computed_and_a_failed_one_is_dropped():
    """``PrefillProgress`` learns its line from prefills seen over: a remote prefill is over when its worker answers
    (``prefill_done`` before the flight ends); one that failed is dropped, never observed."""
    from litellm_disagg.routing.kv.block_hash import PromptBlocks
    from litellm_disagg.routing.kv.disagg_decision import LinearEstimate
    from litellm_disagg.routing.kv.prefill_progress import PrefillProgress

    orch, seen = orchestrator({"p1": 500, "p2": "ok"})
    progress = PrefillProgress(LinearEstimate(0.0, 1000.0))
    orch.accounting.prefill_watcher = progress
    prompted = RoutePlan(DECODE, (worker("p1", "prefill"), worker("p2", "prefill")), None, "test",
                         prompt=PromptBlocks(list(range(64))))
    outcome = await orch.run(REQ, prompted)
    assert outcome.prefill_worker_id == "p2" and seen == ["p1", "p2"]
    assert progress.line.observations == 1  # p2's answer; p1's failure is not an observation
    assert len(progress) == 0 and len(orch.accounting) == 0

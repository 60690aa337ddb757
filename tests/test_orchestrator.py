"""The orchestrator's failure policy, with prefill workers behind httpx's MockTransport (no sockets)."""

import httpx
import pytest

from litellm_disagg.routing.load import InflightTracker
from litellm_disagg.routing.orchestrator import Mode, NoPrefillAvailable, Orchestrator
from litellm_disagg.routing.picker import RoundRobinPicker
from litellm_disagg.routing.pool import WorkerPool
from litellm_disagg.routing.request import DisaggRequest
from litellm_disagg.transfer.prefill import PrefillClient, PrefillRejected
from litellm_disagg.transfer.vllm import Endpoint

from .test_routing_units import w

PARAMS = {"do_remote_prefill": True, "remote_engine_id": "E", "remote_block_ids": [[1]], "remote_host": "h", "remote_port": 1}


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
    return Orchestrator(prefill_client=client, picker=RoundRobinPicker(), load=InflightTracker(), **kwargs), calls


def worker(name, role):
    return w(name, role).model_copy(update={"base_url": f"http://{name}/v1"})


REQ = DisaggRequest(endpoint=Endpoint.CHAT, fields={"messages": [{"role": "user", "content": "x"}]}, request_id="r1")
DECODE = worker("d", "decode")


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
    pool = WorkerPool.of([worker("p1", "prefill"), worker("p2", "prefill"), DECODE])
    plan = await orch.plan(pool, REQ, DECODE)
    assert plan.mode is mode and len(seen) == calls
    assert len(set(seen)) == len(seen)  # never the same worker twice
    if mode is Mode.DISAGGREGATED:
        assert plan.transfer.for_decode() == PARAMS and plan.prefill_worker_id == seen[-1]


async def test_client_errors_are_not_retried():
    orch, seen = orchestrator({"p1": 400, "p2": "ok"})
    with pytest.raises(PrefillRejected) as info:
        await orch.plan(WorkerPool.of([worker("p1", "prefill"), worker("p2", "prefill")]), REQ, DECODE)
    assert info.value.status_code == 400 and "p1 says 400" in info.value.body and seen == ["p1"]


async def test_attempts_are_bounded_and_fallback_can_be_refused():
    orch, seen = orchestrator({"p1": 500, "p2": 500, "p3": 500}, max_attempts=2, aggregated_fallback=False)
    with pytest.raises(NoPrefillAvailable):
        await orch.plan(WorkerPool.of([worker(n, "prefill") for n in ("p1", "p2", "p3")]), REQ, DECODE)
    assert len(seen) == 2


async def test_a_both_worker_never_prefills_for_itself_and_load_is_released():
    orch, seen = orchestrator({"b": "ok"})
    both = worker("b", "both")
    plan = await orch.plan(WorkerPool.of([both]), REQ, both)
    assert plan.mode is Mode.AGGREGATED and seen == []
    orch2, _ = orchestrator({"p1": "ok"})
    await orch2.plan(WorkerPool.of([worker("p1", "prefill")]), REQ, DECODE)
    assert orch2.load.count("p1") == 0

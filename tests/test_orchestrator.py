"""The orchestrator walks a RoutePlan: failure policy, with prefill workers behind httpx's MockTransport (no sockets)."""

import httpx
import pytest

from litellm_disagg.engines.base import Endpoint
from litellm_disagg.routing.accounting import Accounting
from litellm_disagg.routing.cooldown import FailureCooldown
from litellm_disagg.routing.orchestrator import Mode, NoPrefillAvailable, Orchestrator
from litellm_disagg.routing.request import DisaggRequest
from litellm_disagg.routing.route_plan import RoutePlan
from litellm_disagg.transfer.prefill import PrefillClient, PrefillRejected

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


async def test_a_worker_that_went_cooling_is_tried_last_and_load_is_released():
    cooldown = FailureCooldown(cooldown_s=60)
    cooldown.failed("p1")
    orch, seen = orchestrator({"p1": "ok", "p2": "ok"}, cooldown=cooldown)
    outcome = await orch.run(REQ, plan("p1", "p2"))
    assert seen == ["p2"] and outcome.prefill_worker_id == "p2"
    assert orch.accounting.requests("p2") == 0 and len(orch.accounting) == 0

"""Concurrent orchestration (SGLang's bootstrap rooms): the decode's fields before the prefill answers, the prefill
as a background prefill flight, and a failed prefill that ends its decode instead of leaving it to wait."""

import asyncio

import pytest

from litellm_disagg.engines.base import Endpoint
from litellm_disagg.routing.orchestrator import Mode
from litellm_disagg.routing.request import DisaggRequest
from litellm_disagg.routing.route_plan import RoutePlan
from litellm_disagg.runtime_config import RuntimeConfig, SglangBootstrapTransfer

from ..support.gated_prefill import GatedWorkers, orchestrator, settle


def sglang(name: str, role: str) -> RuntimeConfig:
    return RuntimeConfig(worker_id=name, model="m", role=role, engine="sglang", base_url=f"http://{name}/v1",
                         transfer=SglangBootstrapTransfer(host=f"{name}.bootstrap", port=8998),
                         kv_capacity_blocks=100, block_size=1, state="ready")


DECODE = sglang("d", "decode")
REQ = DisaggRequest(endpoint=Endpoint.CHAT, fields={"messages": [{"role": "user", "content": "x"}]}, request_id="r1")


class Workers(GatedWorkers):
    """Prefill workers that answer, once their gate opens, as an SGLang prefill server does (the KV is pushed)."""

    abort_path = "/abort_request"

    def answer(self, host: str) -> dict:
        return {"choices": [{"index": 0, "message": {"content": "t"}}]}


async def test_decode_fields_come_before_the_prefill_answers_and_the_prefill_is_a_flight():
    workers = Workers({"p1": 200})
    orch, accounting, _ = orchestrator(workers)
    plan = RoutePlan(DECODE, (sglang("p1", "prefill"), sglang("p2", "prefill")), None, "test")
    outcome = await orch.run(REQ, plan)  # returns while the prefill is still held at the gate
    assert outcome.mode is Mode.DISAGGREGATED and outcome.prefill_worker_id == "p1"
    fields = outcome.decode_fields
    assert fields["bootstrap_host"] == "p1.bootstrap" and fields["bootstrap_port"] == 8998
    await asyncio.sleep(0.01)
    (host, path, body), = workers.calls
    assert (host, path) == ("p1", "/v1/chat/completions")
    assert body["bootstrap_room"] == fields["bootstrap_room"] and body["stream"] is False  # the same room
    assert accounting.requests("p1") == 1  # counted as a prefill flight while it runs
    workers.gate.set()
    await settle(orch)
    assert accounting.requests("p1") == 0 and len(accounting) == 0
    assert [c for c in workers.calls if c[1] == "/abort_request"] == []


@pytest.mark.parametrize("failure", [503, 429, "refused", 400])
async def test_a_failed_prefill_ends_its_decode_and_cools_down(failure):
    workers = Workers({"p1": failure})
    workers.gate.set()
    orch, accounting, cooldown = orchestrator(workers, abort_window_s=0.05)
    plan = RoutePlan(DECODE, (sglang("p1", "prefill"), sglang("p2", "prefill")), None, "test")
    outcome = await orch.run(REQ, plan)
    await settle(orch)
    aborts = [(host, body) for host, path, body in workers.calls if path == "/abort_request"]
    # The decode is told to stop waiting, by its rid, more than once (it may reach its worker after the failure).
    assert len(aborts) >= 2 and all(a == ("d", {"rid": outcome.decode_fields["rid"]}) for a in aborts)
    assert len(accounting) == 0
    assert cooldown.prefer_healthy([sglang("p1", "prefill"), sglang("p2", "prefill")])[0].worker_id == (
        "p1" if failure == 400 else "p2"  # a rejected request says nothing about the worker
    )


async def test_a_retry_gets_a_new_room_on_the_next_healthy_worker():
    workers = Workers({"p1": 503, "p2": 200})
    workers.gate.set()
    orch, _, _ = orchestrator(workers)
    plan = RoutePlan(DECODE, (sglang("p1", "prefill"), sglang("p2", "prefill")), None, "test")
    first = await orch.run(REQ, plan)
    await settle(orch)
    second = await orch.run(REQ, plan)  # LiteLLM's retry runs the selection again; p1 now cools down
    await settle(orch)
    assert second.prefill_worker_id == "p2" and second.decode_fields["bootstrap_host"] == "p2.bootstrap"
    assert second.decode_fields["bootstrap_room"] != first.decode_fields["bootstrap_room"]


async def test_an_sglang_decode_worker_never_serves_aggregated():
    from litellm_disagg.routing.orchestrator import NoPrefillAvailable
    from litellm_disagg.routing.route_plan import serves_alone

    workers = Workers({"p1": 503})
    workers.gate.set()
    orch, _, _ = orchestrator(workers)
    assert not serves_alone(DECODE) and serves_alone(sglang("b", "both"))
    with pytest.raises(NoPrefillAvailable):  # no prefill worker at all
        await orch.run(REQ, RoutePlan(DECODE, (), None, "no prefill worker"))
    with pytest.raises(NoPrefillAvailable):  # a local decision (e.g. several completions)
        await orch.run(REQ, RoutePlan(DECODE, (), "request has several prompts or completions", "x"))
    both = sglang("b", "both")  # SGLang's mode null: an aggregated server
    outcome = await orch.run(REQ, RoutePlan(both, (), "short prompt", "x"))
    assert outcome.mode is Mode.AGGREGATED and outcome.decode_fields == {}


async def test_a_background_prefills_answer_marks_its_prompt_computed():
    """The concurrent path also tells ``PrefillProgress`` when its prefill answered (``prefill_done`` before the
    flight ends), so the line is fitted from SGLang prefills too; a failed one is dropped, not observed."""
    from litellm_disagg.routing.kv.block_hash import PromptBlocks
    from litellm_disagg.routing.kv.disagg_decision import LinearEstimate
    from litellm_disagg.routing.kv.prefill_progress import PrefillProgress

    workers = Workers({"p1": 200})
    orch, accounting, _ = orchestrator(workers)
    progress = PrefillProgress(LinearEstimate(0.0, 1000.0))
    accounting.prefill_watcher = progress
    plan = RoutePlan(DECODE, (sglang("p1", "prefill"),), None, "test", prompt=PromptBlocks(list(range(64))))
    await orch.run(REQ, plan)
    await asyncio.sleep(0.01)
    assert len(progress) == 1 and progress.line.observations == 0  # sent, still computing
    workers.gate.set()
    await settle(orch)
    assert progress.line.observations == 1 and len(progress) == 0 and len(accounting) == 0

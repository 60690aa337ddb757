"""The route planner: one request's decode worker, prefill failover order, or why it prefills locally."""

from dataclasses import replace

import pytest

from litellm_disagg.engines.base import Endpoint
from litellm_disagg.routing.accounting import Accounting, FlightKey
from litellm_disagg.routing.cooldown import FailureCooldown
from litellm_disagg.routing.kv.disagg_decision import DisaggDecision
from litellm_disagg.routing.pipeline.pipeline import Pipeline
from litellm_disagg.routing.pipeline.profile import PICKER_PROFILES
from litellm_disagg.routing.pipeline.providers import LoadProvider
from litellm_disagg.routing.pool import WorkerPool
from litellm_disagg.routing.request import DisaggRequest
from litellm_disagg.routing.route_plan import NOT_SPLITTABLE, ONLY_ITSELF, NoDecodeWorker, RoutePlanner

from ..test_routing_units import w

CHAT = DisaggRequest(endpoint=Endpoint.CHAT, fields={"messages": [{"role": "user", "content": "x"}]}, request_id="r")
TWO = DisaggRequest(endpoint=Endpoint.CHAT, fields={"messages": [{"role": "user", "content": "x"}], "n": 2}, request_id="r")


def planner(accounting: Accounting, cooldown: FailureCooldown | None = None, provider=None) -> RoutePlanner:
    profile = PICKER_PROFILES["least_inflight"]
    return RoutePlanner(
        provider=provider or LoadProvider(accounting),
        decode=Pipeline(profile()),
        prefill=Pipeline(profile()),
        cooldown=cooldown or FailureCooldown(),
    )


async def test_decode_by_load_prefill_order_by_load_without_the_decode_worker():
    accounting = Accounting()
    accounting.start(FlightKey.decode("x"), "d1")
    accounting.start(FlightKey.prefill("y"), "p2")
    workers = [w("d1"), w("d2"), w("b1", "both"), w("p1", "prefill"), w("p2", "prefill"), w("px", "prefill", model="other")]
    pool = WorkerPool.of(workers)
    plan = await planner(accounting).plan(CHAT, pool, pool.decode_candidates("tiny"))
    assert plan.decode.worker_id in {"b1", "d2"} and plan.local_reason is None
    order = [p.worker_id for p in plan.prefill_order]
    assert plan.decode.worker_id not in order and order[-1] == "p2" and "px" not in order
    assert set(order) == {"b1", "p1", "p2"} - {plan.decode.worker_id}


async def test_requests_that_cannot_be_split_and_missing_prefill_workers():
    pool = WorkerPool.of([w("d1"), w("p1", "prefill")])
    plan = await planner(Accounting()).plan(TWO, pool, pool.decode_candidates("tiny"))
    assert plan.prefill_order == () and plan.local_reason == NOT_SPLITTABLE
    alone = WorkerPool.of([w("d1")])
    plan = await planner(Accounting()).plan(CHAT, alone, alone.decode_candidates("tiny"))
    assert plan.prefill_order == () and plan.local_reason is None  # a fallback, for the orchestrator to allow or refuse
    with pytest.raises(NoDecodeWorker):
        await planner(Accounting()).plan(CHAT, alone, [w("d9", state="draining")])


async def test_an_aggregated_worker_with_nobody_else_to_prefill_serves_by_layout_not_as_a_fallback():
    alone = WorkerPool.of([w("b1", "both"), w("px", "prefill", model="other")])
    plan = await planner(Accounting()).plan(CHAT, alone, alone.decode_candidates("tiny"))
    assert plan.prefill_order == () and plan.local_reason == ONLY_ITSELF  # a choice: never refused, not counted a fallback
    two = WorkerPool.of([w("b1", "both"), w("b2", "both")])
    plan = await planner(Accounting()).plan(CHAT, two, two.decode_candidates("tiny"))
    assert [p.worker_id for p in plan.prefill_order] == ["b2" if plan.decode.worker_id == "b1" else "b1"]
    # A prefill worker that exists but sits in failure cooldown: still a fallback (its pool is down, not absent).
    cooldown = FailureCooldown(cooldown_s=60)
    cooldown.failed("p1")
    cooled = WorkerPool.of([w("b1", "both"), w("p1", "prefill")])
    plan = await planner(Accounting(), cooldown).plan(CHAT, cooled, [w("b1", "both")])
    assert plan.prefill_order == () and plan.local_reason is None


async def test_cooling_workers_go_last_and_the_provider_decides_local():
    cooldown = FailureCooldown(cooldown_s=60)
    cooldown.failed("d1")
    pool = WorkerPool.of([w("d1"), w("d2"), w("p1", "prefill")])
    plan = await planner(Accounting(), cooldown).plan(CHAT, pool, pool.decode_candidates("tiny"))
    assert plan.decode.worker_id == "d2"

    class Local(LoadProvider):
        def decide(self, prompt, decode, prefill):
            return DisaggDecision(False, "cheaper here")

    accounting = Accounting()
    plan = await planner(accounting, provider=Local(accounting)).plan(CHAT, pool, pool.decode_candidates("tiny"))
    assert plan.prefill_order == () and plan.local_reason == "cheaper here"


async def test_an_sglang_decode_worker_always_gets_a_remote_prefill_and_engines_never_mix():
    from litellm_disagg.runtime_config import SglangBootstrapTransfer

    def sg(worker_id, role):
        return w(worker_id, role).model_copy(
            update={"engine": "sglang", "transfer": SglangBootstrapTransfer(host="h", port=8998)}
        )

    class Local(LoadProvider):
        def decide(self, prompt, decode, prefill):
            return DisaggDecision(False, "cheaper here")

    pool = WorkerPool.of([sg("d1", "decode"), sg("p1", "prefill"), w("vp", "prefill")])
    accounting = Accounting()
    plan = await planner(accounting, provider=Local(accounting)).plan(CHAT, pool, pool.decode_candidates("tiny"))
    # SGLang's decode mode cannot compute the prompt: the local decision is overruled; the vLLM prefill is no option.
    assert [p.worker_id for p in plan.prefill_order] == ["p1"] and plan.local_reason is None


async def test_a_decode_worker_gone_during_the_prefill_is_replaced_unless_the_fields_were_made_for_it():
    from litellm_disagg.runtime_config import SglangBootstrapTransfer

    pool = WorkerPool.of([w("d1"), w("d2"), w("d3", state="draining"), w("p1", "prefill")])
    route = planner(Accounting())
    plan = await route.plan(CHAT, pool, pool.decode_candidates("tiny"))
    dead = plan.decode.worker_id
    candidates = [pool.get("d1"), pool.get("d2"), pool.get("d3")]
    assert route.replacement_decode(plan, pool, candidates, prefill_worker_id="p1") is None  # still there
    gone = WorkerPool.of([x for x in pool.workers if x.worker_id != dead])  # discovery dropped it
    [live] = {"d1", "d2"} - {dead}
    assert route.replacement_decode(plan, gone, candidates, prefill_worker_id="p1").worker_id == live  # not the draining d3
    assert route.replacement_decode(plan, gone, candidates, prefill_worker_id=None).worker_id == live  # a local prefill
    room = plan.decode.model_copy(update={"engine": "sglang", "transfer": SglangBootstrapTransfer(host="h", port=8998)})
    # A concurrent protocol's decode fields name the decode worker's bootstrap room: nothing to replace it with.
    assert route.replacement_decode(replace(plan, decode=room), gone, candidates, prefill_worker_id="p1") is None

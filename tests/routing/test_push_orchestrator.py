"""Concurrent orchestration with vLLM's push connector: the decode names the prefill engine before the prefill
answers, the prefill runs in the background, and a failed prefill ends its decode through vLLM's abort endpoint."""

import asyncio

import httpx
import pytest

from litellm_disagg.engines.base import Endpoint
from litellm_disagg.routing.cooldown import FailureCooldown
from litellm_disagg.routing.orchestrator import Mode
from litellm_disagg.routing.request import DisaggRequest
from litellm_disagg.routing.route_plan import RoutePlan
from litellm_disagg.runtime_config import RuntimeConfig, VllmNixlPushTransfer

from ..support.gated_prefill import GatedWorkers, orchestrator, settle


def push(name: str, role: str) -> RuntimeConfig:
    return RuntimeConfig(worker_id=name, model="m", role=role, engine="vllm", base_url=f"http://{name}/v1",
                         transfer=VllmNixlPushTransfer(host=f"{name}.nixl", port=5600, engine_id=f"{name}-engine"),
                         kv_capacity_blocks=100, block_size=16, state="ready")


DECODE = push("d", "decode")
REQ = DisaggRequest(endpoint=Endpoint.CHAT, fields={"messages": [{"role": "user", "content": "x"}]}, request_id="r1")


class Workers(GatedWorkers):
    """Prefill workers that answer, once their gate opens, as a push-mode vLLM does."""

    abort_path = "/abort_requests"

    def abort_response(self) -> httpx.Response:
        return httpx.Response(200, json={"status": "aborted"})

    def answer(self, host: str) -> dict:
        params = {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [[0]],
                  "remote_engine_id": f"{host}-engine", "remote_request_id": "chatcmpl-r1-0123abcd",
                  "remote_host": f"{host}.nixl", "remote_port": 5600, "tp_size": 1, "transfer_mode": "push"}
        return {"choices": [{"index": 0}], "usage": {"prompt_tokens": 3}, "kv_transfer_params": params}


async def test_the_decode_names_the_prefill_engine_before_the_prefill_answers():
    workers = Workers(200)
    orch, accounting, _ = orchestrator(workers)
    outcome = await orch.run(REQ, RoutePlan(DECODE, (push("p1", "prefill"),), None, "test"))  # prefill held
    assert outcome.mode is Mode.DISAGGREGATED and outcome.prefill_worker_id == "p1"
    params = outcome.decode_fields["kv_transfer_params"]
    assert params["do_remote_prefill"] is True and params["remote_engine_id"] == "p1-engine"
    assert (params["remote_host"], params["remote_port"], params["tp_size"]) == ("p1.nixl", 5600, 1)
    await asyncio.sleep(0.01)
    (host, path, body), = workers.calls
    assert (host, path) == ("p1", "/v1/chat/completions")
    assert body["kv_transfer_params"] == {"do_remote_decode": True} and body["max_tokens"] == 1
    assert accounting.requests("p1") == 1
    workers.gate.set()
    await settle(orch)
    assert len(accounting) == 0 and [c for c in workers.calls if c[1] == "/abort_requests"] == []


@pytest.mark.parametrize("failure", [503, "refused"])
async def test_a_failed_prefill_aborts_its_decode_by_vllms_request_ids(failure):
    workers = Workers(failure)
    workers.gate.set()
    orch, accounting, cooldown = orchestrator(workers, abort_window_s=0.05)
    await orch.run(REQ, RoutePlan(DECODE, (push("p1", "prefill"), push("p2", "prefill")), None, "test"))
    await settle(orch)
    aborts = [(host, body) for host, path, body in workers.calls if path == "/abort_requests"]
    assert aborts and all(a == ("d", {"request_ids": ["chatcmpl-r1", "cmpl-r1-0"]}) for a in aborts)
    assert len(accounting) == 0
    assert cooldown.prefer_healthy([push("p1", "prefill"), push("p2", "prefill")])[0].worker_id == "p2"


async def test_a_failed_push_attempt_sends_no_pull_release_and_raises_nothing():
    """KV release speaks the prefill worker's own protocol: a push prefill is not released as a pull one (its
    PushTicket is no KVTransferParams); the prefill engine's lease frees its blocks."""
    from litellm_disagg.engines.vllm.push import VllmNixlPushProtocol
    from litellm_disagg.routing.kv_release import KVReleases
    from litellm_disagg.routing.pool import WorkerPool

    sent = []

    class Sender:
        async def post_control(self, worker, path, body):
            sent.append((worker.worker_id, path))

    prefill = push("p1", "prefill")
    pool = WorkerPool.of([prefill, DECODE])
    releases = KVReleases(sender=Sender(), pool=lambda: pool, cooldown=FailureCooldown())
    ticket = VllmNixlPushProtocol().open_transfer(prefill=prefill, decode=DECODE, request_id="r1")
    releases.attempt("c", decode=DECODE, prefill=prefill, handle=ticket)
    releases.ended("c", worker_id="d", failed=True)
    for _ in range(5):
        await asyncio.sleep(0)
    assert sent == [] and releases.open() == 0

"""KVReleases: which routing attempts get their unread prefill KV released, and through which decode worker."""

import asyncio

import pytest

from litellm_disagg.engines.vllm.transfer import RELEASE_MODEL, RELEASE_PATH, KVTransferParams
from litellm_disagg.routing.cooldown import FailureCooldown
from litellm_disagg.routing.kv_release import KVReleases
from litellm_disagg.routing.pool import WorkerPool

from ..test_routing_units import w

P = w("p", "prefill")
D1, D2, D3 = w("d1", "decode"), w("d2", "decode"), w("d3", "decode")


def handle(n: int) -> KVTransferParams:
    return KVTransferParams.model_validate({
        "do_remote_prefill": True, "remote_engine_id": "E", "remote_request_id": f"r{n}", "remote_block_ids": [[n]],
        "remote_host": "127.0.0.1", "remote_port": 5600,
    })  # fmt: skip


class Sender:
    def __init__(self, down: set[str] = frozenset()):
        self.sent: list[tuple[str, str, dict]] = []
        self.down = down

    async def post_control(self, worker, path, body):
        self.sent.append((worker.worker_id, path, body))
        return None if worker.worker_id in self.down else 404


def releases(sender: Sender, workers=(P, D1, D2), cooldown: FailureCooldown | None = None) -> KVReleases:
    pool = WorkerPool.of(workers)
    return KVReleases(sender=sender, pool=lambda: pool, cooldown=cooldown or FailureCooldown())


async def settle(r: KVReleases) -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def released(sender: Sender) -> list[str]:
    return [body["kv_transfer_params"]["remote_request_id"] for _, _, body in sender.sent if "kv_transfer_params" in body]


async def test_a_failed_attempt_is_released_through_its_own_decode_worker():
    sender = Sender()
    r = releases(sender)
    r.attempt("c", decode=D1, prefill=P, handle=handle(1))
    r.ended("c", worker_id="d1", failed=True)
    await settle(r)
    assert sender.sent == [("d1", RELEASE_PATH, {
        "model": RELEASE_MODEL, "prompt": [0], "max_tokens": 1, "kv_transfer_params": handle(1).for_decode()
    })]  # fmt: skip
    assert r.open() == 0 and r.sent == 1


@pytest.mark.parametrize("how", ["first chunk", "success"])
async def test_a_decode_that_produced_is_never_released(how):
    sender = Sender()
    r = releases(sender)
    r.attempt("c", decode=D1, prefill=P, handle=handle(1))
    if how == "first chunk":
        r.started("c")
    r.ended("c", worker_id="d1", failed=how == "first chunk")  # a stream cut mid-answer: its KV was read
    await settle(r)
    assert sender.sent == [] and r.open() == 0


async def test_a_retry_releases_the_earlier_attempt_and_its_late_event_does_not_touch_the_retry():
    sender = Sender()
    r = releases(sender)
    r.attempt("c", decode=D1, prefill=P, handle=handle(1))
    r.attempt("c", decode=D1, prefill=P, handle=handle(2))  # LiteLLM retried on the same worker
    await settle(r)
    assert released(sender) == ["r1"]
    r.ended("c", worker_id="d1", failed=True)  # attempt 1's failure event, late: already released
    await settle(r)
    assert released(sender) == ["r1"] and r.open() == 1
    r.started("c")
    r.ended("c", worker_id="d1", failed=False)
    await settle(r)
    assert released(sender) == ["r1"] and r.open() == 0


async def test_an_aggregated_attempt_keeps_its_place_so_a_late_event_ends_the_right_one():
    sender = Sender()
    r = releases(sender)
    r.attempt("c", decode=D1, prefill=None, handle=None)  # served aggregated: nothing to release
    r.attempt("c", decode=D1, prefill=P, handle=handle(2))
    r.ended("c", worker_id="d1", failed=True)  # the aggregated attempt's event
    await settle(r)
    assert sender.sent == [] and r.open() == 1


async def test_a_dead_decode_worker_is_skipped_for_a_live_healthy_one():
    sender = Sender(down={"d1"})
    cooldown = FailureCooldown()
    cooldown.failed("d2")
    r = releases(sender, workers=(P, D1, D2, D3), cooldown=cooldown)
    r.attempt("c", decode=D1, prefill=P, handle=handle(1))
    r.ended("c", worker_id="d1", failed=True)
    await settle(r)
    assert [wid for wid, _, _ in sender.sent] == ["d1", "d3"]  # its own first; d2 cools down


async def test_no_decode_worker_left_leaves_it_to_the_engine_lease():
    sender = Sender()
    r = releases(sender, workers=(P,))
    r.attempt("c", decode=D1, prefill=P, handle=handle(1))
    r.ended("c", worker_id="d1", failed=True)
    await settle(r)
    assert sender.sent == [] and r.open() == 0


async def test_old_entries_are_forgotten():
    r = releases(Sender())
    r.max_age_s = 0.0
    r.attempt("a", decode=D1, prefill=P, handle=handle(1))
    r.started("a")
    await asyncio.sleep(0.01)
    r.attempt("b", decode=D1, prefill=P, handle=handle(2))
    assert r.open() == 1


async def test_after_a_release_its_decode_worker_is_asked_for_engine_steps():
    # vLLM sends the "nothing read" notification on a later engine step, once connected to the prefill worker; an
    # idle engine takes none by itself (measured: a fresh pair's blocks never came back within 300 s).
    sender = Sender()
    pool = WorkerPool.of((P, D1, D2))
    r = KVReleases(sender=sender, pool=lambda: pool, cooldown=FailureCooldown(), step_delays_s=(0.0, 0.01, 0.02))
    r.attempt("c", decode=D1, prefill=P, handle=handle(1))
    r.ended("c", worker_id="d1", failed=True)
    for _ in range(100):
        if r.steps == 3:
            break
        await asyncio.sleep(0.01)
    step = {"model": D1.model, "prompt": [0], "max_tokens": 1}
    assert sender.sent[1:] == [("d1", RELEASE_PATH, step)] * 3  # the same worker, its own model, one token each
    assert r.sent == 1 and r.steps == 3


async def test_no_steps_are_asked_of_a_worker_that_did_not_answer_or_when_turned_off():
    sender = Sender(down={"d1", "d2"})
    pool = WorkerPool.of((P, D1, D2))
    r = KVReleases(sender=sender, pool=lambda: pool, cooldown=FailureCooldown(), step_delays_s=(0.0,))
    r.attempt("c", decode=D1, prefill=P, handle=handle(1))
    r.ended("c", worker_id="d1", failed=True)
    for _ in range(20):
        await asyncio.sleep(0.01)
    assert [wid for wid, _, _ in sender.sent] == ["d1", "d2"] and r.steps == 0
    sender = Sender()
    r = KVReleases(sender=sender, pool=lambda: pool, cooldown=FailureCooldown(), step_delays_s=())
    r.attempt("c", decode=D1, prefill=P, handle=handle(1))
    r.ended("c", worker_id="d1", failed=True)
    for _ in range(20):
        await asyncio.sleep(0.01)
    assert len(sender.sent) == 1 and r.steps == 0


async def test_a_release_goes_through_a_decode_worker_already_connected_to_the_prefill_worker():
    # A first contact makes the decode worker handshake with the prefill worker (vLLM allows 5 s); on a loaded CPU
    # machine that timed out and the blocks stayed for the whole lease. D2 has read from P before; D1 has not.
    sender = Sender()
    r = releases(sender)
    r.attempt("earlier", decode=D2, prefill=P, handle=handle(0))
    r.started("earlier")
    r.ended("earlier", worker_id="d2", failed=False)
    r.attempt("c", decode=D1, prefill=P, handle=handle(1))
    r.ended("c", worker_id="d1", failed=True)
    await settle(r)
    assert [(wid, body["kv_transfer_params"]["remote_request_id"]) for wid, _, body in sender.sent] == [("d2", "r1")]


async def test_a_local_prefill_connects_no_pair():
    sender = Sender()
    r = releases(sender)
    r.attempt("local", decode=D2, prefill=None, handle=None)
    r.started("local")
    r.attempt("c", decode=D1, prefill=P, handle=handle(1))
    r.ended("c", worker_id="d1", failed=True)
    await settle(r)
    assert [wid for wid, _, _ in sender.sent] == ["d1"]

"""Liveness: a worker whose port refuses connections is passed over for new work at once, until discovery drops or
replaces its entry; the failure cooldown alone ran out before discovery's TTL did."""

import asyncio

from litellm_disagg.ports import free_port
from litellm_disagg.routing.accounting import Accounting, FlightKey
from litellm_disagg.routing.cooldown import FailureCooldown
from litellm_disagg.routing.liveness import Liveness, refuses_connections
from litellm_disagg.routing.pool import WorkerPool

from ..test_routing_units import w
from .test_route_plan import CHAT, planner


async def _listener() -> tuple[asyncio.Server, int]:
    server = await asyncio.start_server(lambda r, wr: wr.close(), "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def test_the_probe_says_refused_only_for_a_closed_port():
    server, open_port = await _listener()
    try:
        assert await refuses_connections(w("up", port=open_port)) is False
        assert await refuses_connections(w("dead", port=free_port())) is True
    finally:
        server.close()
        await server.wait_closed()


async def test_a_decode_worker_that_refuses_connections_gets_no_new_requests_after_its_cooldown():
    server, live_port = await _listener()
    dead, live = w("d1", port=free_port()), w("d2", port=live_port)
    pool = WorkerPool.of([dead, live])
    cooldown = FailureCooldown(cooldown_s=0)  # the cooldown is over at once: discovery still lists the dead worker
    cooldown.liveness = liveness = Liveness(lambda: pool)
    accounting = Accounting()
    for i in range(5):  # the live worker is busy, the dead one idle: by load alone the dead one wins every pick
        accounting.start(FlightKey.decode(f"busy-{i}"), "d2")
    route = planner(accounting, cooldown)
    try:
        assert (await route.plan(CHAT, pool, pool.decode_candidates("tiny"))).decode.worker_id == "d1"

        cooldown.failed("d1")  # a decode call to it failed (a reset stream, a refused connect)
        cooldown.failed("d2")  # and one to the live worker (a 5xx): probed, answers, not held
        await liveness.probed()
        for _ in range(5):
            assert (await route.plan(CHAT, pool, pool.decode_candidates("tiny"))).decode.worker_id == "d2"
        assert cooldown.held(dead) and not cooldown.held(live)

        # Never refuse the last one: alone, the held worker is still a candidate (the call fails as it would have).
        assert cooldown.prefer_healthy([dead]) == [dead]

        # Restarted (a new registration in discovery): no longer held. Dropped from discovery: forgotten.
        restarted = dead.model_copy(update={"started_at": dead.started_at + 1})
        assert not cooldown.held(restarted)
        cooldown.failed("d1")
        await liveness.probed()
        assert cooldown.held(dead)
        pool = WorkerPool.of([live])
        liveness.sync(pool)
        assert not cooldown.held(dead)
    finally:
        await liveness.aclose()
        server.close()
        await server.wait_closed()


async def test_without_a_liveness_the_dead_worker_is_picked_again_once_its_cooldown_is_over():
    # The before of the test above: the failure cooldown alone (over at once here) lets the idle dead worker win.
    pool = WorkerPool.of([w("d1", port=free_port()), w("d2", port=free_port())])
    cooldown = FailureCooldown(cooldown_s=0)
    accounting = Accounting()
    accounting.start(FlightKey.decode("busy"), "d2")
    cooldown.failed("d1")
    plan = await planner(accounting, cooldown).plan(CHAT, pool, pool.decode_candidates("tiny"))
    assert plan.decode.worker_id == "d1"

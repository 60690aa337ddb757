"""In-flight load shared between proxy replicas through a real Redis (``routing/shared_inflight.py``).

Two replicas are two ``Accounting`` objects, each with its own exchange, over one real ``redis-server``: what one
sends is counted in the other's decisions, a replica that leaves or dies stops counting, a hostile entry is not
believed, and a Redis that goes away leaves each replica routing on its own counts. The LiteLLM router's own Redis
(``router_settings: redis_host/redis_port``) is the default one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging

import litellm
import pytest
import redis.asyncio as aioredis

from litellm_disagg.routing.accounting import Accounting, FlightKey, WorkerFlights
from litellm_disagg.routing.pipeline.context import collect_loads
from litellm_disagg.routing.pool import WorkerPool
from litellm_disagg.routing.redis_exchange import RedisExchange
from litellm_disagg.routing.shared_inflight import SharedInflight, SharedInflightSettings, encode, parse_others
from litellm_disagg.settings import DisaggSettings

from ..kv.zmq_pub import until
from ..support.redis_server import redis_fixtures, redis_server
from ..test_routing_units import w
from .test_route_plan import CHAT, planner

KEY = "test:inflight"


redis_port, client = redis_fixtures(KEY)


def replica(client, name: str, *, ttl_s: float = 2.0, clock=None) -> tuple[Accounting, SharedInflight]:
    accounting = Accounting()
    settings = SharedInflightSettings(enabled=True, key=KEY, interval_s=0.05, ttl_s=ttl_s)
    kwargs = {"clock": clock} if clock is not None else {}
    return accounting, SharedInflight(accounting, lambda: client, settings, replica=name, **kwargs)


# -- the accounting's side (no Redis) ---------------------------------------------------------------------------------


def test_the_other_replicas_totals_count_in_every_read_but_the_replicas_own_metrics():
    accounting = Accounting()
    accounting.start(FlightKey.decode("a"), "w1", prefill_tokens=100, decode_blocks=3, pull_tokens=7)
    version = accounting.version
    accounting.set_others({"w1": WorkerFlights(2, 50, 4, 1), "w2": WorkerFlights(1, 0, 2, 0)})
    assert accounting.version > version  # a cached load snapshot is rebuilt
    assert (accounting.requests("w1"), accounting.prefill_tokens("w1"), accounting.decode_blocks("w1"),
            accounting.pull_tokens("w1")) == (3, 150, 7, 8)
    requests, prefill, decode = accounting.lookups()
    assert (requests("w2", 0), prefill("w2", 0), decode("w2", 0), accounting.pull_lookup()("w1", 0)) == (1, 0, 2, 8)
    own_requests, own_prefill, _ = accounting.own_lookups()
    assert (own_requests("w1", 0), own_requests("w2", 0), own_prefill("w1", 0)) == (1, 0, 100)
    assert accounting.own_totals() == {"w1": WorkerFlights(1, 100, 3, 7)}
    loads = collect_loads([w("w1"), w("w2"), w("w3")], accounting=accounting)
    assert [loads[x].inflight_requests for x in ("w1", "w2", "w3")] == [3, 1, 0]
    version = accounting.version
    accounting.set_others({"w1": WorkerFlights(2, 50, 4, 1), "w2": WorkerFlights(1, 0, 2, 0)})
    assert accounting.version == version  # the same totals again change nothing
    accounting.set_others({})
    assert accounting.requests("w1") == 1 and accounting.lookups()[0]("w2", 0) == 0


def test_an_entry_whose_figures_are_not_counts_is_skipped():
    good = encode({"w1": WorkerFlights(2, 10, 1, 0)})
    entries = [("r1", good), ("r2", '{"w1": [-1, 0, 0, 0], "w2": [1, 0, 0, 0], "w3": "x", "w4": [1, 2]}'),
               ("r3", "not json"), ("r4", "[1, 2]"), ("r5", '{"w1": [1.5, 0, 0, 0], "w5": [99999999999999999, 0, 0, 0]}'),
               ("r6", '{"w1": [1, 0, 0, 0]}')]
    others, bad = parse_others(entries)
    assert others == {"w1": WorkerFlights(3, 10, 1, 0), "w2": WorkerFlights(1, 0, 0, 0)}
    assert bad == ["r2", "r3", "r4", "r5"]


def test_settings_default_to_auto_and_check_the_ttl():
    assert DisaggSettings().shared_inflight.enabled == "auto"
    with pytest.raises(ValueError, match="ttl_s"):
        SharedInflightSettings(interval_s=1.0, ttl_s=1.5)
    with pytest.raises(ValueError):
        DisaggSettings.model_validate({"shared_inflight": {"redis": "localhost"}})


# -- over a real Redis --------------------------------------------------------------------------------------------------


async def test_what_one_replica_sends_counts_in_the_others_decisions(client):
    a_acc, a = replica(client, "a")
    b_acc, b = replica(client, "b")
    pool = WorkerPool.of([w("d1"), w("d2")])
    a_acc.start(FlightKey.decode("x1"), "d1", prefill_tokens=500)
    a_acc.start(FlightKey.decode("x2"), "d1")
    # Before any exchange, B cannot tell the two workers apart: least-inflight ties and picks either.
    assert await a.exchange() and await b.exchange()
    assert b_acc.requests("d1") == 2 and b_acc.prefill_tokens("d1") == 500 and b_acc.own_lookups()[0]("d1", 0) == 0
    for _ in range(20):  # never the worker A loaded (a tie would pick it about half of the time)
        plan = await planner(b_acc).plan(CHAT, pool, pool.decode_candidates("tiny"))
        assert plan.decode.worker_id == "d2"
    # B's own request counts on A's side too, and A's finished requests stop counting on B's.
    b_acc.start(FlightKey.decode("y1"), "d2")
    a_acc.finish(FlightKey.decode("x1"))
    a_acc.finish(FlightKey.decode("x2"))
    assert await b.exchange() and await a.exchange() and await b.exchange()
    assert a_acc.requests("d2") == 1 and b_acc.requests("d1") == 0 and b_acc.requests("d2") == 1


async def test_a_replica_that_stops_leaves_at_once_and_one_that_dies_after_its_ttl(client):
    # A TTL of 2 s (each round trip may take up to 1 s): a loaded machine's slow reply must not read as a death.
    a_acc, a = replica(client, "a", ttl_s=2.0)
    b_acc, b = replica(client, "b", ttl_s=2.0)
    c_acc, c = replica(client, "c", ttl_s=2.0)
    a_acc.start(FlightKey.decode("x"), "d1")
    c_acc.start(FlightKey.decode("z"), "d1")
    a.start()
    c.start()
    await _until(lambda: b_acc.requests("d1") == 2, b)
    await a.stop()  # deletes its field
    assert a_acc.requests("d1") == 1  # its own count stays; the others' are dropped
    assert await b.exchange() and b_acc.requests("d1") == 1
    for task in (c._task, c._listener):  # c dies: no exchange, no goodbye, no wake-ups heard
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    await asyncio.sleep(2.5)  # past its TTL
    assert await b.exchange() and b_acc.requests("d1") == 0
    assert await client.hkeys(KEY) == [b"b"]  # the dead replica's field is gone from Redis too


async def test_a_hostile_entry_is_skipped_and_logged_never_counted(client, caplog):
    b_acc, b = replica(client, "b")
    seconds, micros = await client.time()
    now_ms = seconds * 1000 + micros // 1000
    await client.hset(KEY, mapping={
        "liar": f"{now_ms} " + json.dumps({"d1": [-50, 0, 0, 0], "d2": [1 << 50, 0, 0, 0], "d3": [2, 0, 0, 0]}),
        "junk": "no stamp here",
        "stale": f"{now_ms - 60_000} " + json.dumps({"d1": [9, 0, 0, 0]}),
    })
    with caplog.at_level(logging.WARNING, logger="litellm_disagg.routing.shared_inflight"):
        assert await b.exchange()
    assert (b_acc.requests("d1"), b_acc.requests("d2"), b_acc.requests("d3")) == (0, 0, 2)
    assert "liar" in caplog.text
    assert set(await client.hkeys(KEY)) == {b"b", b"liar"}  # unreadable and stale fields deleted
    # What is remembered of bad fields is what Redis holds now: a writer rotating field names cannot grow it.
    await client.hdel(KEY, "liar")
    assert await b.exchange() and b._distrusted == set()


async def test_without_redis_each_replica_routes_on_its_own_counts(tmp_path, caplog):
    with redis_server(tmp_path / "r") as port:
        client = aioredis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=0.5, socket_timeout=0.5)
        now = [0.0]
        a_acc, a = replica(client, "a", ttl_s=1.0, clock=lambda: now[0])
        b_acc, b = replica(client, "b", ttl_s=1.0, clock=lambda: now[0])
        a_acc.start(FlightKey.decode("x"), "d1")
        assert await a.exchange() and await b.exchange() and b_acc.requests("d1") == 1
    # The server is gone.
    with caplog.at_level(logging.WARNING, logger="litellm_disagg.routing.shared_inflight"):
        now[0] = 0.5
        assert not await b.exchange()
        assert b_acc.requests("d1") == 1  # the last good read holds for ttl_s
        now[0] = 1.5
        assert not await b.exchange()
        assert b_acc.requests("d1") == 0
    assert caplog.text.count("Redis exchange failed") == 1  # one warning, not one per interval
    await client.aclose()


async def test_auto_uses_the_litellm_routers_redis_and_is_off_without_one(redis_port, client):
    settings = SharedInflightSettings(key=KEY)  # enabled: auto
    plain = litellm.Router(model_list=[])
    assert SharedInflight.for_router(settings, plain, Accounting()) is None
    assert SharedInflight.for_router(SharedInflightSettings(enabled=False), plain, Accounting()) is None
    with_redis = litellm.Router(model_list=[], redis_host="127.0.0.1", redis_port=redis_port)
    a_acc = Accounting()
    shared = SharedInflight.for_router(settings, with_redis, a_acc)
    assert shared is not None
    a_acc.start(FlightKey.decode("x"), "d1")
    assert await shared.exchange()
    b_acc, b = replica(client, "b")
    assert await b.exchange() and b_acc.requests("d1") == 1
    await shared.stop()
    own = SharedInflight.for_router(SharedInflightSettings(redis_url=f"redis://127.0.0.1:{redis_port}/0", key=KEY),
                                    plain, Accounting())
    assert own is not None and await own.exchange()
    await own.stop()
    # Turned on by hand without any Redis: no exchange, a warning, routing on its own counts.
    alone = SharedInflight.for_router(SharedInflightSettings(enabled=True, key=KEY), plain, Accounting())
    assert alone is not None and not await alone.exchange()


async def _until(check, shared: SharedInflight, tries: int = 100) -> None:
    for _ in range(tries):
        await shared.exchange()
        if check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the other replicas' totals never arrived")


async def test_a_stop_that_meets_redis_reply_still_stops_the_exchange():
    """A cancellation and Redis's reply in the same loop iteration. redis-py 8 sends every command through
    ``asyncio.wait_for`` (its ``socket_timeout``), which on Python 3.11 returns the reply and drops the cancellation:
    the exchange loop ran on and its ``stop()`` never returned (a CI run hung). This client does what redis-py does."""
    reply: asyncio.Future[list[bytes]] = asyncio.get_running_loop().create_future()

    class Client:
        def register_script(self, _source):
            return lambda keys, args: asyncio.wait_for(reply, 5.0)

    hash_ = RedisExchange(lambda: Client(), key=KEY, replica="a", ttl_s=1.0, timeout_s=5.0)
    swap = asyncio.create_task(hash_.swap("{}"))
    await asyncio.sleep(0)  # the swap awaits the reply
    reply.set_result([b"b", b"{}"])
    swap.cancel()
    with pytest.raises(asyncio.CancelledError):
        await swap


async def test_a_prompt_to_compute_is_published_at_once_and_once_per_interval(client):
    """A replica that sends a prompt to be computed publishes it at once (``ExchangeLoop.nudge``), not at its next
    tick: another replica placing a prompt meanwhile would otherwise see an idle worker for up to two intervals.
    One early exchange per interval: a second prompt waits for the tick. A call with nothing to compute waits too."""
    accounting = Accounting()
    settings = SharedInflightSettings(enabled=True, key=KEY, interval_s=60.0, ttl_s=120.0)
    a = SharedInflight(accounting, lambda: client, settings, replica="a")
    peer = SharedInflight(Accounting(), lambda: client, settings, replica="b")
    assert await peer.exchange()  # another replica's entry: someone to publish early for

    async def published() -> dict[str, list[int]] | None:
        raw = await client.hget(KEY, "a")
        return None if raw is None else json.loads(raw.decode().split(" ", 1)[1])

    async def until(check) -> None:
        for _ in range(200):
            if check(await published()):
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"not published: {await published()}")

    a.start()
    try:
        await until(lambda totals: totals == {})  # the first tick
        accounting.start(FlightKey.decode("x"), "d1")  # nothing to compute there: no early exchange
        await asyncio.sleep(0.2)
        assert await published() == {} and a.early_exchanges == 0
        accounting.start(FlightKey.prefill("p"), "p1", prefill_tokens=500)
        await until(lambda totals: totals is not None and "p1" in totals)
        assert await published() == {"d1": [1, 0, 0, 0], "p1": [1, 500, 0, 0]} and a.early_exchanges == 1
        accounting.start(FlightKey.prefill("q"), "p2", prefill_tokens=300)
        await asyncio.sleep(0.3)
        assert "p2" not in (await published() or {}) and a.early_exchanges == 1
    finally:
        await a.stop()
        await peer.stop()


async def test_a_replica_alone_makes_no_early_exchange_and_starts_once_another_appears(client):
    """One proxy with a Redis (LiteLLM's, kept for its own caching or limits) pays only its ticks: nobody would read
    an early exchange. A replica that joins is seen at the next tick, and early exchanges start from then on."""
    key = f"{KEY}:alone"
    await client.delete(key)
    settings = SharedInflightSettings(enabled=True, key=key, interval_s=0.2, ttl_s=120.0)
    accounting = Accounting()
    a = SharedInflight(accounting, lambda: client, settings, replica="a")
    b_acc = Accounting()
    b = SharedInflight(b_acc, lambda: client, settings, replica="b")
    a.start()
    try:
        await until(lambda: a.peers is not None, timeout=6)  # a's first tick
        assert a.peers == 0
        accounting.start(FlightKey.prefill("p"), "p1", prefill_tokens=500)
        await asyncio.sleep(0.5)
        assert a.early_exchanges == 0
        assert await b.exchange()
        await until(lambda: a.peers == 1, timeout=6)  # a saw b at its next tick
        assert await b.exchange() and b_acc.requests("p1") == 1  # a's tick carried it
        accounting.start(FlightKey.prefill("q"), "p2", prefill_tokens=300)
        await until(lambda: a.early_exchanges == 1, timeout=6)  # early exchanges once b was there
    finally:
        await a.stop()
        await b.stop()


async def test_a_prompt_to_compute_wakes_the_other_replicas_who_read_it_at_once(client):
    """With ticks a minute apart, B sees A's prompt at once: A's early exchange publishes a wake-up on
    ``<key>:wake`` and B exchanges on it. B's own early exchange does not wake anyone in turn, a stray message
    costs one early exchange at most (and carries nothing that is counted), and without ``publish_prompts_at_once``
    nothing is published early or woken."""
    key = f"{KEY}:woken"  # a channel of its own: another test's replicas may still be subscribed to KEY's
    await client.delete(key)
    settings = SharedInflightSettings(enabled=True, key=key, interval_s=60.0, ttl_s=120.0)
    a_acc, b_acc = Accounting(), Accounting()
    a = SharedInflight(a_acc, lambda: client, settings, replica="a")
    b = SharedInflight(b_acc, lambda: client, settings, replica="b")
    assert await b.exchange()  # b's entry is there before a's first tick: a is not alone

    async def until(check, what: str) -> None:
        for _ in range(600):
            if check():
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"{what}: a early {a.early_exchanges} woken {a.wakeups}, b early {b.early_exchanges} "
                             f"woken {b.wakeups}")

    a.start()
    b.start()
    try:
        await until(lambda: a._last_ok is not None and b._last_ok is not None, "the first ticks")
        for _ in range(1200):  # both subscribed (a wake-up before that would be lost: the ticks still carry it)
            if (await client.pubsub_numsub(f"{key}:wake"))[0][1] == 2:
                break
            await asyncio.sleep(0.05)
        assert (await client.pubsub_numsub(f"{key}:wake"))[0][1] == 2
        a_acc.start(FlightKey.prefill("p"), "p1", prefill_tokens=500)
        await until(lambda: b_acc.prefill_tokens("p1") == 500, "B never read A's prompt before its tick")
        assert (a.early_exchanges, b.wakeups, b.early_exchanges, a.wakeups) == (1, 1, 1, 0)
        # A stray message on the channel: one early exchange at most, nothing counted from it.
        await client.publish(f"{key}:wake", "someone")
        await until(lambda: a.wakeups == 1, "A never heard the stray wake-up")
        assert a_acc.requests("p1") == 1 and b_acc.requests("p1") == 1
    finally:
        await a.stop()
        await b.stop()

    quiet = SharedInflightSettings(enabled=True, key=key, interval_s=60.0, ttl_s=120.0, publish_prompts_at_once=False)
    c_acc = Accounting()
    c = SharedInflight(c_acc, lambda: client, quiet, replica="c")
    c.start()
    try:
        await until(lambda: c._last_ok is not None, "c's first tick")
        c_acc.start(FlightKey.prefill("q"), "p2", prefill_tokens=300)
        await asyncio.sleep(0.3)
        assert c.early_exchanges == 0 and c.wake_channel is None
    finally:
        await c.stop()


async def test_replicas_that_see_the_same_idle_workers_at_once_pick_different_ones(client):
    """Four replicas, four idle decode workers, one decision each before any of them is published: with the slots
    the exchange hands out (``replica_slot.py``) they pick four different workers; a replica that leaves frees its
    slot, and one with ``spread_ties: false`` keeps whole ties."""
    names = ["r1", "r2", "r3", "r4"]
    replicas = [replica(client, name) for name in names]
    for _ in range(2):  # every field written before every read
        for _, shared in replicas:
            assert await shared.exchange()
    assert sorted(acc.replica_slot for acc, _ in replicas) == [(rank, 4) for rank in range(4)]
    pool = WorkerPool.of([w(x) for x in ("d1", "d2", "d3", "d4")])
    picked = [(await planner(acc).plan(CHAT, pool, pool.decode_candidates("tiny"))).decode.worker_id
              for acc, _ in replicas]
    assert sorted(picked) == ["d1", "d2", "d3", "d4"]
    await replicas[3][1].stop()
    assert await replicas[0][1].exchange() and replicas[0][0].replica_slot == (0, 3)
    for _, shared in replicas[:3]:
        await shared.stop()
    assert all(acc.replica_slot is None for acc, _ in replicas[:3])  # stopped: alone again

    accounting = Accounting()
    plain = SharedInflight(accounting, lambda: client, SharedInflightSettings(
        enabled=True, key=KEY, interval_s=0.05, ttl_s=2.0, spread_ties=False), replica="plain")
    other_acc, other = replica(client, "other")
    assert await other.exchange() and await plain.exchange() and await other.exchange()
    assert accounting.replica_slot is None and other_acc.replica_slot == (0, 2)  # "other" < "plain"
    await plain.stop()
    await other.stop()

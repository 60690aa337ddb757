"""One Redis hash that proxy replicas share: each writes its own field and reads the others', in one round trip.

Used for in-flight counts (``shared_inflight.py``) and for the local-or-remote decision's measurements
(``kv/shared_estimates.py``), each under its own key. Per exchange (a Lua script on one hash key, so a Redis Cluster
serves it too) a replica:

- writes its payload under its replica id, stamped with Redis's clock (no replica's clock matters);
- reads the other replicas' fields, dropping (and deleting) those older than ``ttl_s``: a replica that died stops
  counting within ``ttl_s``.

What a payload says is the caller's to check: another replica's entry is never trusted. ``ExchangeLoop`` is the
background side both users share: the interval, the failure warnings, forgetting the others when Redis has been gone
for ``ttl_s``, logging each bad entry once, and leaving on stop.

A loop with a ``wake_channel`` also tells the others when it has news they should not wait a tick for: the same
script publishes the replica's id on that channel, and every other replica, subscribed, exchanges at once (at most
once between two of its ticks). A wake-up carries nothing but "exchange now": what was published is read from the
hash and checked as always, so a stray or hostile message costs at most one round trip per interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from ..tasks import cancel, raise_if_cancelled

_EXCHANGE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[3])
redis.call('HSET', KEYS[1], ARGV[1], string.format('%d', now) .. ' ' .. ARGV[2])
redis.call('PEXPIRE', KEYS[1], ttl * 4)
if ARGV[4] ~= '' then
  redis.pcall('PUBLISH', ARGV[4], ARGV[1])
end
local out = {}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local field, value = all[i], all[i + 1]
  if field ~= ARGV[1] then
    local stamp, payload = string.match(value, '^(%d+) (.*)$')
    if stamp == nil or now - tonumber(stamp) > ttl then
      redis.call('HDEL', KEYS[1], field)
    else
      out[#out + 1] = field
      out[#out + 1] = payload
    end
  end
end
return out
"""
"""KEYS[1]: the hash; ARGV: this replica's id, its payload, ``ttl_s`` in ms, and a channel to publish the id on (a
wake-up for the others) or ''; a publish refused (a Redis user without the right) is ignored: the exchange itself
must not fail on a wake-up. Returns the other live replicas' fields and payloads, flat."""

NO_REDIS = "no Redis: name one in router_settings (redis_host, redis_port) or shared_inflight.redis_url"


def replica_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def router_redis(router: Any) -> Callable[[], Any | None]:
    """The LiteLLM router's async Redis client, once it has one (LiteLLM may attach its Redis after the plugin
    starts: ``litellm_settings.cache``), then kept; None until then."""
    held: list[Any] = []

    def client() -> Any | None:
        if not held:
            cache = getattr(getattr(router, "cache", None), "redis_cache", None)
            if cache is None:
                return None
            held.append(cache.init_async_client())
        return held[0]

    return client


def text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class RedisExchange:
    """One replica's field in one hash (see the module's docstring)."""

    def __init__(self, client: Callable[[], Any | None], *, key: str, replica: str, ttl_s: float, timeout_s: float):
        self.client = client
        """Returns the Redis client, or None while there is none yet (LiteLLM may attach its Redis later)."""
        self.key = key
        self.replica = replica
        self.ttl_s = ttl_s
        self.timeout_s = timeout_s
        self._script: Any = None
        self._script_client: Any = None

    async def swap(self, payload: str, *, wake: str | None = None) -> list[tuple[str, str]]:
        """Publish ``payload``, return the other live replicas' ``(field, payload)``; raises when Redis cannot be
        used (no client yet, a connection error, a timeout). ``wake``: a channel on which to wake the others."""
        client = self.client()
        if client is None:
            raise RuntimeError(NO_REDIS)
        if self._script is None or self._script_client is not client:
            self._script, self._script_client = client.register_script(_EXCHANGE), client
        async with asyncio.timeout(self.timeout_s):
            args = [self.replica, payload, int(self.ttl_s * 1000), wake or ""]
            flat = list(await self._script(keys=[self.key], args=args) or [])
        raise_if_cancelled()  # redis-py's own wait_for drops a stop that meets the reply (Python 3.11)
        return [(text(flat[i]), text(flat[i + 1])) for i in range(0, len(flat) - 1, 2)]

    async def leave(self) -> None:
        """Delete this replica's field (at once, rather than after ``ttl_s``); errors are ignored."""
        client = self.client()
        if client is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1.0):
                    await client.hdel(self.key, self.replica)


WARN_EVERY_S = 30.0
"""At most one "Redis exchange failed" warning in this long, per loop."""


class ExchangeLoop(ABC):
    """Every ``interval_s``: publish ``payload()``, hand the others' entries to ``take()``. Subclasses say what is
    published, what the others' entries mean, and what is dropped when they can no longer be read (``forget()``).

    ``nudge()`` asks for an exchange now rather than at the next tick (something the others should see at once
    happened): at most one such early exchange between two ticks, so a busy replica makes at most two round trips
    per interval and an idle one's first news goes out within a round trip. A replica whose last exchange found no
    other replica does not exchange early for its own news (one proxy with a Redis kept for LiteLLM's own use pays
    only its ticks); a replica that joins is seen at the next tick, and reads this one's news there. With a
    ``wake_channel`` the exchange that carries this replica's own news also wakes the others (see the module's
    docstring), who then nudge themselves (without waking anyone in turn)."""

    what = "exchange"
    """How logs and the task name call it."""
    fallback = "this replica goes on alone"
    """What a failed exchange means, for its warning."""
    wake_channel: str | None = None
    """The channel on which replicas wake each other (None: the others read this replica's news at their tick)."""

    def __init__(self, hash_: RedisExchange, *, interval_s: float, logger: logging.Logger,
                 clock: Callable[[], float] = time.monotonic):
        self._hash = hash_
        self.interval_s = interval_s
        self._logger = logger
        self._clock = clock
        self._last_ok: float | None = None
        self._warned_at: float | None = None
        self._distrusted: set[str] = set()
        """Fields skipped in the last exchange (each logged once while it stays bad)."""
        self._task: asyncio.Task[None] | None = None
        self._nudged = asyncio.Event()
        self._announce = False
        """This replica's own news since its last exchange: the next exchange wakes the others."""
        self.early_exchanges = 0
        """Exchanges made on a ``nudge()`` rather than on the tick."""
        self.wakeups = 0
        """Wake-ups received from the other replicas."""
        self._listener: asyncio.Task[None] | None = None
        self.peers: int | None = None
        """Other replicas' entries in the last good exchange (None: none yet). While it is 0, this replica's own news
        waits for its tick: nobody would read an early exchange, nor hear its wake-up."""

    @property
    def replica(self) -> str:
        return self._hash.replica

    @abstractmethod
    def payload(self) -> str:
        """What this replica publishes now."""

    @abstractmethod
    def take(self, entries: list[tuple[str, str]]) -> list[str]:
        """Use the other live replicas' entries; return the fields skipped as not what a replica publishes."""

    @abstractmethod
    def forget(self) -> None:
        """Drop what the others said (Redis unreadable for ``ttl_s``, or this replica stopping)."""

    def failed(self) -> None:
        """One exchange failed (for metrics); nothing by default."""
        return None

    def start(self) -> None:
        if self._task is None:
            name = f"litellm-disagg-{self.what.replace(' ', '-')}"
            self._task = asyncio.create_task(self._run(), name=name)
            if self.wake_channel is not None:
                self._listener = asyncio.create_task(self._listen(self.wake_channel), name=f"{name}-wake-ups")

    async def stop(self) -> None:
        task, self._task = self._task, None
        listener, self._listener = self._listener, None
        await cancel([task, listener])
        await self._hash.leave()
        self.forget()

    def nudge(self, *, announce: bool = True) -> None:
        """Exchange now, not at the next tick (once per interval; nothing when the loop is not running).
        ``announce``: this replica's own news, so the exchange that carries it wakes the others too."""
        if self._task is None or (announce and self.peers == 0):  # alone: a newcomer reads it at the next tick
            return
        if announce:
            self._announce = True
        self._nudged.set()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._nudged.clear()  # the tick's exchange publishes whatever a nudge before it was about
            await self.exchange()
            tick = loop.time() + self.interval_s
            nudged = False
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(tick):
                    nudged = await self._nudged.wait()
            if nudged:
                self.early_exchanges += 1
                await self.exchange()
            rest = tick - loop.time()
            if rest > 0:  # an early exchange made, the rest of the interval is not nudged again
                await asyncio.sleep(rest)

    async def exchange(self) -> bool:
        """One round trip. False when Redis could not be used."""
        now = self._clock()
        wake = self.wake_channel if self._announce else None
        self._announce = False
        try:
            entries = await self._hash.swap(self.payload(), wake=wake)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if self._warned_at is None or now - self._warned_at >= WARN_EVERY_S:
                self._warned_at = now
                self._logger.warning("%s: Redis exchange failed (%s); %s", self.what, exc, self.fallback)
            self.failed()
            if self._last_ok is None or now - self._last_ok >= self._hash.ttl_s:
                self.forget()
            return False
        self.peers = len(entries)
        bad = self.take(entries)
        for field in bad:
            if field not in self._distrusted:
                self._logger.warning("%s: replica %r's entry is not what a replica publishes; skipped", self.what, field)
        self._distrusted = set(bad)  # only the fields present now: a writer rotating names cannot grow it
        self._last_ok = now
        return True

    async def _listen(self, channel: str) -> None:
        """The other replicas' wake-ups, for as long as the loop runs: each one from another replica nudges this
        one (at most one early exchange per interval, however many arrive). Without a client that subscribes (none
        yet, or a cluster client without pub/sub) or after a failure, it tries again a second later; meanwhile the
        ticks carry everything, as without wake-ups."""
        said_why = False
        while True:
            client = self._hash.client()
            subscribe = getattr(client, "pubsub", None)
            if subscribe is None:
                if client is not None and not said_why:
                    said_why = True
                    self._logger.info("%s: this Redis client has no pub/sub; the others' news waits for the tick",
                                      self.what)
                await asyncio.sleep(1.0)
                continue
            pubsub = subscribe()
            try:
                await pubsub.subscribe(channel)
                async for message in pubsub.listen():
                    raise_if_cancelled()
                    if isinstance(message, dict) and message.get("type") == "message":
                        if text(message.get("data")) != self.replica:
                            self.wakeups += 1
                            self.nudge(announce=False)
            except asyncio.CancelledError:
                await _close(pubsub)
                raise
            except Exception as exc:
                if not said_why:
                    said_why = True
                    self._logger.info("%s: wake-ups unavailable (%s); retrying each second", self.what, exc)
            await _close(pubsub)  # not in a ``finally``: a coroutine closed with its loop must not await
            await asyncio.sleep(1.0)


async def _close(pubsub: Any) -> None:
    with contextlib.suppress(Exception):
        async with asyncio.timeout(1.0):
            await pubsub.aclose()

"""One Redis hash that proxy replicas share: each writes its own field and reads the others', in one round trip.

Used for in-flight counts (``shared_inflight.py``) and for the local-or-remote decision's measurements
(``kv/shared_estimates.py``), each under its own key. Per exchange (a Lua script on one hash key, so a Redis Cluster
serves it too) a replica:

- writes its payload under its replica id, stamped with Redis's clock (no replica's clock matters);
- reads the other replicas' fields, dropping (and deleting) those older than ``ttl_s``: a replica that died stops
  counting within ``ttl_s``.

What a payload says is the caller's to check: another replica's entry is never trusted.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import uuid
from collections.abc import Callable
from typing import Any

from ..tasks import raise_if_cancelled

_EXCHANGE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[3])
redis.call('HSET', KEYS[1], ARGV[1], string.format('%d', now) .. ' ' .. ARGV[2])
redis.call('PEXPIRE', KEYS[1], ttl * 4)
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
"""KEYS[1]: the hash; ARGV: this replica's id, its payload, ``ttl_s`` in ms. Returns the other live replicas'
fields and payloads, flat."""

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
        self._client = client
        """Returns the Redis client, or None while there is none yet (LiteLLM may attach its Redis later)."""
        self.key = key
        self.replica = replica
        self.ttl_s = ttl_s
        self.timeout_s = timeout_s
        self._script: Any = None
        self._script_client: Any = None

    async def swap(self, payload: str) -> list[tuple[str, str]]:
        """Publish ``payload``, return the other live replicas' ``(field, payload)``; raises when Redis cannot be
        used (no client yet, a connection error, a timeout)."""
        client = self._client()
        if client is None:
            raise RuntimeError(NO_REDIS)
        if self._script is None or self._script_client is not client:
            self._script, self._script_client = client.register_script(_EXCHANGE), client
        async with asyncio.timeout(self.timeout_s):
            flat = list(await self._script(keys=[self.key], args=[self.replica, payload, int(self.ttl_s * 1000)]) or [])
        raise_if_cancelled()  # redis-py's own wait_for drops a stop that meets the reply (Python 3.11)
        return [(text(flat[i]), text(flat[i + 1])) for i in range(0, len(flat) - 1, 2)]

    async def leave(self) -> None:
        """Delete this replica's field (at once, rather than after ``ttl_s``); errors are ignored."""
        client = self._client()
        if client is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1.0):
                    await client.hdel(self.key, self.replica)

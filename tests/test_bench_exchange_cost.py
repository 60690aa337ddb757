"""``bench.exchange_cost``: the in-flight exchange's cost, timed against a real ``redis-server``."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import redis.asyncio as aioredis

from bench import exchange_cost
from litellm_disagg.routing.shared_inflight import SharedInflightSettings

from .support.redis_server import redis_server


def test_one_exchange_is_timed_with_every_replica_in_the_hash(tmp_path: Path) -> None:
    with redis_server(tmp_path / "redis") as port:
        cost = asyncio.run(exchange_cost.measure(port, replicas=3, workers=2, exchanges=5))

        async def fields() -> list[bytes]:
            client = aioredis.Redis(host="127.0.0.1", port=port)
            try:
                return sorted(await client.hkeys(SharedInflightSettings().key))
            finally:
                await client.aclose()

        assert asyncio.run(fields()) == [b"replica-0", b"replica-1", b"replica-2"]
    assert math.isfinite(cost.cpu_s) and cost.cpu_s >= 0
    assert math.isfinite(cost.wall_s) and cost.wall_s > 0

"""A real ``redis-server`` for tests (``bench/serving/redis_server.py`` starts it). Without ``redis-server`` on the
PATH the tests that use it are skipped on a developer machine and fail under CI (``CI`` set)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from bench.serving import redis_server as server


@contextmanager
def redis_server(directory: Path) -> Iterator[int]:
    if server.binary() is None:
        message = "redis-server is not installed: run scripts/setup.sh as root (it installs Debian's package)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    with server.redis_server(directory) as port:
        yield port


def redis_fixtures(key: str) -> tuple[Any, Any]:
    """``redis_port`` (one server per test module) and ``client`` (a client on it, ``key`` deleted first), to assign
    at a test module's top level: ``redis_port, client = redis_fixtures(KEY)``."""

    @pytest.fixture(scope="module")
    def redis_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
        with redis_server(tmp_path_factory.mktemp("redis")) as port:
            yield port

    @pytest.fixture
    async def client(redis_port: int) -> AsyncIterator[aioredis.Redis]:
        c = aioredis.Redis(host="127.0.0.1", port=redis_port)
        await c.delete(key)
        yield c
        await c.aclose()

    return redis_port, client

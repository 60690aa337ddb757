"""A real ``redis-server`` for tests (``bench/serving/redis_server.py`` starts it). Without ``redis-server`` on the
PATH the tests that use it are skipped on a developer machine and fail under CI (``CI`` set)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

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

"""A ``redis-server`` (Debian's package; ``scripts/setup.sh`` installs it) on a free port, nothing persisted: the
Redis that proxy replicas share (LiteLLM's ``router_settings.redis_host``/``redis_port``), for the benchmarks and the
tests. Stopped by PID."""

from __future__ import annotations

import shutil
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from litellm_disagg.ports import free_port
from litellm_disagg.processes import spawn, stop, wait_until


def binary() -> str | None:
    return shutil.which("redis-server")


def answers_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@contextmanager
def redis_server(directory: Path) -> Iterator[int]:
    """A fresh server on 127.0.0.1; yields its port."""
    found = binary()
    if found is None:
        raise RuntimeError("redis-server is not installed: run scripts/setup.sh as root (it installs Debian's package)")
    port = free_port()
    directory.mkdir(parents=True, exist_ok=True)
    proc = spawn([found, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                  "--dir", str(directory)], log=directory / "redis.log")
    try:
        wait_until(lambda: answers_ping(port), timeout_s=30, interval_s=0.05, alive=lambda: proc.poll() is None,
                   what="redis-server answering PING")
        yield port
    finally:
        stop(proc, timeout_s=10)

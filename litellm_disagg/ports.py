"""Free TCP ports for the servers this project starts: workers, their NIXL side channels, KV-event publishers, and
the servers tests and benchmarks start.

A port from ``bind((host, 0))`` comes from the kernel's ephemeral range, the same range outgoing connections take
their source ports from. Between picking such a port and the engine binding it (vLLM binds its NIXL side channel
seconds into its start) any outgoing connection on the machine may take it as its source port; vLLM's handshake
listener then fails in a thread ("Address already in use") while the engine waits for it without end. So ports are
drawn at random *below* the ephemeral range, where the kernel never hands out a source port by itself, checked free
by binding them (without ``SO_REUSEADDR``, so a port in TIME_WAIT counts as taken), and never handed out twice by one
process. Where the ephemeral range leaves too little room below it, the kernel picks (``bind(0)``), as before.

A port chosen but not yet bound is free to every other process's draw. So a process that starts others hands them the
ports it has chosen (``avoid_env``: ``LITELLM_DISAGG_AVOID_PORTS``), and a port given on a command line is
``reserve``-d before anything is drawn: ``up`` once drew its decode worker's KV-event port equal to the proxy port a
test had chosen, and the decode worker failed to bind it on every restart (a fresh-clone CI run).
"""

from __future__ import annotations

import os
import random
import socket
import threading
from collections.abc import Iterable
from pathlib import Path

_LOWEST = 20000
"""The draw starts here: clear of the well-known and registered ports most services listen on."""
_MIN_ROOM = 2000
_ATTEMPTS = 200
_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
ENV_AVOID = "LITELLM_DISAGG_AVOID_PORTS"
"""Ports a parent process has chosen for its children (comma-separated): never drawn here."""

_given: set[int] = set()
_lock = threading.Lock()
_rng = random.SystemRandom()


def ephemeral_range(path: Path = _RANGE_FILE) -> tuple[int, int] | None:
    """The kernel's ephemeral (source) port range, or None where it cannot be read (not Linux)."""
    try:
        low, high = (int(part) for part in path.read_text().split()[:2])
    except (OSError, ValueError):
        return None
    return (low, high) if 0 < low <= high <= 65535 else None


def draw_range(ephemeral: tuple[int, int] | None) -> tuple[int, int] | None:
    """Ports to draw from, ``(first, last)`` inclusive: below the ephemeral range; None: let the kernel pick."""
    if ephemeral is None:
        return None
    first, last = _LOWEST, ephemeral[0] - 1
    return (first, last) if last - first + 1 >= _MIN_ROOM else None


def _bindable(host: str, port: int) -> bool:
    hosts = [host] if host in ("", "0.0.0.0") else [host, "0.0.0.0"]
    for h in hosts:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((h, port))
            except OSError:
                return False
    return True


def _kernel_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def reserve(*ports: int) -> None:
    """Never hand these out (ports given on a command line, which their servers have not bound yet)."""
    with _lock:
        _given.update(ports)


def _avoided() -> set[int]:
    out: set[int] = set()
    for part in os.environ.get(ENV_AVOID, "").split(","):
        if part.strip().isdigit():
            out.add(int(part))
    return out


def avoid_env(env: dict[str, str], ports: Iterable[int]) -> dict[str, str]:
    """``env`` for a child process that must not draw ``ports`` (added to those this process avoids)."""
    taken = _avoided() | set(ports)
    return {**env, ENV_AVOID: ",".join(str(p) for p in sorted(taken))}


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now, unlikely to be taken before its server binds it (module docstring)."""
    span = draw_range(ephemeral_range())
    with _lock:
        taken = _given | _avoided()
        if span is not None:
            for _ in range(_ATTEMPTS):
                port = _rng.randint(*span)
                if port not in taken and _bindable(host, port):
                    _given.add(port)
                    return port
        for _ in range(_ATTEMPTS):
            port = _kernel_port(host)
            if port not in taken:
                break
        _given.add(port)
        return port

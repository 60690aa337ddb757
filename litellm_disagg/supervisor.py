"""Supervisor: keep a set of child processes running; restart one that dies, with backoff.

``litellm-disagg up`` runs its workers and the proxy under it, so a worker that dies (a crash, ``kill -9``, the OOM
killer) is started again while the others keep serving (the proxy serves aggregated while the prefill worker is
gone), and only Ctrl-C / SIGTERM stops the stack. A worker that exits 0 drained on purpose (``litellm-disagg drain``)
and stays stopped (``ChildSpec.restart_after_clean_exit``).

Backoff: the first restart of a child waits ``initial_backoff_s``, each further consecutive one twice as long, at most
``max_backoff_s``; a child that stayed up for ``stable_after_s`` starts again from the initial delay. Every death and
restart is reported (``on_event``). No threads: the owner calls ``check()`` in its loop.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from litellm_disagg.processes import spawn as spawn_process
from litellm_disagg.processes import stop as stop_process


@dataclass(frozen=True)
class ChildSpec:
    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    log: Path
    stop_timeout_s: float = 60.0
    restart_after_clean_exit: bool = True
    """False: a child that exits 0 stopped on purpose and stays stopped (a worker that drained on request: ``litellm-disagg
    drain``, or SIGTERM sent to it alone), as systemd's ``Restart=on-failure``."""


@dataclass
class _Child:
    spec: ChildSpec
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    restarts: int = 0
    consecutive_failures: int = 0
    restart_at: float | None = None


Spawn = Callable[[ChildSpec], "subprocess.Popen[bytes]"]


def _spawn(spec: ChildSpec) -> subprocess.Popen[bytes]:
    return spawn_process(list(spec.argv), env=dict(spec.env), log=spec.log)


class Supervisor:
    def __init__(
        self,
        specs: Iterable[ChildSpec],
        *,
        spawn: Spawn = _spawn,
        clock: Callable[[], float] = time.monotonic,
        initial_backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
        stable_after_s: float = 60.0,
        on_event: Callable[[str], None] = lambda message: None,
    ):
        self._children = {spec.name: _Child(spec) for spec in specs}
        self._spawn = spawn
        self._clock = clock
        self.initial_backoff_s = initial_backoff_s
        self.max_backoff_s = max_backoff_s
        self.stable_after_s = stable_after_s
        self._on_event = on_event

    def start(self) -> None:
        for child in self._children.values():
            self._start(child)

    def check(self) -> None:
        """Notice dead children and restart those whose backoff has passed. Call it every second or so."""
        now = self._clock()
        for child in self._children.values():
            proc = child.proc
            if proc is not None and proc.poll() is not None:
                ran_s = now - child.started_at
                child.proc = None
                if proc.returncode == 0 and not child.spec.restart_after_clean_exit:
                    child.restart_at = None
                    self._on_event(f"{child.spec.name} exited cleanly after {ran_s:.0f} s (drained); not restarted")
                    continue
                child.consecutive_failures = 1 if ran_s >= self.stable_after_s else child.consecutive_failures + 1
                delay = min(self.max_backoff_s, self.initial_backoff_s * 2 ** (child.consecutive_failures - 1))
                child.restart_at = now + delay
                self._on_event(
                    f"{child.spec.name} exited with code {proc.returncode} after {ran_s:.0f} s; "
                    f"restarting in {delay:.0f} s (log: {child.spec.log})"
                )
            if child.proc is None and child.restart_at is not None and now >= child.restart_at:
                child.restarts += 1
                self._start(child)
                self._on_event(f"{child.spec.name} restarted (restart {child.restarts})")

    def alive(self, name: str) -> bool:
        proc = self._children[name].proc
        return proc is not None and proc.poll() is None

    def all_alive(self) -> bool:
        return all(self.alive(name) for name in self._children)

    def restarts(self, name: str) -> int:
        return self._children[name].restarts

    def stop(self, order: Iterable[str] | None = None) -> None:
        """Stop every child (``order`` first, the rest after), each within its spec's timeout; no restarts after."""
        names = list(order or ()) + [n for n in self._children if n not in set(order or ())]
        for name in names:
            child = self._children[name]
            child.restart_at = None
            if child.proc is not None:
                stop_process(child.proc, timeout_s=child.spec.stop_timeout_s)
                child.proc = None

    def _start(self, child: _Child) -> None:
        child.proc = self._spawn(child.spec)
        child.started_at = self._clock()
        child.restart_at = None

"""Start and stop child processes as process groups (the stack command and test fixtures use this)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO


def interrupt_on_sigterm() -> None:
    """Make SIGTERM raise ``KeyboardInterrupt`` in the main thread, as Ctrl-C does, so a benchmark or harness that is
    killed runs its ``finally`` blocks and stops the process groups it spawned (``spawn`` starts each in its own
    session, so they outlive a parent that dies on the default SIGTERM)."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)


def spawn(argv: list[str], *, env: dict[str, str] | None = None, log: Path | None = None, cwd: str | None = None) -> subprocess.Popen[bytes]:
    out: IO[bytes] | int = open(log, "ab") if log is not None else subprocess.DEVNULL  # noqa: SIM115 (kept by the child)
    try:
        return subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=cwd, start_new_session=True)
    finally:
        if not isinstance(out, int):
            out.close()


def stop(proc: subprocess.Popen[bytes], *, timeout_s: float = 60.0, sig: int = signal.SIGTERM) -> int | None:
    """Signal the process group, wait, then kill it if it has not exited."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    # Anything left in the group (e.g. vLLM's engine core after its parent died).
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode


def kill_tree(pid: int) -> None:
    """SIGKILL a process and all its descendants (a crash, as tests simulate it)."""
    import psutil

    try:
        root = psutil.Process(pid)
        family = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for proc in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(family, timeout=10)


def wait_until(check: Callable[[], bool], *, timeout_s: float, interval_s: float = 0.5, alive: Callable[[], bool] = lambda: True, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        if not alive():
            raise RuntimeError(f"a process exited while waiting for {what}")
        time.sleep(interval_s)
    raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")

"""``litellm_disagg.processes``: a harness killed with SIGTERM still stops what it spawned (``interrupt_on_sigterm``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from litellm_disagg.processes import wait_until

HARNESS = textwrap.dedent("""
    import asyncio, sys, time
    from litellm_disagg.processes import interrupt_on_sigterm, spawn, stop

    async def main():
        child = spawn([sys.executable, "-c", "import time; time.sleep(600)"])
        try:
            print(child.pid, flush=True)
            await asyncio.sleep(600)
        finally:
            stop(child, timeout_s=10)
            print("stopped", flush=True)

    if sys.argv[1] == "on":
        interrupt_on_sigterm()
    asyncio.run(main())
""")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _run_and_terminate(mode: str) -> tuple[int, str]:
    """Start the harness, SIGTERM it once its child runs; the child's pid and what the harness printed after."""
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.Popen([sys.executable, "-c", HARNESS, mode], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, cwd=root)
    assert proc.stdout is not None
    child = int(proc.stdout.readline())
    proc.send_signal(signal.SIGTERM)
    rest = proc.stdout.read()
    proc.wait(timeout=60)
    return child, rest


def test_a_harness_killed_with_sigterm_stops_its_children():
    child, printed = _run_and_terminate("on")
    assert "stopped" in printed
    wait_until(lambda: not _alive(child), timeout_s=10, interval_s=0.05, what="the child to be gone")


def test_without_it_the_child_outlives_the_killed_harness():
    """What ``interrupt_on_sigterm`` is for: ``spawn`` gives each child its own session, and Python's default SIGTERM
    ends the harness without its ``finally``."""
    child, printed = _run_and_terminate("off")
    try:
        assert "stopped" not in printed and _alive(child)
    finally:
        os.killpg(child, signal.SIGKILL)

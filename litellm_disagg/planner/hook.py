"""The desired-pool-sizes hook: a command run when the planner's wanted pool sizes change, for an external
autoscaler (a script that patches a Kubernetes Deployment's replicas, pushes to KEDA, pages someone).

Run as an argv list, never through a shell: ``planner.hook_command`` + ``MODEL PREFILL DECODE BOTH``, with the same
in the environment (``LITELLM_DISAGG_DESIRED_MODEL``, ``..._PREFILL``, ``..._DECODE``, ``..._BOTH``, ``..._TOTAL``)
and, when the pools shrink, ``LITELLM_DISAGG_DRAIN_WORKER`` (the worker to remove: drain it first, see
docs/planner.md). The model name comes from discovery: the hook must treat it as data (it is one argv element, so
nothing in it can reach a shell unless the hook itself puts it there). The command is killed after
``hook_timeout_s``; its exit status and the tail of its output are logged, never raised: a failing hook must not
stop the planner.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass

from litellm_disagg.discovery.drain_command import DRAIN_WORKER_ENV
from litellm_disagg.planner.policy import DesiredPools

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class HookCall:
    desired: DesiredPools
    drain: str | None = None

    def argv(self, command: Sequence[str]) -> list[str]:
        d = self.desired
        return [*command, d.model, str(d.prefill), str(d.decode), str(d.both)]

    def environ(self) -> dict[str, str]:
        d = self.desired
        env = {
            "LITELLM_DISAGG_DESIRED_MODEL": d.model,
            "LITELLM_DISAGG_DESIRED_PREFILL": str(d.prefill),
            "LITELLM_DISAGG_DESIRED_DECODE": str(d.decode),
            "LITELLM_DISAGG_DESIRED_BOTH": str(d.both),
            "LITELLM_DISAGG_DESIRED_TOTAL": str(d.total),
        }
        if self.drain is not None:
            env[DRAIN_WORKER_ENV] = self.drain
        return env


class DesiredHook:
    """Runs the hook command for each change of a model's desired sizes (one at a time, in order)."""

    def __init__(self, command: Sequence[str], *, timeout_s: float = 30.0):
        self.command = tuple(command)
        self.timeout_s = timeout_s
        self._last: dict[str, HookCall] = {}
        self._one_at_a_time = asyncio.Lock()
        self._background: set[asyncio.Task[int | None]] = set()

    def changed(self, call: HookCall) -> bool:
        return self._last.get(call.desired.model) != call

    def submit(self, call: HookCall) -> None:
        """``run`` in the background (the planner's step does not wait for the hook); runs keep their order."""
        if not self.changed(call):
            return
        self._last[call.desired.model] = call
        task = asyncio.create_task(self._run_in_turn(call), name="litellm-disagg-planner-hook")
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def aclose(self) -> None:
        """Wait for the runs already submitted (each is bounded by ``timeout_s``)."""
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)

    async def run(self, call: HookCall) -> int | None:
        """Run the hook for ``call`` if it differs from the last call for that model; the exit status (None: not
        run, or it did not finish in time)."""
        if not self.changed(call):
            return None
        self._last[call.desired.model] = call
        return await self._run_in_turn(call)

    async def _run_in_turn(self, call: HookCall) -> int | None:
        async with self._one_at_a_time:
            return await self._exec(call)

    async def _exec(self, call: HookCall) -> int | None:
        argv = call.argv(self.command)
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, env={**os.environ, **call.environ()}, stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        except OSError as exc:
            logger.error("planner hook %s could not start: %s", self.command[0], exc)
            return None
        try:
            async with asyncio.timeout(self.timeout_s):
                out, _ = await proc.communicate()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            logger.error("planner hook %s killed after %.0f s", self.command[0], self.timeout_s)
            return None
        tail = out.decode(errors="replace").strip()[-500:]
        if proc.returncode:
            logger.error("planner hook %s exited %s: %s", self.command[0], proc.returncode, tail)
        else:
            logger.info("planner hook %s ran for %s: %s", self.command[0], call.desired, tail)
        return proc.returncode

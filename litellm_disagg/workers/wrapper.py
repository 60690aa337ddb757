"""The worker wrapper: run one vLLM engine as a discoverable, drainable litellm-disagg worker.

Lifecycle (the discovery side, publish, heartbeat, drain and withdraw, is ``workers.lifecycle``, shared with the
simulated worker)::

    start vLLM ──> /health ok ──> probe engine ──> publish READY ──> heartbeat ...
        │                                                        │
        └─ vLLM exits: withdraw, print its last log lines, exit non-zero
                                                                 └─ SIGTERM/SIGINT or a drain request
                                                                    (litellm-disagg drain): publish DRAINING (routers send
                                                                    nothing new), wait until the engine is idle and
                                                                    settled (or the drain timeout), withdraw, stop vLLM
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
import functools
import logging
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import httpx

from litellm_disagg.discovery.registry import Registry
from litellm_disagg.discovery.roles import AfterDrain
from litellm_disagg.engines.base import Engine, EngineLaunch, LaunchSpec
from litellm_disagg.ports import free_port  # noqa: F401 - re-exported: older imports take it from here
from litellm_disagg.runtime_config import RuntimeConfig, WorkerRole, WorkerState
from litellm_disagg.workers import engine_probe
from litellm_disagg.workers.bind_failure import BindFailure
from litellm_disagg.workers.bind_failure import parse as parse_bind_failure
from litellm_disagg.workers.lifecycle import DrainPolicy, EngineActivity, WorkerLifecycle
from litellm_disagg.workers.log_sink import LogSink

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LifecycleOptions:
    worker_id: str
    heartbeat_interval_s: float = 2.0
    ready_timeout_s: float = 600.0
    drain_timeout_s: float = 120.0
    drain_settle_s: float = 3.0
    """How long the engine must stay idle (nothing running, waiting or finishing) before a drained worker leaves.
    Covers requests routed just before routers saw the drain, and prefills whose KV a decode has yet to pull."""
    stop_timeout_s: float = 30.0
    log_tail_lines: int = 40
    role: WorkerRole | None = None
    """The role published at start; default: the launch's (``LaunchSpec.role``). A ``--switchable`` worker is
    launched ``both`` and published in the role the operator chose."""
    allowed_roles: tuple[WorkerRole, ...] = ()
    """Roles the launch can serve, published so planners and ``litellm-disagg role`` may move the worker."""
    unresponsive_restart_s: float = 180.0
    """After the engine's HTTP server says it is up (``SERVING_LINE``), how long ``/health`` may go unanswered before
    the engine is taken for hung, stopped and started again. Seen on 2 shared cores: a vLLM that logged its start
    and then answered nothing, not even ``/health``, until the ready timeout."""
    start_attempts: int = 2
    """Engine starts per run when a start hangs that way (each with its own ``ready_timeout_s``)."""

    def drain_policy(self) -> DrainPolicy:
        return DrainPolicy(timeout_s=self.drain_timeout_s, settle_s=self.drain_settle_s)


SERVING_LINE = "Application startup complete"
"""uvicorn's line once the server serves (vLLM, SGLang and TRT-LLM's servers all run on uvicorn). Before it, a
``/health`` that times out is normal: vLLM binds its port early, then loads the model for minutes."""


class _Start(enum.Enum):
    """How waiting for the engine to become ready ended."""

    READY = "ready"
    EXITED = "exited"
    BIND_FAILED = "bind failed"
    HUNG = "hung"
    TIMED_OUT = "timed out"
    STOPPED = "stopped"


def _die_with_parent() -> None:
    """In the vLLM child: get SIGTERM if the wrapper dies (even by SIGKILL), so no engine is left unregistered."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def default_worker_id(role: WorkerRole, port: int) -> str:
    host = socket.gethostname().split(".")[0] or "host"
    return f"{role.value}-{host}-{port}"


class WorkerWrapper:
    def __init__(
        self,
        spec: LaunchSpec,
        lifecycle: LifecycleOptions,
        registry: Registry,
        *,
        engine: Engine,
        log: TextIO = sys.stderr,
        command: list[str] | None = None,
    ):
        """``engine`` runs ``spec`` (its adapter gives the command line and the metric names); ``command`` replaces
        the engine's command line (tests run a fake engine with the same HTTP surface)."""
        self.spec = spec
        self.engine = engine
        self.launch: EngineLaunch = engine.adapter.launch(spec)
        self.command = command
        self.lifecycle = lifecycle
        self.registry = registry
        self.log = log
        self._sink: LogSink | None = None
        """Writes ``log`` from a thread while ``run`` runs (``log_sink.py``): a slow log never holds the heartbeats."""
        self.server_url = f"http://{spec.host}:{spec.port}"
        self._tail: collections.deque[str] = collections.deque(maxlen=lifecycle.log_tail_lines)
        self._stop = asyncio.Event()
        """Drain and leave (SIGTERM, SIGINT, a drain request)."""
        self._terminate = asyncio.Event()
        """Exit once out of discovery (SIGTERM, SIGINT, a drain request that does not park)."""
        self._proc: asyncio.subprocess.Process | None = None
        self._pump: asyncio.Task[None] | None = None
        self._serving_since: float | None = None
        """When the engine's log said its HTTP server is up (``SERVING_LINE``), for the current start."""
        self.config: RuntimeConfig | None = None
        self.registration: WorkerLifecycle | None = None
        """The worker in discovery, from the moment it is published READY."""
        self.bind_failure: BindFailure | None = None
        """Set when the engine said, while starting, that it could not bind a port (``workers.bind_failure``)."""

    def request_stop(self) -> None:
        """Drain, leave discovery, stop the engine and exit (SIGTERM, SIGINT)."""
        self._stop.set()
        self._terminate.set()

    def _drain_requested(self, then: AfterDrain) -> None:
        """A drain request through discovery: as SIGTERM, or (``park``) the same drain, then the engine stopped and
        the process waiting for SIGTERM."""
        if then is AfterDrain.PARK:
            self._stop.set()
        else:
            self.request_stop()

    async def run(self) -> int:
        """Run until vLLM dies (non-zero) or a stop is requested and the drain completes (zero); after a drain
        request with ``park``, until SIGTERM once parked (zero)."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self.request_stop)
        for path, text in self.launch.files.items():
            await asyncio.to_thread(Path(path).write_text, text)
        self._sink = LogSink(self.log)
        try:
            await self._spawn()
            async with httpx.AsyncClient() as client:
                return await self._serve(client)
        finally:
            if self.registration is not None:
                await self.registration.leave()  # already done on the normal ways out; here for the others
            await self._stop_vllm()
            await self._end_pump()
            await self.registry.close()
            sink, self._sink = self._sink, None
            await asyncio.to_thread(sink.close)

    def _say(self, line: str) -> None:
        """One line of the worker's output (``log``), never blocking the event loop while ``run`` runs."""
        if self._sink is not None:
            self._sink.line(line)
        else:
            print(line, file=self.log, flush=True)

    async def _spawn(self) -> None:
        argv = self.command or list(self.launch.argv)
        logger.info("starting %s (launched %s, published %s): %s", self.engine.name, self.spec.role.value,
                    (self.lifecycle.role or self.spec.role).value, " ".join(argv))
        self._serving_since = None
        self._proc = await asyncio.create_subprocess_exec(
            *argv,
            env=dict(self.launch.env),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        self._pump = asyncio.create_task(self._pump_logs(self._proc))

    async def _end_pump(self) -> None:
        if self._pump is not None:
            self._pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pump
            self._pump = None

    async def _serve(self, client: httpx.AsyncClient) -> int:
        start = await self._wait_ready(client)
        if start is _Start.STOPPED:
            return 0
        if start is _Start.BIND_FAILED:
            assert self.bind_failure is not None
            port = f"port {self.bind_failure.port}" if self.bind_failure.port is not None else "a port"
            return self._died(f"vLLM could not bind {port} while starting ({self.bind_failure.line}); it would "
                              "never become ready. Another process took the port: choose another (--port, "
                              "--nixl-port, --kv-events-port)")
        if start is _Start.EXITED:
            return self._died("vLLM exited before it became ready")
        if start is _Start.HUNG:
            return self._died(f"vLLM said its server started, then did not answer /health for "
                              f"{self.lifecycle.unresponsive_restart_s:g} s, in each of "
                              f"{self.lifecycle.start_attempts} starts")
        if start is _Start.TIMED_OUT:
            return self._died("vLLM did not become ready in time")
        facts = await engine_probe.engine_facts(client, self.server_url, self.engine.adapter.metrics)
        self.config = RuntimeConfig(
            worker_id=self.lifecycle.worker_id,
            model=self.spec.served_model_name,
            role=self.lifecycle.role or self.spec.role,
            allowed_roles=self.lifecycle.allowed_roles,
            engine=self.engine.name,
            base_url=f"{self.server_url}/v1",
            transfer=self.launch.transfer,
            kv_capacity_blocks=facts.kv_capacity_blocks,
            block_size=facts.block_size,
            kv_events_endpoint=self.launch.kv_events_endpoint,
            tensor_parallel_size=self.spec.tensor_parallel_size,
            api_key_required=self.spec.api_key is not None,
            state=WorkerState.READY,
        )
        self.registration = WorkerLifecycle(
            self.registry,
            self.config,
            functools.partial(self._activity, client),
            heartbeat_interval_s=self.lifecycle.heartbeat_interval_s,
            drain=self.lifecycle.drain_policy(),
            on_drain_request=self._drain_requested,
        )
        await self.registration.announce()
        logger.info("worker %s ready at %s (%d KV blocks of %d tokens)", self.config.worker_id, self.config.base_url,
                    facts.kv_capacity_blocks, facts.block_size)
        self._say(f"READY {self.config.worker_id} {self.config.base_url}")
        if not await self._stop_requested_before_exit():
            await self.registration.leave()
            return self._died("vLLM exited")
        await self.registration.drain()
        await self.registration.leave()
        if not self._terminate.is_set():
            await self._park()
        return 0

    async def _park(self) -> None:
        """Out of discovery after a drain request with ``park``: stop the engine (its memory freed, its port closed,
        so a readiness probe fails) and wait for SIGTERM."""
        await self._stop_vllm()
        assert self.config is not None
        logger.info("worker %s parked: drained, out of discovery, %s stopped; exits on SIGTERM",
                    self.config.worker_id, self.engine.name)
        self._say(f"PARKED {self.config.worker_id}")
        await self._terminate.wait()

    async def _stop_requested_before_exit(self) -> bool:
        """Wait for a stop request (True) or for vLLM to exit (False), whichever comes first."""
        assert self._proc is not None
        stop = asyncio.create_task(self._stop.wait())
        exited = asyncio.create_task(self._proc.wait())
        try:
            await asyncio.wait({stop, exited}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (stop, exited):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        return self._stop.is_set()

    async def _activity(self, client: httpx.AsyncClient) -> EngineActivity | None:
        """The drain's probe: vLLM's request counters, or ``None`` once vLLM has exited or stopped answering."""
        if self._exited():
            return None
        try:
            load = await engine_probe.engine_load(client, self.server_url, self.engine.adapter.metrics)
        except engine_probe.ProbeError:
            return None
        return EngineActivity(idle=load.idle, finished=load.finished)

    async def _wait_ready(self, client: httpx.AsyncClient) -> _Start:
        """Wait for ``/health``; an engine that hangs after its server started is stopped and started again."""
        for attempt in range(1, max(1, self.lifecycle.start_attempts) + 1):
            start = await self._wait_ready_once(client)
            if start is not _Start.HUNG or attempt >= self.lifecycle.start_attempts:
                return start
            logger.warning("%s said its server started %g s ago and has answered no /health since; stopping it "
                           "and starting it again (start %d of %d)", self.engine.name,
                           self.lifecycle.unresponsive_restart_s, attempt + 1, self.lifecycle.start_attempts)
            self._say(f"litellm-disagg worker: {self.engine.name} hung after its server started (no answer to /health "
                      f"for {self.lifecycle.unresponsive_restart_s:g} s); starting it again")
            await self._stop_vllm()
            await self._end_pump()
            await self._spawn()
        return _Start.HUNG  # not reached: the loop returns on its last attempt

    async def _wait_ready_once(self, client: httpx.AsyncClient) -> _Start:
        deadline = time.monotonic() + self.lifecycle.ready_timeout_s
        while time.monotonic() < deadline:
            if self._stop.is_set():
                return _Start.STOPPED
            if self.bind_failure is not None:
                return _Start.BIND_FAILED
            if self._exited():
                return _Start.EXITED
            if await engine_probe.healthy(client, self.server_url):
                return _Start.READY
            serving_since = self._serving_since
            if serving_since is not None and time.monotonic() - serving_since > self.lifecycle.unresponsive_restart_s:
                return _Start.HUNG
            await asyncio.sleep(0.5)
        return _Start.STOPPED if self._stop.is_set() else _Start.TIMED_OUT

    def _exited(self) -> bool:
        return self._proc is not None and self._proc.returncode is not None

    def _died(self, why: str) -> int:
        code = self._proc.returncode if self._proc is not None else None
        self._say(f"litellm-disagg worker: {why} (exit code {code}). Last vLLM log lines:")
        for line in self._tail:
            self._say(f"  {line}")
        return code if isinstance(code, int) and code > 0 else 1

    async def _pump_logs(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        while True:
            raw = await proc.stdout.readline()
            if not raw:
                break
            line = raw.decode(errors="replace").rstrip()
            self._tail.append(line)
            self._say(line)
            if self.config is None:
                if self.bind_failure is None:
                    self.bind_failure = parse_bind_failure(line)
                if self._serving_since is None and SERVING_LINE in line:
                    self._serving_since = time.monotonic()
        await proc.wait()

    async def _stop_vllm(self) -> None:
        proc = self._proc
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            async with asyncio.timeout(self.lifecycle.stop_timeout_s):
                await proc.wait()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()

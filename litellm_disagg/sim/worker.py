"""One simulated worker: engine + HTTP server + (optional) KV event publisher, registered like a real worker.

Lifecycle, as the vLLM worker wrapper does it::

    start: engine, publisher, HTTP server on a free 127.0.0.1 port -> publish READY -> heartbeat ...
    drain: publish DRAINING -> wait until the engine is idle (nothing in flight, no KV held for a decode) for
           ``settle_s`` -> withdraw -> stop
    crash: stop heartbeats, kill the engine (its held KV is lost), drop every connection, close the port; nothing is
           withdrawn (the registry entry ages out by its TTL, as with a dead process)
    stop:  withdraw, then stop at once

The NIXL side-channel port published in the RuntimeConfig is a real port reserved (bound, never listening) for the
worker's lifetime, so it is unique among everything on the machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Generator
from enum import StrEnum

import uvicorn

from litellm_disagg.discovery.registry import Registry, RegistryError
from litellm_disagg.runtime_config import RuntimeConfig, WorkerRole, WorkerState
from litellm_disagg.sim.directory import DIRECTORY, EngineDirectory
from litellm_disagg.sim.engine import SimEngine
from litellm_disagg.sim.publisher import KVEventPublisher
from litellm_disagg.sim.server import ServerState, build_app
from litellm_disagg.sim.settings import SimSettings

logger = logging.getLogger(__name__)


class SimWorkerState(StrEnum):
    NEW = "new"
    READY = "ready"
    DRAINING = "draining"
    STOPPED = "stopped"
    CRASHED = "crashed"


class _Server(uvicorn.Server):
    """A uvicorn server that leaves signals alone: many share one process and its owner handles signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class SimWorker:
    def __init__(
        self,
        worker_id: str,
        role: WorkerRole,
        settings: SimSettings | None = None,
        *,
        registry: Registry | None = None,
        heartbeat_interval_s: float = 2.0,
        host: str = "127.0.0.1",
        directory: EngineDirectory = DIRECTORY,
    ):
        self.worker_id = worker_id
        self.role = role
        self.settings = settings or SimSettings()
        self.registry = registry
        self.heartbeat_interval_s = heartbeat_interval_s
        self.host = host
        self.directory = directory
        self.state = SimWorkerState.NEW
        self.server_state = ServerState()
        self.engine: SimEngine | None = None
        self.publisher: KVEventPublisher | None = None
        self.config: RuntimeConfig | None = None
        self.port = 0
        self._nixl_sock: socket.socket | None = None
        self._server: _Server | None = None
        self._serve_task: asyncio.Task[None] | None = None
        self._heartbeat_task: asyncio.Task[None] | None = None

    # -- addresses ---------------------------------------------------------------------------------------------------

    @property
    def server_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.server_url}/v1"

    @property
    def kv_events_endpoint(self) -> str | None:
        return self.publisher.endpoint if self.publisher is not None else None

    # -- lifecycle ---------------------------------------------------------------------------------------------------

    async def start(self) -> RuntimeConfig:
        if self.state is not SimWorkerState.NEW:
            raise RuntimeError(f"worker {self.worker_id} was already started")
        self._nixl_sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._nixl_sock.bind((self.host, 0))
        nixl_port = int(self._nixl_sock.getsockname()[1])
        if self.settings.kv_events:
            self.publisher = KVEventPublisher(topic=self.settings.kv_events_topic, host=self.host)
        self.engine = SimEngine(
            self.settings,
            self.role,
            nixl_host=self.host,
            nixl_port=nixl_port,
            directory=self.directory,
            publisher=self.publisher,
        )
        await self.engine.start()
        await self._start_server()
        self.config = RuntimeConfig(
            worker_id=self.worker_id,
            model=self.settings.model,
            role=self.role,
            base_url=self.base_url,
            nixl_host=self.host,
            nixl_port=nixl_port,
            kv_capacity_blocks=self.settings.engine.num_gpu_blocks,
            block_size=self.settings.engine.block_size,
            kv_events_endpoint=self.kv_events_endpoint,
            state=WorkerState.READY,
        )
        self.state = SimWorkerState.READY
        if self.registry is not None:
            await self.registry.publish(self.config)
            self._heartbeat_task = asyncio.create_task(self._heartbeat(), name=f"sim-heartbeat-{self.worker_id}")
        return self.config

    async def drain(self, *, timeout_s: float = 30.0, settle_s: float = 0.0) -> bool:
        """Leave gracefully. True when the engine went idle in time, False when the timeout cut in-flight work."""
        if self.state is not SimWorkerState.READY:
            return self.state is SimWorkerState.STOPPED
        assert self.engine is not None and self.config is not None
        self.state = SimWorkerState.DRAINING
        if self.registry is not None:
            with contextlib.suppress(RegistryError):
                await self.registry.publish(self.config.with_state(WorkerState.DRAINING))
        deadline = time.monotonic() + timeout_s
        idle_since: float | None = None
        finished = self.engine.stats.finished
        drained = False
        while time.monotonic() < deadline:
            now = time.monotonic()
            if not self.engine.idle or self.engine.stats.finished != finished:
                idle_since = None
                finished = self.engine.stats.finished
            elif idle_since is None:
                idle_since = now
            if idle_since is not None and now - idle_since >= settle_s:
                drained = True
                break
            await asyncio.sleep(0.01)
        if not drained:
            logger.warning(
                "worker %s: drain timeout after %.1fs, stopping with work in flight", self.worker_id, timeout_s
            )
        await self.stop()
        return drained

    async def stop(self) -> None:
        """Withdraw and stop now (in-flight requests fail)."""
        if self.state in (SimWorkerState.STOPPED, SimWorkerState.CRASHED, SimWorkerState.NEW):
            return
        await self._stop_heartbeat()
        if self.registry is not None:
            try:
                await self.registry.withdraw(self.worker_id)
            except RegistryError as exc:
                logger.warning("worker %s: could not withdraw: %s", self.worker_id, exc)
        if self.engine is not None:
            await self.engine.stop()
        await self._stop_server()
        self._release_ports()
        self.state = SimWorkerState.STOPPED

    async def crash(self) -> None:
        """Die abruptly: no withdraw, connections reset, the port closed, KV held for decodes lost."""
        if self.state in (SimWorkerState.STOPPED, SimWorkerState.CRASHED):
            return
        self.state = SimWorkerState.CRASHED
        await self._stop_heartbeat()
        self._kill_server()
        if self.engine is not None:
            self.engine.crash()
        await self._stop_server()
        if self.engine is not None:
            await self.engine.stop()  # reaps the cancelled tasks; the engine is already dead
        self._release_ports()

    def set_healthy(self, healthy: bool) -> None:
        """Make ``GET /health`` answer 200 (True) or 503 (False); serving continues either way."""
        self.server_state.healthy = healthy

    # -- internals ---------------------------------------------------------------------------------------------------

    async def _start_server(self) -> None:
        assert self.engine is not None
        # proto=IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY on accepted connections only when the listening socket
        # says TCP, and without it every keep-alive POST waits ~40 ms (Nagle against delayed ACKs).
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, 0))
        self.port = int(sock.getsockname()[1])
        config = uvicorn.Config(
            build_app(self.engine, self.server_state),
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=5,
            timeout_keep_alive=30,
        )
        self._server = _Server(config)
        self._serve_task = asyncio.create_task(self._server.serve(sockets=[sock]), name=f"sim-http-{self.worker_id}")
        while not self._server.started:
            if self._serve_task.done():
                self._serve_task.result()
                raise RuntimeError(f"HTTP server of {self.worker_id} exited during start-up")
            await asyncio.sleep(0.005)

    def _kill_server(self) -> None:
        """Reset every connection and stop listening, now (no graceful shutdown follows)."""
        server = self._server
        if server is None:
            return
        server.force_exit = True
        server.should_exit = True
        for listener in getattr(server, "servers", []):
            listener.close()
        for conn in list(server.server_state.connections):
            transport = getattr(conn, "transport", None)
            if transport is not None:
                transport.abort()

    async def _stop_server(self) -> None:
        server, task = self._server, self._serve_task
        if server is None or task is None:
            return
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def _heartbeat(self) -> None:
        assert self.registry is not None
        while True:
            await asyncio.sleep(self.heartbeat_interval_s)
            try:
                await self.registry.heartbeat(self.worker_id)
            except RegistryError as exc:
                logger.warning("worker %s: heartbeat failed (will retry): %s", self.worker_id, exc)

    async def _stop_heartbeat(self) -> None:
        task, self._heartbeat_task = self._heartbeat_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _release_ports(self) -> None:
        if self.publisher is not None:
            self.publisher.close()
        if self._nixl_sock is not None:
            self._nixl_sock.close()
            self._nixl_sock = None

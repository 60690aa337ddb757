"""One simulated worker: engine + HTTP server + (optional) KV event publisher, registered like a real worker.

Lifecycle (the discovery side is ``workers.lifecycle``, shared with the vLLM worker wrapper)::

    start: engine, publisher, HTTP server on a free 127.0.0.1 port -> publish READY -> heartbeat ...
    drain: publish DRAINING -> wait until the engine is idle (nothing in flight, no KV held for a decode) for
           ``settle_s`` -> withdraw -> stop
    crash: stop heartbeats, kill the engine (its held KV is lost), drop every connection, close the port; nothing is
           withdrawn (the registry entry ages out by its TTL, as with a dead process)
    stop:  withdraw, then stop at once

The NIXL side-channel port published in the RuntimeConfig is a real port reserved (bound, never listening) for the
worker's lifetime, so it is unique among everything on the machine. A worker standing in for another engine
(``settings.engine_name``) publishes that engine's transfer section instead: SGLang's bootstrap server on the reserved
port (its engine is listed in the directory under that address, where decode engines look for it), TensorRT-LLM's
(nothing to dial). A worker without a registry is reachable by its
URL only: its lifecycle publishes to ``_Unlisted``, which keeps nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Generator
from enum import StrEnum

import uvicorn

from litellm_disagg.discovery.registry import Registry
from litellm_disagg.discovery.roles import AfterDrain
from litellm_disagg.runtime_config import (
    RuntimeConfig,
    SglangBootstrapTransfer,
    TransferSection,
    TrtllmDisaggTransfer,
    VllmNixlPushTransfer,
    VllmNixlTransfer,
    WorkerRole,
    WorkerState,
)
from litellm_disagg.sim.directory import DIRECTORY, EngineDirectory
from litellm_disagg.sim.disagg_input import bootstrap_engine_id
from litellm_disagg.sim.engine import SimEngine
from litellm_disagg.sim.publisher import KVEventPublisher
from litellm_disagg.sim.server import ServerState, build_app
from litellm_disagg.sim.settings import SimSettings
from litellm_disagg.workers.lifecycle import DrainOutcome, DrainPolicy, EngineActivity, WorkerLifecycle


class SimWorkerState(StrEnum):
    NEW = "new"
    READY = "ready"
    DRAINING = "draining"
    STOPPED = "stopped"
    CRASHED = "crashed"


class _Unlisted:
    """The registry of a worker nobody discovers: publishing, heartbeating and withdrawing do nothing."""

    async def publish(self, config: RuntimeConfig) -> None:
        return None

    async def heartbeat(self, worker_id: str) -> None:
        return None

    async def withdraw(self, worker_id: str) -> None:
        return None


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
        switchable: bool = False,
    ):
        """``switchable``: the engine serves every kind of request (as vLLM launched ``kv_both``) and the worker
        follows role requests from discovery (``docs/role-change.md``); vLLM's transfer protocol only."""
        if switchable and (settings or SimSettings()).engine_name != "vllm":
            raise ValueError("a switchable simulated worker speaks vLLM's transfer protocol only")
        self.worker_id = worker_id
        self.role = role
        self.switchable = switchable
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
        self._drain_task: asyncio.Task[bool] | None = None
        """A drain a drain request started (kept so that it is not collected mid-way)."""
        self._nixl_sock: socket.socket | None = None
        self._server: _Server | None = None
        self._serve_task: asyncio.Task[None] | None = None
        self._lifecycle: WorkerLifecycle | None = None

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

    def _runtime_config(self, nixl_port: int) -> RuntimeConfig:
        """What this worker publishes: built here only, once the engine and the server are up."""
        return RuntimeConfig(
            worker_id=self.worker_id,
            model=self.settings.model,
            role=self.role,
            engine=self.settings.engine_name,
            base_url=self.base_url,
            transfer=self._transfer_section(nixl_port),
            kv_capacity_blocks=self.settings.engine.num_gpu_blocks,
            block_size=self.settings.engine.block_size,
            kv_events_endpoint=self.kv_events_endpoint,
            allowed_roles=tuple(WorkerRole) if self.switchable else (),
            state=WorkerState.READY,
        )

    def _transfer_section(self, port: int) -> TransferSection:
        name = self.settings.engine_name
        if name == "sglang":
            return SglangBootstrapTransfer(host=self.host, port=port)
        if name == "trtllm":
            return TrtllmDisaggTransfer()
        if self.settings.kv_transfer == "push":
            assert self.engine is not None
            return VllmNixlPushTransfer(host=self.host, port=port, engine_id=self.engine.engine_id)
        # The engine id too, as the vLLM wrapper publishes it: routers check a prefill answer names this engine.
        return VllmNixlTransfer(host=self.host, port=port, engine_id=self.engine.engine_id if self.engine else None)

    # -- lifecycle ---------------------------------------------------------------------------------------------------

    async def start(self) -> RuntimeConfig:
        if self.state is not SimWorkerState.NEW:
            raise RuntimeError(f"worker {self.worker_id} was already started")
        self._nixl_sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._nixl_sock.bind((self.host, 0))
        nixl_port = int(self._nixl_sock.getsockname()[1])
        if self.settings.kv_events:
            self.publisher = KVEventPublisher(topic=self.settings.kv_events_topic, host=self.host)
        sglang = self.settings.engine_name == "sglang"
        self.engine = SimEngine(
            self.settings,
            WorkerRole.BOTH if self.switchable else self.role,
            engine_id=bootstrap_engine_id(self.host, nixl_port) if sglang else None,
            nixl_host=self.host,
            nixl_port=nixl_port,
            directory=self.directory,
            publisher=self.publisher,
            name=self.worker_id,
        )
        await self.engine.start()
        await self._start_server()
        self.config = self._runtime_config(nixl_port)
        self._lifecycle = WorkerLifecycle(
            self.registry if self.registry is not None else _Unlisted(),
            self.config,
            self._activity,
            heartbeat_interval_s=self.heartbeat_interval_s,
            on_role_change=self._role_changed,
            on_drain_request=self._drain_requested,
        )
        self.state = SimWorkerState.READY
        await self._lifecycle.announce()
        return self.config

    async def _role_changed(self, old: WorkerRole, new: WorkerRole) -> None:
        self.role = new  # the engine already serves every kind (switchable); the published config has the new role
        if self._lifecycle is not None:
            self.config = self._lifecycle.config

    def _drain_requested(self, then: AfterDrain) -> None:
        """``litellm-disagg drain``: drain and stop, in the background (the lifecycle's call returns at once). Exit
        and park are the same here: the worker stops serving and its process (which hosts the others) goes on."""
        self._drain_task = asyncio.create_task(self.drain(), name=f"sim-drain-{self.worker_id}")

    async def drain(self, *, timeout_s: float = 30.0, settle_s: float = 0.0) -> bool:
        """Leave gracefully. True when the engine went idle in time, False when the timeout cut in-flight work."""
        if self.state is not SimWorkerState.READY:
            return self.state is SimWorkerState.STOPPED
        assert self._lifecycle is not None
        self.state = SimWorkerState.DRAINING
        outcome = await self._lifecycle.drain(DrainPolicy(timeout_s=timeout_s, settle_s=settle_s, poll_s=0.01))
        await self.stop()
        return outcome is DrainOutcome.SETTLED

    async def stop(self) -> None:
        """Withdraw and stop now (in-flight requests fail)."""
        if self.state in (SimWorkerState.STOPPED, SimWorkerState.CRASHED, SimWorkerState.NEW):
            return
        if self._lifecycle is not None:
            await self._lifecycle.leave()
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
        # Port and engine first, before anything that awaits: a dead process serves nothing more, and stopping the
        # heartbeat can wait (a registry write in flight under load).
        self._kill_server()
        if self.engine is not None:
            self.engine.crash()
        if self._lifecycle is not None:
            await self._lifecycle.abandon()
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

    async def _activity(self) -> EngineActivity | None:
        """The drain's probe; ``None`` once the worker has crashed."""
        if self.engine is None or self.state is SimWorkerState.CRASHED:
            return None
        return EngineActivity(idle=self.engine.idle, finished=self.engine.stats.finished)

    def _release_ports(self) -> None:
        if self.publisher is not None:
            self.publisher.close()
        if self._nixl_sock is not None:
            self._nixl_sock.close()
            self._nixl_sock = None

"""KVEventSubscriber: one worker's KV event stream, from its ZMQ PUB socket into its ``EventApplier``.

The worker wrapper makes vLLM *bind* its PUB socket (``tcp://*:PORT``) and publishes ``tcp://<host>:PORT`` as
``RuntimeConfig.kv_events_endpoint``; the router *connects* a SUB socket there. ZMQ reconnects by itself when the
engine restarts or the network drops (``reconnect_ivl``), and ZMTP heartbeats notice a dead peer that never closed
the connection; whatever was published meanwhile is lost and shows up as a sequence gap, which the applier handles.
A router that starts after its engines simply begins with the next batch (vLLM keeps no history without a replay
socket).

One asyncio task per worker. After each message it waits for, it drains what the socket has (up to ``max_burst``
messages) before yielding to the event loop, so a busy stream costs one wake-up per burst, not one per message.

Each message takes the compiled path when there is one for the worker's wire format (``wire``, from the engine
adapter's ``kv_event_wire``; ``native.wire`` built): ``_kvwire.apply_message`` reads the bytes and applies them in
one call, and the rest of a burst is drained by ``_kvwire.drain`` with libzmq's own receive functions (pyzmq's
``recv_multipart`` costs more than applying a message). A message it does not recognise (or every message, without
the extension) goes through the engine's ``decode`` and ``EventApplier.apply``; both give the same index.
``fast_messages`` counts the compiled ones.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence

import zmq
import zmq.asyncio

from litellm_disagg.engines.base import EventBatch, KVEventWire, MalformedBatch
from litellm_disagg.routing.kv import native
from litellm_disagg.routing.kv.event_applier import EventApplier
from litellm_disagg.tasks import cancel

logger = logging.getLogger(__name__)


class BadEndpoint(ValueError):
    """An endpoint the router cannot connect to (a wildcard address, an unknown transport)."""


def check_endpoint(endpoint: str) -> str:
    if not endpoint.startswith(("tcp://", "ipc://")) or "*" in endpoint:
        raise BadEndpoint(f"cannot subscribe to {endpoint!r}: need tcp://host:port (or ipc://path) to connect to")
    return endpoint


FastApply = Callable[[EventApplier, list[bytes]], bool]
"""``apply_message(applier, frames)``: True when it applied the message, False (nothing done) for the Python path."""


def compiled_path(wire: KVEventWire | None) -> FastApply | None:
    """The compiled decode-and-apply for a wire format, when built (and not disabled by the environment)."""
    if wire is KVEventWire.VLLM and native.wire is not None:
        return native.wire.apply_message  # type: ignore[no-any-return]
    return None


FastDrain = Callable[[EventApplier, int, int, Callable[[list[bytes]], None]], tuple[int, int]]
"""``drain(applier, socket address, max messages, fallback) -> (received, applied)``: see ``_kvwire.drain``."""


def compiled_drain(wire: KVEventWire | None) -> FastDrain | None:
    """The compiled receive loop for a wire format, when built and bound to the libzmq pyzmq loaded."""
    global _libzmq_bound
    if compiled_path(wire) is None or native.wire is None:
        return None
    if _libzmq_bound is None:
        from zmq.backend.cython import _zmq

        _libzmq_bound = bool(native.wire.bind_libzmq(_zmq.__file__))
        if not _libzmq_bound:
            logger.info("KV events: libzmq's functions not found through pyzmq; bursts are drained in Python")
    return native.wire.drain if _libzmq_bound else None  # type: ignore[no-any-return]


_libzmq_bound: bool | None = None


class KVEventSubscriber:
    def __init__(
        self,
        endpoint: str,
        applier: EventApplier,
        *,
        decode: Callable[[Sequence[bytes]], EventBatch],
        context: zmq.asyncio.Context,
        topic: str = "",
        rcvhwm: int = 100_000,
        reconnect_interval_s: float = 0.1,
        reconnect_interval_max_s: float = 5.0,
        heartbeat_s: float = 2.0,
        max_burst: int = 1000,
        wire: KVEventWire | None = None,
    ):
        self.endpoint = check_endpoint(endpoint)
        self.applier = applier
        self.decode = decode
        """The worker's engine's wire decoder (``EngineAdapter.decode_kv_events``)."""
        self.max_burst = max_burst
        self.fast_apply = compiled_path(wire)
        """The compiled path for the worker's wire format, or None (every message through ``decode``)."""
        self.fast_drain = compiled_drain(wire)
        """The compiled receive loop (the rest of a burst), or None (``recv_multipart`` per message)."""
        self.messages = 0
        self.fast_messages = 0
        """Messages the compiled path applied (the others went through ``decode`` and ``EventApplier.apply``)."""
        self.last_message_at: float | None = None
        self._socket: zmq.asyncio.Socket = context.socket(zmq.SUB)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.RCVHWM, rcvhwm)
        self._socket.setsockopt(zmq.RECONNECT_IVL, int(reconnect_interval_s * 1000))
        self._socket.setsockopt(zmq.RECONNECT_IVL_MAX, int(reconnect_interval_max_s * 1000))
        self._socket.setsockopt(zmq.HEARTBEAT_IVL, int(heartbeat_s * 1000))
        self._socket.setsockopt(zmq.HEARTBEAT_TIMEOUT, int(heartbeat_s * 3000))
        self._socket.setsockopt(zmq.SUBSCRIBE, topic.encode("utf-8"))
        self._task: asyncio.Task[None] | None = None

    @property
    def worker_id(self) -> str:
        return self.applier.worker_id

    @property
    def running(self) -> bool:
        return self._task is not None

    def close(self) -> None:
        """Close a subscriber that was never started (``stop`` for a started one)."""
        if self._task is None:
            self._socket.close(linger=0)

    def start(self) -> None:
        if self._task is None:
            self._socket.connect(self.endpoint)
            self._task = asyncio.create_task(self._run(), name=f"kv-events-{self.worker_id}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel([task])
        self._socket.close(linger=0)

    async def _run(self) -> None:
        # The first message through the asyncio socket (it waits without blocking the loop), the rest of the burst
        # through a plain shadow of the same ZMQ socket: a non-blocking receive there costs no future.
        drain: zmq.Socket[bytes] = zmq.Socket.shadow(self._socket.underlying)
        receive = drain.recv_multipart
        handle = self._handle
        fast_drain = self.fast_drain
        while True:
            handle(await self._socket.recv_multipart())
            if fast_drain is not None:
                self._drain_compiled(fast_drain, drain.underlying)
            else:
                for _ in range(self.max_burst - 1):
                    try:
                        frames = receive(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    handle(frames)
            await asyncio.sleep(0)

    def _drain_compiled(self, fast_drain: FastDrain, socket_address: int) -> None:
        try:
            received, applied = fast_drain(self.applier, socket_address, self.max_burst - 1, self._handle_python)
        except Exception:  # a bug here must not end the subscription
            logger.exception("worker %s: draining KV events (compiled path) failed", self.worker_id)
            return
        if received:
            self.messages += received
            self.fast_messages += applied
            self.last_message_at = time.monotonic()

    def _handle(self, frames: list[bytes]) -> None:
        self.messages += 1
        self.last_message_at = time.monotonic()
        fast = self.fast_apply
        if fast is not None:
            try:
                if fast(self.applier, frames):
                    self.fast_messages += 1
                    return
            except Exception:  # a bug here must not end the subscription
                logger.exception("worker %s: applying KV events (compiled path) failed", self.worker_id)
                return
        self._handle_python(frames)

    def _handle_python(self, frames: list[bytes]) -> None:
        """One message through the engine's decoder and ``EventApplier.apply``."""
        try:
            batch = self.decode(frames)
        except MalformedBatch as exc:
            logger.warning("worker %s: undecodable KV event message: %s", self.worker_id, exc)
            self.applier.lost(exc.seq)
            return
        try:
            self.applier.apply(batch)
        except Exception:  # a bug here must not end the subscription
            logger.exception("worker %s: applying KV events failed", self.worker_id)

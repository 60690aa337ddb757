"""The ZMQ PUB socket that sends KV event batches the way vLLM's ``ZmqEventPublisher`` does.

Frames: ``(topic, sequence number as 8 bytes big-endian, payload)``; the sequence starts at 0 and grows by one per
batch. It binds on 127.0.0.1 (a free port unless one is given); subscribers connect to ``endpoint``. Sending never
blocks: past the high-water mark ZMQ drops, as vLLM's PUB socket does. No replay socket.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence

import zmq

from litellm_disagg.sim.kv_events import KVEvent, encode_batch


class KVEventPublisher:
    def __init__(
        self,
        *,
        topic: str = "kv",
        host: str = "127.0.0.1",
        port: int = 0,
        hwm: int = 100_000,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
    ):
        self._ctx = context or zmq.Context.instance()
        self._sock: zmq.Socket[bytes] = self._ctx.socket(zmq.PUB)
        self._sock.setsockopt(zmq.SNDHWM, hwm)
        self._sock.setsockopt(zmq.LINGER, 0)
        if port:
            self._sock.bind(f"tcp://{host}:{port}")
            self.port = port
        else:
            self.port = self._sock.bind_to_random_port(f"tcp://{host}")
        self.endpoint = f"tcp://{host}:{self.port}"
        self._topic = topic.encode()
        self._seq = 0
        self.batches_sent = 0

    def publish(self, events: Sequence[KVEvent], ts: float | None = None) -> None:
        if not events or self._sock.closed:
            return
        payload = encode_batch(time.time() if ts is None else ts, events)
        with contextlib.suppress(zmq.Again):  # no room: dropped, like a PUB socket past its high-water mark
            self._sock.send_multipart((self._topic, self._seq.to_bytes(8, "big"), payload), flags=zmq.NOBLOCK)
        self._seq += 1
        self.batches_sent += 1

    def close(self) -> None:
        if not self._sock.closed:
            self._sock.close(linger=0)

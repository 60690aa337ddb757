"""A ZMQ PUB socket on 127.0.0.1 that sends KV event messages the way a vLLM engine bound on ``tcp://*:PORT`` does."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import zmq

from tests.kv import vllm_wire as wire


class FakeEnginePublisher:
    def __init__(self, port: int = 0, *, topic: bytes = b"kv") -> None:
        self._ctx = zmq.Context.instance()
        self.topic = topic
        self.sock: zmq.Socket[bytes] = self._ctx.socket(zmq.PUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        if port:
            self._bind_again(port)
            self.port = port
        else:
            self.port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{self.port}"
        self.seq = 0

    def _bind_again(self, port: int) -> None:
        """Bind a port a closed socket just released (ZMQ closes in its I/O thread: retry briefly)."""
        deadline = time.monotonic() + 5.0
        while True:
            try:
                self.sock.bind(f"tcp://127.0.0.1:{port}")
                return
            except zmq.ZMQError as exc:
                if exc.errno != zmq.EADDRINUSE or time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    def send(self, events: list[wire.Event], seq: int | None = None) -> None:
        """Publish one batch; ``seq`` defaults to the next number."""
        if seq is None:
            seq = self.seq
        self.sock.send_multipart(wire.message(seq, events, topic=self.topic))
        self.seq = seq + 1

    def send_raw(self, frames: list[bytes]) -> None:
        self.sock.send_multipart(frames)

    def close(self) -> None:
        self.sock.close(linger=0)


async def until(condition: Callable[[], bool], *, timeout: float = 5.0, tick: Callable[[], None] | None = None) -> None:
    """Wait until ``condition()``; ``tick`` runs every few ms meanwhile (e.g. republish while the SUB joins)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError("condition not met in time")
        if tick is not None:
            tick()
        await asyncio.sleep(0.01)


async def joined(publisher: FakeEnginePublisher, received: Callable[[], int]) -> None:
    """ZMQ drops what a PUB sends before a SUB has joined: send an empty batch under one sequence number (a
    duplicate to the applier) until something arrives."""
    seq = publisher.seq
    await until(lambda: received() > 0, tick=lambda: publisher.send([], seq=seq))
    publisher.seq = seq + 1

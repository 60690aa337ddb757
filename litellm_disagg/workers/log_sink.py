"""The worker's own output (the engine's log lines it relays, its READY line, its exit report), written from a thread.

The wrapper relays every line the engine prints. Written from the event loop, each ``print(..., flush=True)`` is a
``write`` that can block: a log file on a disk under writeback pressure (the kernel pauses writers of dirty pages for
up to 200 ms per call), a pipe its reader stopped draining. A burst of engine lines (vLLM logs dozens at its first
NIXL handshake) then holds the event loop, and with it the heartbeats: once in CI a decode worker's entry outlived its
10 s TTL right after its first handshake and the proxy dropped it for a second. Here the event loop only puts a line
on a queue; one thread writes. When the queue holds ``max_pending`` lines, new ones are dropped and counted, and
the count is written when the writer catches up: the worker stays in discovery rather than its log staying whole.
"""

from __future__ import annotations

import queue
import threading
from typing import TextIO

_CLOSE = object()


class LogSink:
    def __init__(self, stream: TextIO, *, max_pending: int = 10_000):
        self.stream = stream
        self.dropped = 0
        """Lines dropped in all because the stream could not keep up."""
        self._unreported = 0
        self._lock = threading.Lock()
        self._queue: queue.Queue[object] = queue.Queue(maxsize=max_pending)
        self._thread = threading.Thread(target=self._write_all, name="worker-log", daemon=True)
        self._thread.start()

    def line(self, text: str) -> None:
        """Queue one line (never blocks)."""
        try:
            self._queue.put_nowait(text)
        except queue.Full:
            with self._lock:
                self.dropped += 1
                self._unreported += 1

    def close(self, timeout_s: float = 10.0) -> None:
        """Write what is queued, then stop the thread (waits at most ``timeout_s``: a stream stuck for good does not
        keep the worker from exiting)."""
        if not self._thread.is_alive():
            return
        try:
            self._queue.put(_CLOSE, timeout=timeout_s)
        except queue.Full:
            return
        self._thread.join(timeout_s)

    def _write_all(self) -> None:
        while True:
            item = self._queue.get()
            if item is _CLOSE:
                self._flush()
                return
            try:
                print(item, file=self.stream)
                with self._lock:
                    unreported, self._unreported = self._unreported, 0
                if unreported:
                    print(f"litellm-disagg worker: {unreported} log lines dropped: the log could not keep up",
                          file=self.stream)
                if self._queue.empty():
                    self._flush()
            except (OSError, ValueError):  # a closed or broken stream: the lines have nowhere to go
                pass

    def _flush(self) -> None:
        try:
            self.stream.flush()
        except (OSError, ValueError):
            pass

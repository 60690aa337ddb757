"""Steady streamed chat traffic through a proxy, for tests that watch what the planner does under a given load.

``StreamingTraffic(client, model=..., words=..., concurrency=..., tag=...)`` starts ``concurrency`` loops, each sending
one streamed chat of about ``words`` words at a time (every prompt distinct, so no prefix cache hides the work) until
``stop()``. It counts completions, keeps every failure's text, and records each request's time to its first streamed
chunk as the client saw it (``ttfts``) and, for a request streamed in two or more chunks after its first, the mean gap
between them (``itls``: its inter-token latency as the client saw it)."""

from __future__ import annotations

import asyncio
import time

import httpx


class StreamingTraffic:
    def __init__(self, client: httpx.AsyncClient, *, model: str, words: int, concurrency: int, tag: str,
                 max_tokens: int = 6):
        self.client = client
        self.model = model
        self.words = words
        self.max_tokens = max_tokens
        self.tag = tag
        self.done = 0
        self.failures: list[str] = []
        self.ttfts: list[float] = []
        self.itls: list[float] = []
        self._stop = asyncio.Event()
        self._tasks = [asyncio.create_task(self._loop(n)) for n in range(concurrency)]

    def prompt(self, n: int, i: int) -> str:
        return f"{self.tag} {n} {i} " + " ".join(f"w{k % 97}" for k in range(self.words))

    async def _loop(self, n: int) -> None:
        i = 0
        while not self._stop.is_set():
            i += 1
            body = {"model": self.model, "messages": [{"role": "user", "content": self.prompt(n, i)}],
                    "max_tokens": self.max_tokens, "temperature": 0, "stream": True}
            started = time.monotonic()
            first: float | None = None
            last = 0.0
            data_lines = 0
            chunks: list[str] = []
            try:
                async with self.client.stream("POST", "/v1/chat/completions", json=body) as r:
                    async for line in r.aiter_lines():
                        if line.startswith("data:") and "[DONE]" not in line:
                            last = time.monotonic() - started
                            data_lines += 1
                            if first is None:
                                first = last
                        chunks.append(line)
                text = "\n".join(chunks)
                if r.status_code != 200 or "[DONE]" not in text:
                    self.failures.append(f"{r.status_code}: {text[:200]}")
                    continue
            except httpx.HTTPError as exc:
                self.failures.append(repr(exc))
                continue
            if first is not None:
                self.ttfts.append(first)
                if data_lines >= 3:  # the first chunk, then at least two more: a gap that is not the first token's
                    self.itls.append((last - first) / (data_lines - 1))
            self.done += 1

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` by nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]

"""LoadScraper: every worker's own load figures, read from its ``/metrics`` at a short interval.

One asyncio task scrapes all targets concurrently every ``interval_s``. Per worker it keeps the last values of
``vllm:num_requests_waiting``, ``vllm:num_requests_running`` and ``vllm:kv_cache_usage_perc`` (older vLLM:
``vllm:gpu_cache_usage_perc``), summed over engines (usage averaged). A scrape that fails keeps the previous values
and marks them stale; values older than ``stale_after_s`` read as stale too. Readers get a ``ScrapedLoad`` snapshot
(immutable) and never wait for I/O.

Parsing reads only the lines of the wanted metrics (a vLLM metrics page is mostly histograms), so 64 workers every
250 ms cost little CPU on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import httpx

logger = logging.getLogger(__name__)

WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
KV_USAGE = "vllm:kv_cache_usage_perc"
KV_USAGE_OLD = "vllm:gpu_cache_usage_perc"
_WANTED = (WAITING, RUNNING, KV_USAGE, KV_USAGE_OLD)


@dataclass(frozen=True)
class ScrapedLoad:
    waiting: float = 0.0
    running: float = 0.0
    kv_usage: float = 0.0
    """Fraction of KV blocks in use, 0..1."""
    scraped_at: float = 0.0
    """Monotonic time of the scrape these values come from."""
    stale: bool = True
    """The last scrape failed (or none succeeded yet), or the values are older than ``stale_after_s``."""


NOT_SCRAPED = ScrapedLoad()
"""What a worker that was never scraped reads as: nothing known (stale)."""


def parse_metrics(text: str) -> ScrapedLoad | None:
    """The wanted figures from a Prometheus text page; None if it has none of them."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        name_end = len(line)
        for stop in ("{", " "):
            at = line.find(stop)
            if 0 <= at < name_end:
                name_end = at
        name = line[:name_end]
        if name not in _WANTED:
            continue
        value_part = line[line.rfind("}") + 1 :] if "}" in line else line[name_end:]
        fields = value_part.split()
        if not fields:
            continue
        try:
            value = float(fields[0])
        except ValueError:
            continue
        sums[name] = sums.get(name, 0.0) + value
        counts[name] = counts.get(name, 0) + 1
    if not sums:
        return None
    usage_name = KV_USAGE if KV_USAGE in sums else KV_USAGE_OLD
    usage = sums.get(usage_name, 0.0) / counts.get(usage_name, 1)
    return ScrapedLoad(
        waiting=sums.get(WAITING, 0.0),
        running=sums.get(RUNNING, 0.0),
        kv_usage=min(1.0, max(0.0, usage)),
        stale=False,
    )


class LoadScraper:
    def __init__(
        self,
        *,
        interval_s: float = 0.25,
        timeout_s: float = 1.0,
        stale_after_s: float = 2.0,
        client: httpx.AsyncClient | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.stale_after_s = stale_after_s
        self._client = client
        self._own_client = client is None
        self._clock = clock
        self._targets: dict[str, str] = {}
        self._last: dict[str, ScrapedLoad] = {}
        self._task: asyncio.Task[None] | None = None

    # -- targets ------------------------------------------------------------------------------------------------------

    def set_targets(self, targets: Mapping[str, str]) -> None:
        """``{worker_id: server_url}`` (the worker's HTTP root; ``/metrics`` is appended). Departed workers' values
        are dropped."""
        self._targets = dict(targets)
        for gone in set(self._last) - set(self._targets):
            del self._last[gone]

    # -- reading ------------------------------------------------------------------------------------------------------

    def get(self, worker_id: str) -> ScrapedLoad:
        """The worker's last values (all zero and stale when never scraped)."""
        return self.lookup()(worker_id)

    def lookup(self) -> Callable[[str], ScrapedLoad]:
        """``get`` for many workers at one instant (reads the clock once)."""
        now, last, limit = self._clock(), self._last, self.stale_after_s

        def get(worker_id: str) -> ScrapedLoad:
            found = last.get(worker_id)
            if found is None:
                return NOT_SCRAPED
            if not found.stale and now - found.scraped_at > limit:
                return ScrapedLoad(found.waiting, found.running, found.kv_usage, found.scraped_at, stale=True)
            return found

        return get

    def snapshot(self) -> dict[str, ScrapedLoad]:
        get = self.lookup()
        return {worker_id: get(worker_id) for worker_id in self._targets}

    # -- scraping -----------------------------------------------------------------------------------------------------

    async def scrape_once(self) -> None:
        """Scrape every target once, concurrently."""
        targets = list(self._targets.items())
        if targets:
            await asyncio.gather(*(self._scrape(worker_id, url) for worker_id, url in targets))

    async def _scrape(self, worker_id: str, server_url: str) -> None:
        client = self._http()
        try:
            response = await client.get(f"{server_url}/metrics", timeout=self.timeout_s)
            response.raise_for_status()
            parsed = parse_metrics(response.text)
            if parsed is None:
                raise ValueError("no vLLM load metrics on the page")
        except (httpx.HTTPError, ValueError) as exc:
            previous = self._last.get(worker_id)
            if worker_id in self._targets and (previous is None or not previous.stale):
                logger.debug("load scrape of %s failed: %s", worker_id, exc)
            if worker_id in self._targets:
                base = previous or ScrapedLoad()
                self._last[worker_id] = ScrapedLoad(
                    base.waiting, base.running, base.kv_usage, base.scraped_at, stale=True
                )
            return
        if worker_id in self._targets:  # not removed while the scrape was in flight
            self._last[worker_id] = ScrapedLoad(
                parsed.waiting, parsed.running, parsed.kv_usage, self._clock(), stale=False
            )

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="kv-load-scraper")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._own_client and self._client is not None:
            await self._client.aclose()
            self._client = None

    async def _run(self) -> None:
        while True:
            started = self._clock()
            try:
                await self.scrape_once()
            except Exception:  # never let load collection die
                logger.exception("load scrape round failed")
            await asyncio.sleep(max(0.0, self.interval_s - (self._clock() - started)))

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(limits=httpx.Limits(max_connections=256, max_keepalive_connections=128))
        return self._client

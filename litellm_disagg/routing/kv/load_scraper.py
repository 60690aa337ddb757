"""LoadScraper: every worker's own load figures, and its measured KV transfers, read from its ``/metrics``.

Metric names come from the engine's ``MetricNames`` (``litellm_disagg.engines``; vLLM's names below as the example).
One asyncio task scrapes all targets concurrently every ``interval_s``. Per worker it keeps the last values of
``vllm:num_requests_waiting``, ``vllm:num_requests_running`` and ``vllm:kv_cache_usage_perc`` (older vLLM:
``vllm:gpu_cache_usage_perc``), summed over engines (usage averaged), and the cumulative
``vllm:generation_tokens_total`` where the engine reports it (the planner's decode demand). A scrape that fails keeps
the previous values and marks them stale; values older than ``stale_after_s`` read as stale too. Readers get a
``ScrapedLoad`` snapshot (immutable) and never wait for I/O.

Parsing (``engines.prom_text`` with a ``Wanted`` filter built once) reads only the lines of the wanted metrics (a vLLM
metrics page is mostly histograms), so 64 workers every 250 ms cost little CPU on the event loop.

KV transfers (what the decode side of vLLM's NixlConnector measured). The same scrape reads three cumulative
counters, summed over engines: ``vllm:nixl_xfer_time_seconds`` (a histogram: ``_count`` transfers, ``_sum`` their
seconds) and ``vllm:prompt_tokens_by_source_total{source="external_kv_transfer"}`` (prompt tokens that arrived by
transfer). Their increases between two successful scrapes of a worker make a ``TransferSample`` (transfers, seconds,
tokens), handed to the ``on_transfers`` callback (``TransferDeltas`` does the bookkeeping; the router feeds the
samples to the disaggregation decider and to the metrics; this module knows nothing of them). Where the page has
``vllm:nixl_bytes_transferred`` (a histogram of bytes per transfer), its ``_sum`` gives the sample's bytes too:

- The first scrape of a worker (or of a new URL for it) only sets the baseline. A counter that went down (the worker
  restarted) or a changed ``process_start_time_seconds`` (where exported) sets a new baseline and drops whatever was
  pending. A failed scrape changes nothing: the next successful one reports the increase over both intervals.
- A worker without these metrics (aggregated, without NixlConnector, or a vLLM older than the ``source`` counter) gives
  no samples; its load is read as before.
- An increase is carried to the next scrapes until both transfers and tokens have grown: vLLM records a transfer's
  time when the transfer completes but its tokens when the request gets its first token, a step or two later, so a
  scrape can fall between the two. A one-sided increase still unmatched after ``transfer_carry_s`` is dropped (tokens
  that came from elsewhere, e.g. another connector, must not pile onto a later transfer).

Approximations. The counters are totals: a sample gives the mean time and the mean tokens per transfer of its
interval, not each transfer's. vLLM counts NIXL transfer handles, not requests: each tensor-parallel rank of the
decode worker reads its own shard of a request's KV (in parallel, so the request waits about as long as one handle
takes), and a rank that reads from several prefill ranks (prefill TP larger than decode TP) has one handle per remote
rank. So ``tokens / transfers`` is a request's tokens divided by its handles; the consumer corrects by the decode
worker's tensor-parallel size (``DisaggDecider.observe_transfers``), exact when both sides have the same TP. A scrape
that falls between a transfer and its tokens moves that request's tokens into the next sample: the totals stay
right, single samples are noisy.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import httpx

from litellm_disagg.engines import prom_text
from litellm_disagg.engines.base import MetricNames
from litellm_disagg.engines.vllm.metrics import VLLM_METRICS
from litellm_disagg.routing.kv.metrics_fetch import AiohttpFetch, FetchError, HttpxFetch, MetricsFetch
from litellm_disagg.tasks import cancel

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class _LoadNames:
    """The metric names one scrape reads, taken from the engine's ``MetricNames``, and the filter that finds them."""

    waiting: str
    running: str
    kv_usage: str
    kv_usage_fallback: str | None
    transfers: str | None
    seconds: str | None
    tokens: str | None
    """Prompt tokens by source; ``wanted`` keeps only those that arrived by transfer."""
    bytes: str | None
    """Bytes moved (the sum of the engine's bytes-per-transfer histogram); optional, for the metrics only."""
    process_start: str
    wanted: prom_text.Wanted
    generation_tokens: str | None = None
    """Tokens generated (a counter), for the planner's decode demand; None where the engine does not report it."""
    path: str = "metrics"
    """Where the page is, under the server root (``MetricNames.path``)."""

    @classmethod
    def of(cls, metrics: MetricNames) -> _LoadNames:
        transfer_bytes = None if metrics.transfer_bytes is None else f"{metrics.transfer_bytes}_sum"
        names = (
            metrics.requests_waiting,
            metrics.requests_running,
            metrics.kv_cache_usage,
            metrics.kv_cache_usage_fallback,
            metrics.transfer_count,
            metrics.transfer_seconds,
            metrics.prompt_tokens_by_source,
            metrics.process_start,
            transfer_bytes,
            metrics.generation_tokens,
        )
        tokens = metrics.prompt_tokens_by_source
        by_source = {} if tokens is None else {tokens: (metrics.source_label, metrics.transferred_source)}
        return cls(
            waiting=metrics.requests_waiting,
            running=metrics.requests_running,
            kv_usage=metrics.kv_cache_usage,
            kv_usage_fallback=metrics.kv_cache_usage_fallback,
            transfers=metrics.transfer_count,
            seconds=metrics.transfer_seconds,
            tokens=tokens,
            bytes=transfer_bytes,
            process_start=metrics.process_start,
            wanted=prom_text.Wanted(
                (name for name in names if name is not None),
                labelled=(),  # only sums are needed; the one label that matters is a filter
                where=by_source,
            ),
            path=metrics.path,
            generation_tokens=metrics.generation_tokens,
        )


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
    generation_tokens: float | None = None
    """Tokens generated since the engine started (its cumulative counter, summed over engines); None when the page
    lacks it."""
    counted_at_scrape: float | None = None
    """The router's own count of requests in flight on the worker (``Accounting.requests``: every replica's, where
    they share them) when these values arrived: ``WorkerLoad.active_requests`` moves the engine's count by what the
    router started and saw end since, so a worker whose requests ended after the scrape does not read busy until the
    next one. None: not recorded."""


NOT_SCRAPED = ScrapedLoad()
"""What a worker that was never scraped reads as: nothing known (stale)."""


@dataclass(frozen=True)
class TransferTotals:
    """A worker's cumulative KV transfer counters at one scrape, summed over its engines."""

    transfers: float
    """``vllm:nixl_xfer_time_seconds_count``: transfers (NIXL transfer handles) completed."""
    seconds: float
    """``vllm:nixl_xfer_time_seconds_sum``: their durations, added up."""
    tokens: float
    """``vllm:prompt_tokens_by_source_total{source="external_kv_transfer"}``: prompt tokens that arrived by transfer."""
    process_start: float | None = None
    """``process_start_time_seconds`` where the page has it: a change means a restart."""
    bytes: float | None = None
    """``vllm:nixl_bytes_transferred_sum``: bytes moved, where the page has it."""


@dataclass(frozen=True)
class TransferSample:
    """What one worker's transfers did since the previous sample (see the module docstring for what it means)."""

    worker_id: str
    transfers: float
    seconds: float
    tokens: float
    bytes: float = 0.0
    """Bytes moved (0 when the engine does not report them)."""


def _parse(text: str, names: _LoadNames) -> tuple[ScrapedLoad | None, TransferTotals | None]:
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for name, _, value in prom_text.samples(text, names.wanted):
        sums[name] = sums.get(name, 0.0) + value
        counts[name] = counts.get(name, 0) + 1
    load: ScrapedLoad | None = None
    if any(name in sums for name in (names.waiting, names.running, names.kv_usage, names.kv_usage_fallback)):
        usage_name = names.kv_usage
        if usage_name not in sums and names.kv_usage_fallback is not None:
            usage_name = names.kv_usage_fallback
        usage = sums.get(usage_name, 0.0) / counts.get(usage_name, 1)
        load = ScrapedLoad(
            waiting=sums.get(names.waiting, 0.0),
            running=sums.get(names.running, 0.0),
            kv_usage=min(1.0, max(0.0, usage)),
            stale=False,
            generation_tokens=sums.get(names.generation_tokens) if names.generation_tokens is not None else None,
        )
    totals: TransferTotals | None = None
    transfers = sums.get(names.transfers) if names.transfers is not None else None
    seconds = sums.get(names.seconds) if names.seconds is not None else None
    transferred_tokens = sums.get(names.tokens) if names.tokens is not None else None
    if (
        transfers is not None
        and seconds is not None
        and transferred_tokens is not None
        and all(math.isfinite(v) and v >= 0 for v in (transfers, seconds, transferred_tokens))
    ):
        start = sums.get(names.process_start) if counts.get(names.process_start) == 1 else None
        moved = sums.get(names.bytes) if names.bytes is not None else None
        moved = moved if moved is not None and math.isfinite(moved) and moved >= 0 else None
        totals = TransferTotals(transfers, seconds, transferred_tokens, start, moved)
    return load, totals


def parse_metrics(text: str, metrics: MetricNames = VLLM_METRICS) -> ScrapedLoad | None:
    """The wanted load figures from a Prometheus text page; None if it has none of them."""
    return _parse(text, _LoadNames.of(metrics))[0]


def parse_transfer_totals(text: str, metrics: MetricNames = VLLM_METRICS) -> TransferTotals | None:
    """The KV transfer counters from a Prometheus text page; None unless it has all three."""
    return _parse(text, _LoadNames.of(metrics))[1]


class TransferDeltas:
    """Per worker: cumulative ``TransferTotals`` in, ``TransferSample`` increases out (rules: the module docstring).
    Pure bookkeeping; the caller passes the time."""

    def __init__(self, *, carry_s: float = 5.0):
        self.carry_s = carry_s
        self._base: dict[str, TransferTotals] = {}
        self._pending: dict[str, tuple[float, float, float, float]] = {}
        self._pending_since: dict[str, float] = {}

    def update(self, worker_id: str, totals: TransferTotals | None, now: float) -> TransferSample | None:
        """The worker's counters at a successful scrape (None: its page has none); a sample when there is one."""
        base = self._base.get(worker_id)
        if totals is None or base is None or _restarted(base, totals):
            self.forget(worker_id)
            if totals is not None:
                self._base[worker_id] = totals
            return None
        self._base[worker_id] = totals
        since = self._pending_since.get(worker_id)
        if since is not None and now - since > self.carry_s:
            self._clear(worker_id)
        transfers, seconds, tokens, moved = self._pending.get(worker_id, (0.0, 0.0, 0.0, 0.0))
        transfers += totals.transfers - base.transfers
        seconds += totals.seconds - base.seconds
        tokens += totals.tokens - base.tokens
        if totals.bytes is not None and base.bytes is not None:
            moved += max(0.0, totals.bytes - base.bytes)
        if transfers > 0 and tokens > 0:
            self._clear(worker_id)
            return TransferSample(worker_id, transfers, seconds, tokens, moved)
        if transfers > 0 or tokens > 0:  # one side so far: wait for the other
            self._pending[worker_id] = (transfers, seconds, tokens, moved)
            self._pending_since.setdefault(worker_id, now)
        else:
            self._clear(worker_id)
        return None

    def forget(self, worker_id: str) -> None:
        self._base.pop(worker_id, None)
        self._clear(worker_id)

    def _clear(self, worker_id: str) -> None:
        self._pending.pop(worker_id, None)
        self._pending_since.pop(worker_id, None)


def _restarted(base: TransferTotals, totals: TransferTotals) -> bool:
    starts = (base.process_start, totals.process_start)
    if None not in starts and starts[0] != starts[1]:
        return True
    return totals.transfers < base.transfers or totals.seconds < base.seconds or totals.tokens < base.tokens


class LoadScraper:
    def __init__(
        self,
        *,
        interval_s: float = 0.25,
        timeout_s: float = 1.0,
        stale_after_s: float = 2.0,
        client: httpx.AsyncClient | None = None,
        headers: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_transfers: Callable[[TransferSample], None] | None = None,
        transfer_carry_s: float = 5.0,
        metrics: MetricNames = VLLM_METRICS,
        counted: Callable[[str], int] | None = None,
    ):
        """``counted(worker_id)``: the router's requests in flight there, read as each scrape arrives
        (``ScrapedLoad.counted_at_scrape``); ``on_transfers``: called (on the event loop, never with an exception
        escaping) with each worker's ``TransferSample``; ``transfer_carry_s``: how long a one-sided increase waits for its other side;
        ``metrics``: the metric names of a worker whose engine ``set_targets`` does not name. ``client``: an httpx
        client to fetch the pages with (the caller's, not closed here); without one, the scraper's own aiohttp
        session (``metrics_fetch.py``: a quarter of the CPU per page), sending ``headers`` (a worker key)."""
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.stale_after_s = stale_after_s
        self._fetch: MetricsFetch = HttpxFetch(client) if client is not None else AiohttpFetch(headers=headers)
        self._clock = clock
        self._targets: dict[str, str] = {}
        self._last: dict[str, ScrapedLoad] = {}
        self.version = 0
        """Counts changes to the scraped values (a cached load snapshot is valid while it stays the same)."""
        self._task: asyncio.Task[None] | None = None
        self.on_transfers = on_transfers
        self._transfers = TransferDeltas(carry_s=transfer_carry_s)
        self._default_names = _LoadNames.of(metrics)
        self._names: dict[str, _LoadNames] = {}
        """Per worker: the names its engine publishes (a pool may mix engines)."""
        self.counted = counted

    # -- targets ------------------------------------------------------------------------------------------------------

    def set_targets(self, targets: Mapping[str, str], metrics: Mapping[str, MetricNames] | None = None) -> None:
        """``{worker_id: server_url}`` (the worker's HTTP root; ``/metrics`` is appended) and, per worker, its
        engine's metric names (default: the constructor's). Departed workers' values are dropped; a worker whose URL
        changed starts a new transfer baseline."""
        previous, self._targets = self._targets, dict(targets)
        known: dict[MetricNames, _LoadNames] = {}
        self._names = {}
        for worker_id, names in (metrics or {}).items():
            if names not in known:
                known[names] = _LoadNames.of(names)
            self._names[worker_id] = known[names]
        for gone in set(self._last) - set(self._targets):
            del self._last[gone]
        self.version += 1
        for worker_id, url in previous.items():
            if self._targets.get(worker_id) != url:
                self._transfers.forget(worker_id)

    # -- reading ------------------------------------------------------------------------------------------------------

    def now(self) -> float:
        """The scraper's clock (what staleness is measured against)."""
        return self._clock()

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
                return ScrapedLoad(found.waiting, found.running, found.kv_usage, found.scraped_at, True,
                                   found.generation_tokens, found.counted_at_scrape)
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
        try:
            names = self._names.get(worker_id, self._default_names)
            page = await self._fetch.text(f"{server_url}/{names.path}", timeout_s=self.timeout_s)
            parsed, totals = _parse(page, names)
            if parsed is None:
                raise ValueError("no load metrics on the page")
        except (FetchError, ValueError) as exc:
            previous = self._last.get(worker_id)
            if worker_id in self._targets and (previous is None or not previous.stale):
                logger.debug("load scrape of %s failed: %s", worker_id, exc)
            if worker_id in self._targets:
                base = previous or ScrapedLoad()
                self._last[worker_id] = ScrapedLoad(
                    base.waiting, base.running, base.kv_usage, base.scraped_at, True, base.generation_tokens,
                    base.counted_at_scrape,
                )
                self.version += 1
            return
        if worker_id not in self._targets:  # removed while the scrape was in flight
            return
        now = self._clock()
        counted = None if self.counted is None else float(self.counted(worker_id))
        self._last[worker_id] = ScrapedLoad(parsed.waiting, parsed.running, parsed.kv_usage, now, False,
                                            parsed.generation_tokens, counted)
        self.version += 1
        if self._targets[worker_id] != server_url:  # moved to another URL meanwhile: not the same counters
            return
        sample = self._transfers.update(worker_id, totals, now)
        if sample is not None and self.on_transfers is not None:
            try:
                self.on_transfers(sample)
            except Exception:  # an observer's bug must not stop load collection
                logger.exception("transfer observer failed on %s", sample)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="kv-load-scraper")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel([task])
        await self._fetch.aclose()

    async def _run(self) -> None:
        while True:
            started = self._clock()
            try:
                await self.scrape_once()
            except Exception:  # never let load collection die
                logger.exception("load scrape round failed")
            await asyncio.sleep(max(0.0, self.interval_s - (self._clock() - started)))

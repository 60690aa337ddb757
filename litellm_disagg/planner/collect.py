"""Collecting the planner's signals: discovery, the workers' ``/metrics``, the proxy's latency histograms.

    SignalCollector.collect(now, workers, pending) -> ClusterSignals

    per worker   role, state, launch's roles       discovery (``RuntimeConfig``)
                 pending role                      the loop's own role requests not yet published (``pending``)
                 running, waiting, KV usage         its engine's ``/metrics`` (``LoadScraper``, the engine's names)
                 queued prefill tokens              in the proxy: ``Accounting``; standalone: unknown (0)
    per model    TTFT, ITL percentiles              ``LatencySource``: this process's histograms (in the proxy) or
                                                    the proxies' ``/metrics`` pages (standalone)
                 prefill time                       the same sources: a remote prefill's route time (arrival to the
                                                    prefill's answer) and a local prefill's TTFT, added up
                 KV transfer time                   the workers' NIXL counters (the load scraper's transfer samples)
                 prefill rate                       in the proxy with KV routing: the remote-or-local decision's
                                                    fitted prefill line; otherwise unknown (queue term skipped)
                 prompt tokens per second           the same sources: the proxy's prompt-token counter, role
                                                    ``decode`` only (each request once; KV routing on), its increase
                                                    over the window, per proxy (``CounterWindow``)
                 output tokens per second           the workers' generation-token counters (the load scraper), their
                                                    increase over the window, per worker (``CounterWindow``)

One scrape round per step (no background task), so a step's signals are one instant's. A worker whose page did not
answer reads as unknown load (``None``), never as idle.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import httpx

from litellm_disagg.engines import engine_for
from litellm_disagg.observability import metrics as m
from litellm_disagg.planner.settings import PlannerSettings
from litellm_disagg.planner.signals import ClusterSignals, LatencyWindow, ModelSignals, WorkerSignals
from litellm_disagg.planner.window import (
    CounterWindow,
    HistogramTotals,
    HistogramWindow,
    LabelFilter,
    MeanWindow,
    SampleLike,
    add_totals,
    counter_totals,
    histogram_totals,
    page_samples,
    registry_samples,
)
from litellm_disagg.routing.kv.load_scraper import LoadScraper, TransferSample
from litellm_disagg.runtime_config import RuntimeConfig, WorkerRole

logger = logging.getLogger(__name__)

TTFT_METRIC = "litellm_disagg_time_to_first_token_seconds"
ITL_METRIC = "litellm_disagg_inter_token_latency_seconds"
ROUTE_METRIC = "litellm_disagg_route_seconds"

SCRAPE_TIMEOUT_S = 2.0
"""How long the planner waits for a worker's ``/metrics`` page, whatever its ``interval_s``. A step waits for its
scrape round, so a slow page makes that step late rather than its load unknown: the planner's estimates need the
workers' generation counters read in every window, and an engine's API process on a starved CPU answers its page in
more than a short interval (real CPU workers in CI: counters unread for 12-20 s with a 0.5 s timeout)."""
PROMPT_TOKENS_METRIC = "litellm_disagg_arrived_prompt_tokens"
"""A counter (``_total`` on the page): per model, the prompt tokens of each request when its workers are chosen, before
any prefill (the demand). The per-worker ``litellm_disagg_prompt_tokens_total`` counts a request once its prefill is
over, so under a prefill backlog it gives the prefill pool's throughput, not what arrives."""

REMOTE_PREFILL: LabelFilter = ("mode", frozenset({"disaggregated"}))
"""Requests prefilled on a prefill worker: their route time runs from arrival to the prefill's answer."""
LOCAL_PREFILL: LabelFilter = ("mode", frozenset({"local_prefill", "aggregated"}))
"""Requests prefilled by the worker that decodes them: their TTFT is their prefill time."""
THIS_PROCESS = ""
"""The source key of this process's own counters (``ProxyTotals.prompt_tokens``)."""


@dataclass(frozen=True)
class ProxyTotals:
    """One model's cumulative figures from the proxies' own metrics: latency histograms (None: none recorded yet) and
    the prompt-token counter."""

    ttft: HistogramTotals | None = None
    itl: HistogramTotals | None = None
    prefill: HistogramTotals | None = None
    """Prefill time (``ModelSignals.prefill_time``): the route-time histogram of the requests prefilled remotely
    (arrival to the prefill's answer, streamed or not) plus the TTFT histogram of those prefilled locally. Both
    histograms have the same buckets (``metrics.TTFT_BUCKETS``), so they add up bucket by bucket. Unlike the TTFT it
    holds no decode-side wait (a pull queued for KV blocks on a full decode worker)."""
    prompt_tokens: Mapping[str, float] = field(default_factory=dict)
    """Per proxy (its ``/metrics`` URL; ``THIS_PROCESS`` in the proxy), the prompt tokens of the requests that arrived
    there (``litellm_disagg_arrived_prompt_tokens_total``: each request once, when its workers are chosen). Empty when
    none was counted (the proxy counts them with KV routing only)."""


class LatencySource(Protocol):
    async def read(self) -> Mapping[str, ProxyTotals]:
        """Per served model, the cumulative TTFT, ITL and prefill-time histograms and prompt tokens now."""
        ...


def proxy_totals(samples: Sequence[SampleLike], source: str = THIS_PROCESS) -> dict[str, ProxyTotals]:
    """Per model, the three histograms and the prompt tokens (keyed ``source``), from samples of the TTFT, ITL,
    route-time and prompt-token metrics (a page's or this process's registry's)."""
    ttft = histogram_totals(samples, TTFT_METRIC)
    itl = histogram_totals(samples, ITL_METRIC)
    remote = histogram_totals(samples, ROUTE_METRIC, where=REMOTE_PREFILL)
    local = histogram_totals(samples, TTFT_METRIC, where=LOCAL_PREFILL)
    prompts = counter_totals(samples, PROMPT_TOKENS_METRIC)
    return {model: ProxyTotals(ttft.get(model), itl.get(model), add_totals(remote.get(model), local.get(model)),
                               {source: prompts[model]} if model in prompts else {})
            for model in set(ttft) | set(itl) | set(remote) | set(prompts)}


class InProcessLatency:
    """The proxy's own histograms and prompt-token counter (``observability/metrics.py``), read from this process's
    registry."""

    async def read(self) -> Mapping[str, ProxyTotals]:
        return proxy_totals([s for metric in (m.TTFT, m.ITL, m.ROUTE, m.ARRIVED_PROMPT_TOKENS)
                             for s in registry_samples(metric)])


class ProxyPagesLatency:
    """The proxies' ``/metrics`` pages (standalone planner): each page's histograms, added up over the proxies, and
    each page's prompt tokens, kept per proxy (a restarted proxy's counter starts again from zero)."""

    def __init__(self, urls: Sequence[str], *, headers: Mapping[str, str] | None = None, timeout_s: float = 5.0,
                 client: httpx.AsyncClient | None = None):
        self.urls = tuple(urls)
        self._headers = dict(headers or {})
        self._timeout_s = timeout_s
        self._client = client
        self._own = client is None

    async def read(self) -> Mapping[str, ProxyTotals]:
        client = self._http()
        pages = await asyncio.gather(*(self._page(client, url) for url in self.urls))
        merged: dict[str, ProxyTotals] = {}
        for url, page in zip(self.urls, pages, strict=True):
            if page is None:
                continue
            samples = page_samples(page, (TTFT_METRIC, ITL_METRIC, ROUTE_METRIC), (PROMPT_TOKENS_METRIC,))
            for model, totals in proxy_totals(samples, url).items():
                before = merged.get(model, ProxyTotals())
                merged[model] = ProxyTotals(add_totals(before.ttft, totals.ttft), add_totals(before.itl, totals.itl),
                                            add_totals(before.prefill, totals.prefill),
                                            {**before.prompt_tokens, **totals.prompt_tokens})
        return merged

    async def _page(self, client: httpx.AsyncClient, url: str) -> str | None:
        try:
            response = await client.get(url, headers=self._headers, timeout=self._timeout_s, follow_redirects=True)
            response.raise_for_status()
            return response.text
        except httpx.HTTPError as exc:
            logger.warning("planner: proxy metrics page %s unreadable: %s", url, exc)
            return None

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient()
        return self._client

    async def aclose(self) -> None:
        if self._own and self._client is not None:
            await self._client.aclose()
            self._client = None


class SignalCollector:
    """Builds one ``ClusterSignals`` per planner step (see the module docstring)."""

    def __init__(
        self,
        settings: PlannerSettings,
        latency: LatencySource,
        *,
        scraper: LoadScraper | None = None,
        queued_tokens: Callable[[str], int] | None = None,
        prefill_rate: Callable[[], float | None] | None = None,
    ):
        self.settings = settings
        self.latency = latency
        self.scraper = scraper or LoadScraper(interval_s=settings.interval_s, timeout_s=SCRAPE_TIMEOUT_S,
                                              stale_after_s=max(SCRAPE_TIMEOUT_S, 2 * settings.interval_s))
        self.scraper.on_transfers = self._on_transfer
        self._queued_tokens = queued_tokens
        self._prefill_rate = prefill_rate
        self._ttft: dict[str, HistogramWindow] = {}
        self._itl: dict[str, HistogramWindow] = {}
        self._prefill: dict[str, HistogramWindow] = {}
        self._transfer: dict[str, MeanWindow] = {}
        self._prompted: dict[str, CounterWindow] = {}
        self._prompted_reach: dict[str, CounterWindow] = {}
        """Per model, the same prompt counter over ``window_max_s`` (where it reaches past ``window_s``)."""
        self._generated: dict[str, CounterWindow] = {}
        self._model_of: dict[str, str] = {}
        self._layouts: dict[str, frozenset[tuple[str, WorkerRole]]] = {}
        self._layout_since: dict[str, float] = {}
        """Per model, when its (worker, role) layout last changed: a latency window never reaches back before it."""
        self._now = 0.0

    def _on_transfer(self, sample: TransferSample) -> None:
        model = self._model_of.get(sample.worker_id)
        if model is not None and sample.transfers > 0:
            # A request's KV moves as one handle per tensor-parallel rank, in parallel: per-handle mean is the
            # request's transfer time (``load_scraper``'s approximations).
            self._transfer.setdefault(model, MeanWindow(self.settings.window_s)).add(
                self._now, sample.transfers, sample.seconds)

    async def collect(self, now: float, workers: Sequence[RuntimeConfig],
                      pending: Mapping[str, WorkerRole]) -> ClusterSignals:
        self._now = now
        self._model_of = {w.worker_id: w.model for w in workers}
        self.scraper.set_targets({w.worker_id: w.server_url for w in workers},
                                 metrics={w.worker_id: engine_for(w).adapter.metrics for w in workers})
        await self.scraper.scrape_once()
        # read this round's values now: the proxies' pages come next (up to their own timeout), and a value looked up
        # after them would read as stale, the generation counter skipped, though this very step scraped it
        loads = self.scraper.lookup()
        latency = await self.latency.read()
        window, q = self.settings.window_s, self.settings.quantile
        reach = self.settings.window_max_s
        self._note_layouts(now, workers)
        for model, totals in latency.items():
            if totals.ttft is not None:
                self._ttft.setdefault(model, HistogramWindow(window, reach)).add(now, totals.ttft)
            if totals.itl is not None:
                self._itl.setdefault(model, HistogramWindow(window, reach)).add(now, totals.itl)
            if totals.prefill is not None:
                self._prefill.setdefault(model, HistogramWindow(window, reach)).add(now, totals.prefill)
            if totals.prompt_tokens:
                self._prompted.setdefault(model, CounterWindow(window)).add(now, totals.prompt_tokens)
                if reach is not None and reach > window:
                    self._prompted_reach.setdefault(model, CounterWindow(reach)).add(now, totals.prompt_tokens)
        rate = self._prefill_rate() if self._prefill_rate is not None else None
        by_model: dict[str, list[WorkerSignals]] = {}
        generated: dict[str, dict[str, float]] = {}
        for worker in workers:
            load = loads(worker.worker_id)
            known = not load.stale
            if known and load.generation_tokens is not None:
                generated.setdefault(worker.model, {})[worker.worker_id] = load.generation_tokens
            by_model.setdefault(worker.model, []).append(WorkerSignals(
                worker_id=worker.worker_id,
                model=worker.model,
                role=worker.role,
                state=worker.state,
                pending_role=pending.get(worker.worker_id),
                running_requests=int(load.running) if known else 0,
                waiting_requests=int(load.waiting) if known else 0,
                queued_prefill_tokens=self._queued_tokens(worker.worker_id) if self._queued_tokens else 0,
                max_running_requests=self.settings.max_batch,
                kv_usage=load.kv_usage if known else None,
                servable_roles=frozenset((worker.role, *worker.allowed_roles)),
            ))
        for model, counters in generated.items():
            self._generated.setdefault(model, CounterWindow(window)).add(now, counters)
        for model, counter in self._generated.items():
            counter.retain([w.worker_id for w in by_model.get(model, ())])
        models = []
        for model in sorted(set(by_model) | set(self._ttft) | set(self._itl)):
            if model not in by_model:
                continue
            ttft, itl, transfer = self._ttft.get(model), self._itl.get(model), self._transfer.get(model)
            prefill = self._prefill.get(model)
            prompted, generating = self._prompted.get(model), self._generated.get(model)
            prompted_reach = self._prompted_reach.get(model)
            fewest, since = self.settings.min_samples, self._layout_since.get(model)
            models.append(ModelSignals(
                model,
                tuple(by_model[model]),
                ttft.window(q, min_samples=fewest, not_before=since) if ttft else LatencyWindow(),
                itl.window(q, min_samples=fewest, not_before=since) if itl else LatencyWindow(),
                transfer.window(now) if transfer else LatencyWindow(),
                rate,
                prefill.window(q, min_samples=fewest, not_before=since) if prefill else LatencyWindow(),
                prompt_tokens_per_s=prompted.rate(now) if prompted else None,
                output_tokens_per_s=generating.rate(now) if generating else None,
                recent_prompt_tokens_per_s=prompted_reach.rate(now) if prompted_reach else None,
            ))
        return ClusterSignals(tuple(models))

    def _note_layouts(self, now: float, workers: Sequence[RuntimeConfig]) -> None:
        """Record, per model, when the published (worker, role) layout last changed (first seen: now)."""
        layouts: dict[str, set[tuple[str, WorkerRole]]] = {}
        for worker in workers:
            layouts.setdefault(worker.model, set()).add((worker.worker_id, worker.role))
        for model, pairs in layouts.items():
            layout = frozenset(pairs)
            if self._layouts.get(model) != layout:
                self._layouts[model] = layout
                self._layout_since[model] = now

    async def aclose(self) -> None:
        await self.scraper.stop()
        close = getattr(self.latency, "aclose", None)
        if close is not None:
            await close()

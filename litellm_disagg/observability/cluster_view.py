"""What ``litellm-disagg top`` shows, read once per frame: discovery's workers, each worker's own ``/metrics`` (under
its engine's ``MetricNames``), and the proxy's ``/metrics`` (``observability/metrics.py``) when given. No drawing here
(``top.py`` draws).

Rates and hit ratios are over the time since the previous frame (the first frame: since the worker started);
latency percentiles are read from the proxy's histograms the same way (bucket counts since the previous frame, or all
of them when none changed, interpolated within a bucket as Prometheus's ``histogram_quantile`` does).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import httpx

from litellm_disagg.discovery.registry import Registry
from litellm_disagg.engines import engine_for, prom_text
from litellm_disagg.engines.base import MetricNames
from litellm_disagg.runtime_config import RuntimeConfig

QUANTILES = (0.5, 0.95, 0.99)


@dataclass(frozen=True)
class ProxyMetricNames:
    """Where the proxy's ``/metrics`` reports what ``top`` shows (``observability/metrics.py`` defines them; a test
    checks that the two agree)."""

    requests: str = "litellm_disagg_requests_total"
    """Counter of routed requests (its rate is the request rate)."""
    ttft: str = "litellm_disagg_time_to_first_token_seconds"
    itl: str = "litellm_disagg_inter_token_latency_seconds"
    planner_enabled: str = "litellm_disagg_planner_enabled"
    """1 while a planner runs (absent or 0: no planner)."""
    planner_desired: str = "litellm_disagg_planner_desired_workers"
    planner_decisions: str = "litellm_disagg_planner_decisions_total"


@dataclass(frozen=True)
class WorkerView:
    config: RuntimeConfig
    reachable: bool
    running: int | None = None
    waiting: int | None = None
    finished: int | None = None
    kv_usage: float | None = None
    """0..1."""
    prefix_hit_rate: float | None = None
    """Share of looked-up prompt tokens found in the prefix cache, 0..1."""
    finished_per_s: float | None = None


@dataclass(frozen=True)
class ProxyView:
    reachable: bool
    request_rate: float | None = None
    ttft: Mapping[float, float] = field(default_factory=dict)
    """Quantile -> seconds; empty: no data."""
    itl: Mapping[float, float] = field(default_factory=dict)
    planner: tuple[str, ...] | None = None
    """The planner's desired pool sizes and actions, one line each; None: the proxy runs no planner."""


@dataclass(frozen=True)
class ClusterView:
    taken_at: float
    workers: tuple[WorkerView, ...]
    proxy: ProxyView | None
    """None: no ``--metrics-url`` given."""
    discovery_error: str | None = None


@dataclass(frozen=True)
class _Counters:
    at: float
    values: Mapping[str, float]


class ClusterWatcher:
    """Reads one frame at a time; keeps the previous frame's counters for rates."""

    def __init__(
        self,
        registry: Registry,
        client: httpx.AsyncClient,
        *,
        metrics_url: str | None = None,
        metrics_key: str | None = None,
        proxy_names: ProxyMetricNames | None = None,
        timeout_s: float = 2.0,
    ):
        self.registry = registry
        self.client = client
        self.metrics_url = metrics_url
        self._metrics_headers = {"Authorization": f"Bearer {metrics_key}"} if metrics_key else {}
        """Sent to the proxy's page only (LiteLLM's /metrics asks for a key), never to workers."""
        self.proxy_names = proxy_names or ProxyMetricNames()
        self.timeout_s = timeout_s
        self._previous: dict[str, _Counters] = {}

    async def sample(self) -> ClusterView:
        error: str | None = None
        configs: Sequence[RuntimeConfig] = ()
        try:
            configs = await self.registry.snapshot()
        except Exception as exc:  # discovery down: say so, keep drawing
            error = f"{type(exc).__name__}: {exc}"
        configs = sorted(configs, key=lambda c: (c.model, c.role.value, c.worker_id))
        views = await asyncio.gather(*(self._worker(c) for c in configs))
        proxy = await self._proxy(self.metrics_url) if self.metrics_url else None
        live = {c.worker_id for c in configs} | {"proxy"}
        self._previous = {k: v for k, v in self._previous.items() if k in live}
        return ClusterView(time.time(), tuple(views), proxy, error)

    async def _page(self, url: str, headers: dict[str, str] | None = None) -> str | None:
        try:
            # LiteLLM's /metrics answers 307 to /metrics/ (httpx keeps the key on a same-origin redirect).
            response = await self.client.get(url, headers=headers, timeout=self.timeout_s, follow_redirects=True)
            response.raise_for_status()
        except httpx.HTTPError:
            return None
        return response.text

    async def _worker(self, config: RuntimeConfig) -> WorkerView:
        text = await self._page(f"{config.server_url}/metrics")
        if text is None:
            return WorkerView(config, reachable=False)
        read = _read_worker(text, engine_for(config).adapter.metrics)
        now = time.monotonic()
        before = self._previous.get(config.worker_id)
        counters = {k: read[k] for k in ("hits", "queries", "finished") if k in read}
        self._previous[config.worker_id] = _Counters(now, counters)
        per_s = None
        if before is not None and "finished" in counters:
            per_s = _delta(counters, before, "finished") / max(now - before.at, 1e-6)
        return WorkerView(
            config,
            reachable=True,
            running=_int(read.get("running")),
            waiting=_int(read.get("waiting")),
            finished=_int(read.get("finished")),
            kv_usage=read.get("kv_usage"),
            prefix_hit_rate=_ratio(_delta(counters, before, "hits"), _delta(counters, before, "queries")),
            finished_per_s=per_s,
        )

    async def _proxy(self, url: str) -> ProxyView:
        text = await self._page(url, self._metrics_headers)
        if text is None:
            return ProxyView(reachable=False)
        n = self.proxy_names
        now = time.monotonic()
        before = self._previous.get("proxy")
        counters: dict[str, float] = {}
        buckets: dict[str, dict[float, float]] = {n.ttft: {}, n.itl: {}}
        planner: list[str] = []
        planner_on = False
        for sample in prom_text.samples(text):
            name = sample.name
            if name == n.requests:
                counters["requests"] = counters.get("requests", 0.0) + sample.value
            elif name.endswith("_bucket") and name[: -len("_bucket")] in buckets:
                le = _le(sample.labels.get("le"))
                if le is not None:
                    series = buckets[name[: -len("_bucket")]]
                    series[le] = series.get(le, 0.0) + sample.value
            elif name == n.planner_enabled:
                planner_on = planner_on or sample.value > 0
            elif name in (n.planner_desired, n.planner_decisions) and sample.value == sample.value:  # not NaN
                what = "wants" if name == n.planner_desired else "did"
                labels = " ".join(sample.labels[k] for k in sorted(sample.labels))
                planner.append(f"{what} {labels}: {sample.value:g}")
        for name, series in buckets.items():
            for le, count in series.items():
                counters[f"{name}|{le!r}"] = count
        self._previous["proxy"] = _Counters(now, counters)
        rate = None
        if before is not None and "requests" in counters:
            rate = _delta(counters, before, "requests") / max(now - before.at, 1e-6)
        return ProxyView(
            reachable=True,
            request_rate=rate,
            ttft=quantiles(_window(buckets[n.ttft], before, n.ttft)),
            itl=quantiles(_window(buckets[n.itl], before, n.itl)),
            planner=tuple(planner) if planner_on else None,
        )


def _read_worker(text: str, names: MetricNames) -> dict[str, float]:
    wanted = [names.requests_running, names.requests_waiting, names.requests_finished, names.kv_cache_usage]
    wanted += [n for n in (names.kv_cache_usage_fallback, names.prefix_cache_hits, names.prefix_cache_queries) if n]
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for name, _, value in prom_text.samples(text, prom_text.Wanted(wanted, labelled=())):
        sums[name] = sums.get(name, 0.0) + value
        counts[name] = counts.get(name, 0) + 1
    out: dict[str, float] = {}
    for key, name in (
        ("running", names.requests_running),
        ("waiting", names.requests_waiting),
        ("finished", names.requests_finished),
        ("hits", names.prefix_cache_hits),
        ("queries", names.prefix_cache_queries),
    ):
        if name is not None and name in sums:
            out[key] = sums[name]
    for name in (names.kv_cache_usage, names.kv_cache_usage_fallback):
        if name is not None and name in sums:  # averaged over engine cores
            out["kv_usage"] = sums[name] / counts[name]
            break
    return out


def _delta(now: Mapping[str, float], before: _Counters | None, key: str) -> float:
    if key not in now:
        return 0.0
    change = now[key] - (before.values.get(key, 0.0) if before is not None else 0.0)
    return now[key] if change < 0 else change  # the engine restarted (counters reset): count from zero


def _ratio(part: float, whole: float) -> float | None:
    return part / whole if whole > 0 else None


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


def _le(raw: str | None) -> float | None:
    try:
        return float(raw) if raw is not None else None
    except ValueError:
        return None


def _window(series: Mapping[float, float], before: _Counters | None, name: str) -> dict[float, float]:
    """Cumulative bucket counts since the previous frame (all of them when none changed: show something)."""
    if before is None:
        return dict(series)
    delta = {le: max(0.0, count - before.values.get(f"{name}|{le!r}", 0.0)) for le, count in series.items()}
    return delta if any(delta.values()) else dict(series)


def quantiles(buckets: Mapping[float, float]) -> dict[float, float]:
    """``QUANTILES`` of a cumulative histogram (upper bound -> count), interpolated linearly within a bucket; a
    quantile in the ``+Inf`` bucket is the last finite bound."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return {}
    total = buckets[bounds[-1]]
    out: dict[float, float] = {}
    for q in QUANTILES:
        rank = q * total
        lower_bound, lower_count = 0.0, 0.0
        for bound in bounds:
            count = buckets[bound]
            if count >= rank and count > 0:
                if bound == float("inf"):
                    out[q] = lower_bound
                else:
                    width = count - lower_count
                    out[q] = lower_bound + (bound - lower_bound) * ((rank - lower_count) / width if width > 0 else 1.0)
                break
            lower_bound, lower_count = bound, count
    return out

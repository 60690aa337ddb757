"""``GET /metrics``: an engine's counters in Prometheus text format, under vLLM's metric names and labels.

Every sample carries ``model_name`` and ``engine`` (vLLM's engine index, "0"). What the router and the worker wrapper
read: ``vllm:num_requests_running`` / ``_waiting``, ``vllm:request_success_total``, and ``vllm:cache_config_info``
(its ``block_size`` and ``num_gpu_blocks`` labels). A worker standing in for SGLang or TensorRT-LLM also reports the
running, waiting, KV-use and finished figures under that engine's names (``engines/<name>/metrics.py``). Each worker has its own collector registry, so many simulated
workers can live in one process.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from litellm_disagg.engines import get_engine
from litellm_disagg.sim.engine import SimEngine

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
FINISH_REASONS = ("stop", "length", "abort")


class EngineCollector(Collector):
    def __init__(self, engine: SimEngine):
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        e = self.engine
        s = e.stats
        base = ["model_name", "engine"]
        ids = [e.settings.model, "0"]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=base)
            g.add_metric(ids, value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(name, doc, labels=base)
            c.add_metric(ids, value)
            return c

        names = get_engine(e.settings.engine_name).adapter.metrics
        if e.settings.engine_name != "vllm":  # the core figures under the engine's own names too
            yield gauge(names.requests_running, "Requests running.", e.scheduler.num_running)
            yield gauge(names.requests_waiting, "Requests waiting.", e.scheduler.num_waiting)
            yield gauge(names.kv_cache_usage, "KV cache usage, 0..1.", e.pool.usage)
            yield counter(names.requests_finished.removesuffix("_total"), "Requests finished.", s.finished)
        yield gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches.", e.scheduler.num_running
        )
        yield gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", e.scheduler.num_waiting)
        yield gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", e.pool.usage)
        yield counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            s.prefix_cache_queries,
        )
        yield counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", s.prefix_cache_hits
        )
        by_source = CounterMetricFamily(
            "vllm:prompt_tokens_by_source", "Number of prompt tokens by source.", labels=[*base, "source"]
        )
        by_source.add_metric([*ids, "local_compute"], s.prompt_tokens_local_compute)
        by_source.add_metric([*ids, "local_cache_hit"], s.prompt_tokens_local_cache_hit)
        by_source.add_metric([*ids, "external_kv_transfer"], s.prompt_tokens_external_kv_transfer)
        yield by_source
        yield counter(
            "vllm:prompt_tokens",
            "Number of prefill tokens processed.",
            s.prompt_tokens_local_compute + s.prompt_tokens_local_cache_hit + s.prompt_tokens_external_kv_transfer,
        )
        yield counter("vllm:generation_tokens", "Number of generation tokens processed.", s.generation_tokens)
        success = CounterMetricFamily(
            "vllm:request_success", "Count of successfully processed requests.", labels=[*base, "finished_reason"]
        )
        for reason in FINISH_REASONS:
            success.add_metric([*ids, reason], s.request_success.get(reason, 0))
        yield success
        yield counter("vllm:num_preemptions", "Cumulative number of preemptions from the engine.", s.num_preemptions)
        info = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            labels=[*base, "block_size", "num_gpu_blocks", "enable_prefix_caching"],
        )
        cfg = e.settings.engine
        info.add_metric([*ids, str(cfg.block_size), str(cfg.num_gpu_blocks), str(cfg.enable_prefix_caching)], 1.0)
        yield info
        yield counter(
            "vllm:nixl_num_failed_transfers", "Number of failed NIXL KV Cache transfers.", s.nixl_failed_transfers
        )
        xfer = HistogramMetricFamily(
            "vllm:nixl_xfer_time_seconds", "Histogram of transfer duration for NIXL KV Cache transfers.", labels=base
        )
        xfer.add_metric(ids, s.nixl_xfer_time.cumulative(), s.nixl_xfer_time.total)
        yield xfer
        moved = HistogramMetricFamily(
            "vllm:nixl_bytes_transferred", "Histogram of bytes transferred per NIXL KV Cache transfers.", labels=base
        )
        moved.add_metric(ids, [("+Inf", s.nixl_transfers)], s.nixl_bytes_transferred)  # the sum and count only
        yield moved


def registry_for(engine: SimEngine) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineCollector(engine))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)

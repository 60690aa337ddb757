"""Where SGLang's ``/metrics`` page (``--enable-metrics``) reports the figures litellm-disagg reads.

Names from ``python/sglang/srt/metrics/collector.py`` (``SchedulerMetricsCollector``: gauges with ``model_name`` and
rank labels; ``TokenizerMetricsCollector``: the request and token counters). SGLang reports KV use as
``sglang:token_usage`` (share of the KV pool's token slots in use, 0..1), has no cache-config info gauge (the block
size and capacity come from the worker's ``RuntimeConfig``), no per-source prompt token counter and no transfer
histogram on the decode side: those stay None, and the readers go without.
"""

from __future__ import annotations

from typing import Final

from litellm_disagg.engines.base import MetricNames

SGLANG_METRICS: Final = MetricNames(
    requests_running="sglang:num_running_reqs",
    requests_waiting="sglang:num_queue_reqs",
    requests_finished="sglang:num_requests_total",
    kv_cache_usage="sglang:token_usage",
    prompt_tokens="sglang:prompt_tokens_total",
    unreported_block_size=1,
    generation_tokens="sglang:generation_tokens_total",
)

"""Where ``trtllm-serve`` reports the figures litellm-disagg reads: Prometheus text at ``/prometheus/metrics``
(not ``/metrics``, which is JSON iteration stats), ``trtllm_`` names (``tensorrt_llm/metrics/collector.py``).

The request and token counters come with ``return_perf_metrics``; the gauges (running, waiting, KV use) also need
``enable_iter_perf_stats`` (both set by ``launch``). No cache-config info, no per-source prompt tokens, no transfer
histogram: None.
"""

from __future__ import annotations

from typing import Final

from litellm_disagg.engines.base import MetricNames

TRTLLM_METRICS: Final = MetricNames(
    requests_running="trtllm_num_requests_running",
    requests_waiting="trtllm_num_requests_waiting",
    requests_finished="trtllm_request_success_total",
    kv_cache_usage="trtllm_kv_cache_utilization",
    prompt_tokens="trtllm_prompt_tokens_total",
    unreported_block_size=32,
    generation_tokens="trtllm_generation_tokens_total",
    path="prometheus/metrics",
)

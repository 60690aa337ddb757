"""Where vLLM's ``/metrics`` page reports the figures litellm-disagg reads (vLLM v1, 0.11 to 0.32).

Gauges and counters carry ``engine`` and ``model_name`` labels (one set per engine core); the NIXL figures are the
decode side's (the worker that pulled the KV). ``vllm:gpu_cache_usage_perc`` is the name releases before
``vllm:kv_cache_usage_perc`` used.
"""

from __future__ import annotations

from typing import Final

from litellm_disagg.engines.base import MetricNames

VLLM_METRICS: Final = MetricNames(
    requests_running="vllm:num_requests_running",
    requests_waiting="vllm:num_requests_waiting",
    requests_finished="vllm:request_success_total",
    kv_cache_usage="vllm:kv_cache_usage_perc",
    kv_cache_usage_fallback="vllm:gpu_cache_usage_perc",
    cache_config_info="vllm:cache_config_info",
    block_size_label="block_size",
    capacity_blocks_label="num_gpu_blocks",  # on CPU, vLLM reports its CPU KV blocks under this label too
    prefix_cache_queries="vllm:prefix_cache_queries_total",
    prefix_cache_hits="vllm:prefix_cache_hits_total",
    prompt_tokens="vllm:prompt_tokens_total",
    generation_tokens="vllm:generation_tokens_total",
    prompt_tokens_by_source="vllm:prompt_tokens_by_source_total",
    source_label="source",
    transferred_source="external_kv_transfer",
    transfer_time="vllm:nixl_xfer_time_seconds",
    transfer_bytes="vllm:nixl_bytes_transferred",
    transfer_failures="vllm:nixl_num_failed_transfers_total",
)

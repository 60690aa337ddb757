"""What a real vLLM worker's own ``/metrics`` page says it served (tests on real vLLM CPU workers)."""

from __future__ import annotations

from .net import metric
from .procs import WorkerProc

PROMPT_TOKENS_BY_SOURCE = "vllm:prompt_tokens_by_source_total"
MAX_TOKENS_ONE = ("vllm:request_params_max_tokens_bucket", {"le": "1.0"})


def external_tokens(worker: WorkerProc) -> float:
    """Prompt tokens whose KV came by transfer (a decode worker's pulls)."""
    return metric(worker.url, PROMPT_TOKENS_BY_SOURCE, source="external_kv_transfer")


def local_tokens(worker: WorkerProc) -> float:
    """Prompt tokens the worker computed itself."""
    return metric(worker.url, PROMPT_TOKENS_BY_SOURCE, source="local_compute")


def prefills_served(worker: WorkerProc) -> float:
    """Requests that asked for at most one token: the prefill half of a disaggregated request."""
    name, labels = MAX_TOKENS_ONE
    return metric(worker.url, name, **labels)


def generations_served(worker: WorkerProc) -> float:
    """Requests that asked for more than one token: decodes (or aggregated requests)."""
    return metric(worker.url, "vllm:request_params_max_tokens_count") - prefills_served(worker)


def requests_in_engine(worker: WorkerProc) -> float:
    """Requests the engine holds now, running or waiting. A disaggregated decode waits (for its KV) before it runs,
    and on two busy cores it can wait longer than a short generation runs: a test that needs requests in flight
    watches both gauges, not only ``num_requests_running``."""
    return metric(worker.url, "vllm:num_requests_running") + metric(worker.url, "vllm:num_requests_waiting")


def generated_tokens(worker: WorkerProc) -> float:
    """Tokens the engine generated so far (a counter: unlike the gauges above, a poll cannot miss a short burst)."""
    return metric(worker.url, "vllm:generation_tokens_total")

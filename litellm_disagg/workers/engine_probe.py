"""What a running engine reports about itself, read from its HTTP surface (``/health``, ``/metrics``).

Metric names are the engine's (``MetricNames``, from its adapter). KV capacity and block size come from the labels of
its cache config info (vLLM: ``vllm:cache_config_info`` with ``num_gpu_blocks`` and ``block_size``; on CPU vLLM
reports its CPU KV blocks there too), so what a worker publishes is what its engine actually allocated.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx

from litellm_disagg.engines import prom_text
from litellm_disagg.engines.base import MetricNames


class ProbeError(Exception):
    pass


@dataclass(frozen=True)
class EngineFacts:
    block_size: int
    kv_capacity_blocks: int


@dataclass(frozen=True)
class EngineLoad:
    running: int
    waiting: int
    finished: int
    """Requests the engine has finished since it started (any reason): a change means recent activity."""

    @property
    def idle(self) -> bool:
        return self.running == 0 and self.waiting == 0


async def healthy(client: httpx.AsyncClient, server_url: str) -> bool:
    try:
        return (await client.get(f"{server_url}/health", timeout=2.0)).status_code == 200
    except httpx.HTTPError:
        return False


async def _page(client: httpx.AsyncClient, server_url: str, path: str = "metrics") -> str:
    try:
        response = await client.get(f"{server_url}/{path}", timeout=5.0)
        response.raise_for_status()
    except httpx.HTTPError as exc:
        raise ProbeError(f"cannot read {server_url}/{path}: {exc}") from exc
    return response.text


async def engine_facts(client: httpx.AsyncClient, server_url: str, metrics: MetricNames) -> EngineFacts:
    if metrics.cache_config_info is None:
        if metrics.unreported_block_size is not None:
            return EngineFacts(block_size=metrics.unreported_block_size, kv_capacity_blocks=0)
        raise ProbeError("this engine reports no cache config on /metrics")
    wanted = prom_text.Wanted((metrics.cache_config_info,))
    for sample in prom_text.samples(await _page(client, server_url, metrics.path), wanted):
        try:
            return EngineFacts(
                block_size=int(sample.labels[metrics.block_size_label]),
                kv_capacity_blocks=int(sample.labels[metrics.capacity_blocks_label]),
            )
        except (KeyError, ValueError):
            continue
    raise ProbeError(
        f"{server_url}/metrics has no usable {metrics.cache_config_info} "
        f"({metrics.block_size_label}, {metrics.capacity_blocks_label})"
    )


async def engine_load(client: httpx.AsyncClient, server_url: str, metrics: MetricNames) -> EngineLoad:
    wanted = prom_text.Wanted((metrics.requests_running, metrics.requests_waiting, metrics.requests_finished))
    totals = prom_text.sums(await _page(client, server_url, metrics.path), wanted)
    return EngineLoad(
        running=int(totals.get(metrics.requests_running, 0.0)),
        waiting=int(totals.get(metrics.requests_waiting, 0.0)),
        finished=int(totals.get(metrics.requests_finished, 0.0)),
    )

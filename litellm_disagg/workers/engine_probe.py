"""What a running vLLM engine reports about itself, read from its HTTP surface (``/health``, ``/metrics``).

KV capacity and block size come from ``vllm:cache_config_info`` (labels ``num_gpu_blocks`` and ``block_size``; on CPU
vLLM reports its CPU KV blocks there too), so what a worker publishes is what its engine actually allocated.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families


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


async def _samples(client: httpx.AsyncClient, server_url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    try:
        response = await client.get(f"{server_url}/metrics", timeout=5.0)
        response.raise_for_status()
    except httpx.HTTPError as exc:
        raise ProbeError(f"cannot read {server_url}/metrics: {exc}") from exc
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out


async def engine_facts(client: httpx.AsyncClient, server_url: str) -> EngineFacts:
    samples = await _samples(client, server_url)
    for labels, _ in samples.get("vllm:cache_config_info", []):
        try:
            return EngineFacts(block_size=int(labels["block_size"]), kv_capacity_blocks=int(labels["num_gpu_blocks"]))
        except (KeyError, ValueError):
            continue
    raise ProbeError(f"{server_url}/metrics has no usable vllm:cache_config_info (block_size, num_gpu_blocks)")


async def engine_load(client: httpx.AsyncClient, server_url: str) -> EngineLoad:
    samples = await _samples(client, server_url)

    def total(name: str) -> int:
        return int(sum(value for _, value in samples.get(name, [])))

    return EngineLoad(
        running=total("vllm:num_requests_running"),
        waiting=total("vllm:num_requests_waiting"),
        finished=total("vllm:request_success_total"),
    )

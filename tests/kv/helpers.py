"""Small builders shared by the KV routing tests."""

from __future__ import annotations

from litellm_disagg.routing.kv.load_scraper import ScrapedLoad
from litellm_disagg.routing.pipeline.context import WorkerLoad
from litellm_disagg.runtime_config import RuntimeConfig, VllmNixlTransfer, WorkerRole, WorkerState


def worker(
    worker_id: str,
    *,
    role: WorkerRole = WorkerRole.BOTH,
    block_size: int = 16,
    capacity: int = 1000,
    events: str | None = None,
    model: str = "m",
    port: int = 8000,
    started_at: float = 1.0,
) -> RuntimeConfig:
    return RuntimeConfig(
        worker_id=worker_id,
        model=model,
        role=role,
        base_url=f"http://127.0.0.1:{port}/v1",
        transfer=VllmNixlTransfer(host="127.0.0.1", port=5600),
        kv_capacity_blocks=capacity,
        block_size=block_size,
        kv_events_endpoint=events,
        state=WorkerState.READY,
        started_at=started_at,
    )


def load(
    worker_id: str,
    *,
    capacity: int = 1000,
    inflight: int = 0,
    prefill_tokens: int = 0,
    decode_blocks: int = 0,
    waiting: float = 0,
    running: float = 0,
    kv_usage: float = 0.0,
    stale: bool = False,
) -> WorkerLoad:
    return WorkerLoad(
        worker_id,
        capacity,
        inflight,
        prefill_tokens,
        decode_blocks,
        ScrapedLoad(waiting=waiting, running=running, kv_usage=kv_usage, stale=stale),
    )

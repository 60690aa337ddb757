"""The engine's step loop in (scaled) real time: continuous batching through the real loop, pacing, failures."""

from __future__ import annotations

import asyncio
import time

import pytest

from litellm_disagg.runtime_config import WorkerRole
from litellm_disagg.sim import SimEngine
from litellm_disagg.sim.directory import EngineDirectory
from litellm_disagg.sim.engine import EngineDead
from litellm_disagg.sim.request import RemotePrefill, SimRequest
from litellm_disagg.sim.textgen import completion

from .conftest import fast_settings


def request(engine: SimEngine, i: int, max_tokens: int = 32, **kwargs) -> SimRequest:
    return SimRequest(
        request_id=engine.new_request_id(f"r{i}"),
        prompt_token_ids=[300 + i] * 64,
        max_output_tokens=max_tokens,
        limit_reason="length",
        **kwargs,
    )


async def generate(engine: SimEngine, req: SimRequest) -> list[int]:
    return [t async for delta in engine.add_request(req) for t in delta.token_ids]


@pytest.fixture
async def engine():
    e = SimEngine(fast_settings(max_num_seqs=16), WorkerRole.BOTH, directory=EngineDirectory())
    await e.start()
    yield e
    await e.stop()


async def test_concurrent_requests_batch_and_beat_sequential_throughput(engine):
    # Sequential: one sequence at a time.
    busy0, tokens0 = engine.stats.simulated_busy_s, engine.stats.generation_tokens
    for i in range(3):
        await generate(engine, request(engine, i))
    sequential = (engine.stats.generation_tokens - tokens0) / (engine.stats.simulated_busy_s - busy0)

    # Concurrent: 48 requests, at most 16 running (max_num_seqs), the rest queued and admitted as others finish.
    busy1, tokens1 = engine.stats.simulated_busy_s, engine.stats.generation_tokens
    peak = {"running": 0, "waiting": 0}

    async def watch() -> None:
        while True:
            peak["running"] = max(peak["running"], engine.scheduler.num_running)
            peak["waiting"] = max(peak["waiting"], engine.scheduler.num_waiting)
            await asyncio.sleep(0)

    watcher = asyncio.create_task(watch())
    reqs = [request(engine, 100 + i) for i in range(48)]
    outputs = await asyncio.gather(*(generate(engine, r) for r in reqs))
    watcher.cancel()
    concurrent = (engine.stats.generation_tokens - tokens1) / (engine.stats.simulated_busy_s - busy1)

    assert all(len(o) == 32 for o in outputs)
    for r, out in zip(reqs, outputs, strict=True):
        assert out == completion(r.prompt_token_ids, 32)
    assert peak["running"] == 16 and peak["waiting"] > 0
    assert sequential == pytest.approx(50, rel=0.15)  # the model's batch-1 decode rate
    assert concurrent > 8 * sequential
    assert engine.pool.usage == 0 and engine.idle


async def test_the_loop_never_runs_faster_than_the_model(engine):
    start_wall, start_busy = time.monotonic(), engine.stats.simulated_busy_s
    await generate(engine, request(engine, 1, max_tokens=40))
    wall = time.monotonic() - start_wall
    simulated = engine.stats.simulated_busy_s - start_busy
    assert simulated == pytest.approx(40 / 50, rel=0.05)  # 40 decode steps of a 70B-class model
    assert wall >= engine.timing.wall(simulated) * 0.9


async def test_abort_frees_blocks_and_stop_fails_requests_in_flight():
    engine = SimEngine(fast_settings().with_speedup(5), WorkerRole.BOTH, directory=EngineDirectory())
    await engine.start()
    stream = engine.add_request(request(engine, 1, max_tokens=1000))
    async for _ in stream:
        break
    assert engine.pool.usage > 0
    stream.abort()
    assert engine.pool.usage == 0 and engine.stats.request_success["abort"] == 1
    other = engine.add_request(request(engine, 2, max_tokens=1000))
    await engine.stop()
    with pytest.raises(EngineDead):
        async for _ in other:
            pass
    with pytest.raises(EngineDead):
        engine.add_request(request(engine, 3))


async def test_a_decode_aborted_while_pulling_releases_the_prefill_lease():
    directory = EngineDirectory()
    slow_link = fast_settings(timing={"kv_transfer_latency_s": 200.0})  # 1 s of wall time per pull
    prefill = SimEngine(slow_link, WorkerRole.PREFILL, directory=directory)
    decode = SimEngine(slow_link, WorkerRole.DECODE, directory=directory)
    await prefill.start()
    await decode.start()
    try:
        p_req = request(prefill, 1, max_tokens=1, do_remote_decode=True)
        deltas = [d async for d in prefill.add_request(p_req)]
        params = deltas[-1].kv_transfer_params
        assert params is not None and prefill.scheduler.leases
        remote = RemotePrefill(engine_id=params["remote_engine_id"], request_id=params["remote_request_id"])
        d_req = request(decode, 1, remote=remote)
        stream = decode.add_request(d_req)
        for _ in range(100):
            if decode.scheduler.pulling:
                break
            await asyncio.sleep(0.005)
        assert decode.scheduler.num_waiting == 1 and decode.pool.usage > 0  # blocks allocated, pull under way
        stream.abort()
        await asyncio.sleep(0.05)
        assert not prefill.scheduler.leases and prefill.pool.usage == 0
        assert decode.pool.usage == 0
    finally:
        await prefill.stop()
        await decode.stop()

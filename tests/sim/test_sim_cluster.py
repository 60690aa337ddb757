"""Workers registered like real ones: FileRegistry entries, heartbeats, drain, crash, join; and the command."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from litellm_disagg.discovery.file.registry import FileRegistry
from litellm_disagg.engines.vllm.metrics import VLLM_METRICS
from litellm_disagg.runtime_config import WorkerRole, WorkerState
from litellm_disagg.sim import SimCluster, SimWorkerState
from litellm_disagg.workers import engine_probe

from .conftest import chat_body, fast_settings

TTL = 0.6


@pytest.fixture
def registry(tmp_path):
    return FileRegistry(tmp_path / "registry", ttl_s=TTL, poll_interval_s=0.05)


async def snapshot(registry: FileRegistry) -> dict[str, object]:
    return {c.worker_id: c for c in await registry.snapshot()}


async def wait_for(predicate, timeout: float = 5.0, interval: float = 0.02) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await predicate():
            return
        await asyncio.sleep(interval)
    raise AssertionError("condition not met in time")


async def test_workers_register_like_real_ones_and_stay_alive(registry, client):
    settings = fast_settings(kv_events=True)
    async with SimCluster(registry=registry, settings=settings, heartbeat_interval_s=0.1) as cluster:
        await cluster.start(prefill=2, decode=2, both=1)
        entries = await snapshot(registry)
        assert sorted(entries) == ["sim-both-4", "sim-decode-2", "sim-decode-3", "sim-prefill-0", "sim-prefill-1"]
        assert len({c.transfer.port for c in entries.values()}) == 5
        assert len({c.base_url for c in entries.values()}) == 5
        for worker_id, config in entries.items():
            worker = cluster.get(worker_id)
            assert config.state is WorkerState.READY and config.role is worker.role and config.model == "sim-model"
            assert config.base_url == worker.base_url and config.transfer.host == "127.0.0.1"
            assert config.kv_events_endpoint == worker.kv_events_endpoint
            assert config.kv_events_endpoint.startswith("tcp://127.0.0.1:")
            facts = await engine_probe.engine_facts(client, config.server_url, VLLM_METRICS)  # what a wrapper publishes
            assert (facts.block_size, facts.kv_capacity_blocks) == (config.block_size, config.kv_capacity_blocks)
        await asyncio.sleep(TTL * 2)  # heartbeats keep every entry alive past its TTL
        assert len(await snapshot(registry)) == 5


async def test_drain_waits_for_in_flight_work_then_withdraws(registry, client):
    # A 40-token decode of about 0.4 s and a 0.5 s settle: DRAINING stays published for most of a second, which the
    # 20 ms sampler below sees even on a loaded machine (at 40 ms and 0.05 s the window was under 0.1 s).
    slow = fast_settings().with_speedup(2)
    async with SimCluster(registry=registry, settings=slow, heartbeat_interval_s=0.1) as cluster:
        [worker] = await cluster.start(decode=1)
        request = asyncio.create_task(client.post(f"{worker.base_url}/chat/completions", json=chat_body(max_tokens=40)))
        await wait_for(lambda: _running(client, worker))
        drain = asyncio.create_task(cluster.drain(worker.worker_id, settle_s=0.5))
        await wait_for(lambda: _state_is(registry, worker.worker_id, WorkerState.DRAINING))
        assert not drain.done()
        response = await request
        assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 40
        assert await drain is True
        assert worker.state is SimWorkerState.STOPPED
        assert worker.worker_id not in await snapshot(registry)
        with pytest.raises(httpx.ConnectError):
            await client.get(f"{worker.server_url}/health")


async def test_drain_of_a_prefill_worker_waits_for_its_decode_to_pull(registry, client):
    async with SimCluster(registry=registry, settings=fast_settings(), heartbeat_interval_s=0.1) as cluster:
        p, d = await cluster.start(prefill=1, decode=1)
        body = chat_body(max_tokens=1, kv_transfer_params={"do_remote_decode": True})
        params = (await client.post(f"{p.base_url}/chat/completions", json=body)).json()["kv_transfer_params"]
        drain = asyncio.create_task(cluster.drain(p.worker_id))
        await asyncio.sleep(0.1)
        assert not drain.done()  # the prefilled blocks still wait for their decode
        await client.post(f"{d.base_url}/chat/completions", json=chat_body(kv_transfer_params=params))
        assert await asyncio.wait_for(drain, 30) is True
        assert d.engine.stats.prompt_tokens_external_kv_transfer > 0


async def test_crash_drops_connections_and_leaves_the_entry_to_age_out(registry, client):
    slow = fast_settings().with_speedup(20)
    async with SimCluster(registry=registry, settings=slow, heartbeat_interval_s=0.1) as cluster:
        victim, survivor = await cluster.start(decode=2)
        received: list[str] = []

        async def stream() -> None:
            async with client.stream(
                "POST", f"{victim.base_url}/chat/completions", json=chat_body(max_tokens=2000, stream=True)
            ) as r:
                async for line in r.aiter_lines():
                    received.append(line)

        streaming = asyncio.create_task(stream())
        await wait_for(lambda: _true(len(received) > 2))
        await cluster.crash(victim.worker_id)
        with pytest.raises(httpx.HTTPError):
            await streaming
        assert "data: [DONE]" not in received
        assert victim.state is SimWorkerState.CRASHED
        with pytest.raises(httpx.ConnectError):
            await client.get(f"{victim.server_url}/health")
        assert victim.worker_id in await snapshot(registry)  # not withdrawn: a dead process cannot
        await wait_for(lambda: _absent(registry, victim.worker_id), timeout=TTL * 4)
        assert survivor.worker_id in await snapshot(registry)
        assert cluster.workers_with(WorkerRole.DECODE) == [survivor]


async def test_a_crash_closes_the_port_before_anything_it_awaits(registry, client, monkeypatch):
    """A crash is abrupt: the port refuses connections at once, even while stopping the heartbeat still waits (under
    load a registry write in flight can hold that for a while). Otherwise the dying worker keeps serving, and the
    soak counts calls routed to it after its crash that it in fact answered."""
    async with SimCluster(registry=registry, settings=fast_settings(), heartbeat_interval_s=0.1) as cluster:
        (victim,) = await cluster.start(decode=1)
        assert victim._lifecycle is not None
        release = asyncio.Event()
        original = victim._lifecycle.abandon

        async def slow_abandon() -> None:
            await release.wait()
            await original()

        monkeypatch.setattr(victim._lifecycle, "abandon", slow_abandon)
        crashing = asyncio.create_task(cluster.crash(victim.worker_id))
        await asyncio.sleep(0.05)
        assert not crashing.done()  # still waiting on the heartbeat's stop
        with pytest.raises(httpx.ConnectError):
            await client.get(f"{victim.server_url}/health")
        release.set()
        await crashing
        assert victim.state is SimWorkerState.CRASHED


async def test_workers_join_at_runtime(registry):
    async with SimCluster(registry=registry, settings=fast_settings(), heartbeat_interval_s=0.1) as cluster:
        await cluster.start(prefill=1)
        assert len(await snapshot(registry)) == 1
        joined = await cluster.add(WorkerRole.DECODE, worker_id="late-decode")
        assert (await snapshot(registry))["late-decode"].role is WorkerRole.DECODE
        assert joined in cluster.workers_with(WorkerRole.DECODE)
        with pytest.raises(ValueError):
            await cluster.add(WorkerRole.DECODE, worker_id="late-decode")


def test_command_runs_registers_and_drains_on_sigterm(tmp_path):
    registry_dir = tmp_path / "registry"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "litellm_disagg.sim",
            "--prefill",
            "1",
            "--decode",
            "2",
            "--model",
            "cli-model",
            "--registry-dir",
            str(registry_dir),
            "--speedup",
            "100",
            "--drain-settle",
            "0.1",
            "--name",
            "clisim",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=Path(__file__).parents[2],
    )
    try:
        assert proc.stdout is not None
        ready = [proc.stdout.readline().split() for _ in range(3)]
        assert sorted(line[1] for line in ready) == ["clisim-decode-1", "clisim-decode-2", "clisim-prefill-0"]
        base_url = ready[0][2]
        r = httpx.post(f"{base_url}/chat/completions", json={**chat_body(), "model": "cli-model"}, timeout=10)
        assert r.status_code == 200 and r.json()["model"] == "cli-model"
        assert len(list(registry_dir.glob("*.worker.json"))) == 3
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
        assert list(registry_dir.glob("*.worker.json")) == []
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


async def _running(client: httpx.AsyncClient, worker) -> bool:
    return (await engine_probe.engine_load(client, worker.server_url, VLLM_METRICS)).running > 0


async def _state_is(registry: FileRegistry, worker_id: str, state: WorkerState) -> bool:
    entry = (await snapshot(registry)).get(worker_id)
    return entry is not None and entry.state is state


async def _absent(registry: FileRegistry, worker_id: str) -> bool:
    return worker_id not in await snapshot(registry)


async def _true(value: bool) -> bool:
    return value


async def test_the_http_socket_is_tcp_so_replies_are_not_held_back_by_nagle(registry):
    # asyncio sets TCP_NODELAY on accepted connections only when the listening socket says IPPROTO_TCP; a socket made
    # with proto 0 made every keep-alive POST to a simulated worker wait ~40 ms for a delayed ACK.
    import socket

    async with SimCluster(registry=registry, settings=fast_settings(), heartbeat_interval_s=0.1) as cluster:
        [worker] = await cluster.start(both=1)
        assert worker._server is not None
        listening = [s for server in worker._server.servers for s in server.sockets]
        assert listening and all(s.proto == socket.IPPROTO_TCP for s in listening)

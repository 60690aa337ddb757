"""``litellm-disagg planner`` on its own: a subprocess with a proxy config, file discovery, a proxy metrics page that
reports slow TTFTs, and fake workers; it asks a decode worker to become a prefill worker, or only logs it with
``--dry-run``."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry, Histogram, start_http_server

from litellm_disagg.discovery.file.registry import FileRegistry
from litellm_disagg.observability.metrics import ITL_BUCKETS, TTFT_BUCKETS
from litellm_disagg.runtime_config import RuntimeConfig, WorkerRole, WorkerState

from ..support.fake_worker import FakeWorker
from ..support.net import free_port

MODEL = "planner-cli-model"
ROOT = Path(__file__).resolve().parents[2]


def config(worker: FakeWorker, role: WorkerRole, *, model: str = MODEL, prefix: str = "") -> RuntimeConfig:
    return RuntimeConfig(worker_id=prefix + worker.name, model=model, role=role, base_url=f"{worker.url}/v1",
                         transfer=worker.transfer, kv_capacity_blocks=100, block_size=16, state=WorkerState.READY,
                         allowed_roles=(WorkerRole.PREFILL, WorkerRole.DECODE, WorkerRole.BOTH))


@pytest.fixture
def proxy_page() -> tuple[str, Histogram, Histogram]:
    registry = CollectorRegistry()
    ttft = Histogram("litellm_disagg_time_to_first_token_seconds", "ttft", ["model", "mode"], buckets=TTFT_BUCKETS,
                     registry=registry)
    itl = Histogram("litellm_disagg_inter_token_latency_seconds", "itl", ["model", "mode"], buckets=ITL_BUCKETS,
                    registry=registry)
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    yield f"http://127.0.0.1:{port}/metrics", ttft, itl
    server.shutdown()
    thread.join(5)


@pytest.mark.parametrize("dry_run", [False, True])
async def test_standalone_planner_moves_a_worker_on_slow_ttft(tmp_path: Path, proxy_page, dry_run: bool) -> None:
    url, ttft, itl = proxy_page
    registry_dir = tmp_path / "registry"
    workers = [FakeWorker(name, free_port()) for name in ("cli-p1", "cli-d1", "cli-d2")]
    for w in workers:
        await w.start()
    registry = FileRegistry(registry_dir, poll_interval_s=0.05)
    conf = tmp_path / "proxy_config.yaml"
    conf.write_text(yaml.safe_dump({"litellm_disagg": {
        "registry": {"backend": "file", "path": str(registry_dir)},
        "admission": {"allowed_models": [MODEL]},
        "planner": {"ttft_ms": 500, "itl_ms": 50, "interval_s": 0.3, "hysteresis_steps": 2, "min_samples": 1,
                    "window_s": 10}}}))
    proc = None
    try:
        await registry.publish(config(workers[0], WorkerRole.PREFILL))
        for w in workers[1:]:
            await registry.publish(config(w, WorkerRole.DECODE))
        # entries of a model the proxies do not admit: the planner must neither scrape nor move them
        evil = [config(workers[0], WorkerRole.PREFILL, model="evil-model", prefix="evil-")] + [
            config(w, WorkerRole.DECODE, model="evil-model", prefix="evil-") for w in workers[1:]]
        for e in evil:
            await registry.publish(e)
        argv = [sys.executable, "-m", "litellm_disagg.cli", "planner", "--config", str(conf),
                "--proxy-metrics", url, "--steps", "4"] + (["--dry-run"] if dry_run else [])
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,  # noqa: ASYNC220
                                env={**os.environ, "LITELLM_DISAGG_LOG_LEVEL": "INFO"})
        for i in range(2400):  # up to two minutes: a planner process starts slowly on a loaded machine
            if i % 20 == 0:  # the entries must stay alive (heartbeat TTL) while the planner starts
                for w in workers:
                    await registry.heartbeat(w.name)
                for e in evil:
                    await registry.heartbeat(e.worker_id)
            ttft.labels(MODEL, "disaggregated").observe(2.0)
            ttft.labels("evil-model", "disaggregated").observe(2.0)
            itl.labels(MODEL, "disaggregated").observe(0.005)
            if proc.poll() is not None:
                break
            await asyncio.sleep(0.05)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out
        decisions = [json.loads(line.split("planner decision ", 1)[1]) for line in out.splitlines()
                     if "planner decision " in line]
        moves = [mv for d in decisions for mv in d["moves"]]
        assert {d["model"] for d in decisions} == {MODEL}, out
        assert moves == [["cli-d1", "decode", "prefill"]], out
        role_file = registry_dir / "cli-d1.role.json"
        if dry_run:
            assert not role_file.exists() and "would ask cli-d1 to become prefill" in out
        else:
            assert json.loads(role_file.read_text())["role"] == "prefill"
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        await registry.close()
        for w in workers:
            await w.stop()

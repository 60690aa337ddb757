"""Issue 9, item 5b (simulated): the planner, running inside the real LiteLLM proxy over simulated switchable vLLM
workers, makes one move when the load shifts, and none before.

Real: the LiteLLM proxy process with the plugin and ``planner.enabled``, file discovery, HTTP, streaming, the
workers' role-change path (``Registry.request_role`` -> the worker's lifecycle -> republished role). Simulated: the
engines (``litellm_disagg.sim``, a prefill rate of 5,000 tokens/s in real time, so a 4,000-token prompt takes 0.8 s).
Real vLLM CPU workers would make the same move but cost minutes of the two shared cores per run; see
docs/planner.md.

Layout: ``p1`` prefill, ``d1`` and ``d2`` decode, all ``--switchable``. Phase 1: short prompts, TTFT far under the
3 s SLO: the planner holds (no role request for at least 10 steps). Phase 2: long prompts queue at the one prefill
worker, TTFT p90 goes over the SLO while decode has headroom: the planner asks a decode worker to prefill
(``prefill_bound``). The minimum decode pool (1) then forbids a second move, so exactly one happens. No request fails.
"""

from __future__ import annotations

import asyncio

import httpx

from litellm_disagg.runtime_config import WorkerRole
from litellm_disagg.sim import SimSettings
from litellm_disagg.sim.settings import EngineSettings, TimingSettings

from ..support.planner_log import planner_decisions
from ..support.procs import MASTER_KEY
from ..support.proxy_configs import plugin_only
from ..support.registry_watch import eventually
from ..support.sim_split import switchable_split
from ..support.streaming_traffic import StreamingTraffic

MODEL = "sim-model"
INTERVAL_S = 0.5


def sim_settings() -> SimSettings:
    return SimSettings(
        engine=EngineSettings(num_gpu_blocks=4096, max_model_len=8192, max_num_batched_tokens=4096),
        timing=TimingSettings(prefill_tokens_per_s=5000.0, speedup=1.0),
    )


def proxy_config(registry_dir) -> dict:
    return plugin_only({
        "registry": {"backend": "file", "path": str(registry_dir), "poll_interval_s": 0.1},
        "sync_interval_s": 0.2,
        # SLOs far above what short prompts see even on a loaded 2-core machine (phase 1's ITL reached 1.8 s
        # there), far below what 6 long prompts queued at one 5,000 tokens/s prefill worker see (TTFT 5 s+).
        "planner": {"enabled": True, "ttft_ms": 3000, "itl_ms": 5000, "interval_s": INTERVAL_S,
                    "hysteresis_steps": 2, "window_s": 4, "min_samples": 3, "cooldown_s": 600,
                    "allow_aggregated": False},
    }, router={"num_retries": 0, "timeout": 120})


async def test_planner_in_the_proxy_moves_one_worker_when_the_load_shifts(tmp_path) -> None:
    registry_dir = tmp_path / "registry"
    async with switchable_split(tmp_path, proxy_config, sim_settings(), name="sim-planner", model=MODEL) as split:
        _, d1, d2 = split.workers
        proxy = split.proxy
        headers = {"Authorization": f"Bearer {MASTER_KEY}"}
        async with httpx.AsyncClient(base_url=proxy.url, headers=headers, timeout=120) as c:
            # phase 1: short prompts; the planner holds for at least 10 steps
            short = StreamingTraffic(c, model=MODEL, words=20, concurrency=2, tag="short")
            try:
                await eventually(lambda: len(planner_decisions(proxy.log.read_text())) >= 1, timeout_s=60)
                await eventually(lambda: short.done >= 20 or bool(short.failures), timeout_s=60)
                await asyncio.sleep(10 * INTERVAL_S)
            finally:
                await short.stop()
            lines = planner_decisions(proxy.log.read_text())
            assert [mv for d in lines for mv in d["moves"]] == [], lines[-3:]
            assert not list(registry_dir.glob("*.role.json"))
            assert {d["condition"] for d in lines} <= {"steady"}, lines[-3:]

            # phase 2: long prompts queue at the one prefill worker
            long = StreamingTraffic(c, model=MODEL, words=4000, concurrency=6, tag="long")
            try:
                await eventually(lambda: WorkerRole.PREFILL in (d1.role, d2.role) or bool(long.failures),
                                 timeout_s=90, interval_s=0.2)
                await asyncio.sleep(6 * INTERVAL_S)   # a few more steps: no second move
            finally:
                await long.stop()
            assert short.failures == [] and long.failures == [], (short.failures + long.failures)[:3]
        published = await split.published()
    log = proxy.log.read_text()
    moves = [(d["condition"], mv) for d in planner_decisions(log) for mv in d["moves"]]
    assert len(moves) == 1, moves
    condition, (worker_id, from_role, to_role) = moves[0]
    assert (condition, from_role, to_role) == ("prefill_bound", "decode", "prefill")
    assert worker_id in ("d1", "d2") and published[worker_id] is WorkerRole.PREFILL
    assert sorted(published.values()) == sorted([WorkerRole.PREFILL, WorkerRole.PREFILL, WorkerRole.DECODE])
    assert "now serves prefill" in log

"""Issue 9 (simulated engines, real proxy): the planner inside the real LiteLLM proxy crosses from a split to
aggregated serving (``aggregation_pays``) when a side of the split misses its SLO and the engine profile says every
worker as ``both`` would hold the load. The evaluation harness (``bench.planner_eval``) checks the policy in
simulated time; this checks the product's wiring of the same decision: the prompt rate from the proxy's own
counter (KV routing on), the output rate from the workers' ``/metrics`` pages, the profile from
``proxy_config.yaml``, the moves through the registry and the workers' role-change path.

Layout: ``p1`` prefill, ``d1`` and ``d2`` decode, all ``--switchable``; KV routing with every prompt prefilled
remotely. Long prompts (about 4,000 words, 6 at a time) queue at the one prefill worker (5,000 tokens/s), so the
TTFT percentile passes its 3 s SLO. The profile is the simulated engine's own (``bench.planner_eval.profile``, as
``litellm-disagg profile`` measures a real one): three workers prefilling their own prompts take a third of the load
each, well inside its ITL target. ``aggregate_below: 0`` turns the low-load moves to ``both`` off, and
``min_decode_workers: 2`` forbids the ``prefill_bound`` move (a decode worker to prefill), so the crossing is the only
move open here: without that minimum, the queue's trend moved ``d1`` to prefill in some runs before the load rates
covered a window, and its cooldown then kept it out of the crossing (a layout of ``both, prefill, both``).

The same layout with ``allow_aggregated: false`` or without a profile makes the ``prefill_bound`` move instead
(``test_planner_sim_proxy.py``).
"""

from __future__ import annotations

import httpx

from bench.planner_eval.profile import profile_engine
from litellm_disagg.runtime_config import WorkerRole

from ..support.planner_log import planner_decisions, planner_moves
from ..support.procs import MASTER_KEY
from ..support.proxy_configs import plugin_only
from ..support.registry_watch import eventually
from ..support.sim_split import switchable_split
from ..support.streaming_traffic import StreamingTraffic
from .test_planner_sim_proxy import sim_settings

MODEL = "sim-model"
INTERVAL_S = 0.5
SIM_TOKENIZER = "python:litellm_disagg.sim.hf_tokenizer:load"


def proxy_config(registry_dir) -> dict:
    sim = sim_settings()
    profile = profile_engine(sim.timing, sim.engine)
    return plugin_only({
        "registry": {"backend": "file", "path": str(registry_dir), "poll_interval_s": 0.1},
        "sync_interval_s": 0.2,
        "kv_routing": {
            "enabled": True,
            "disaggregation": {"mode": "always"},
            "tokenizer": {"model_dirs": {MODEL: SIM_TOKENIZER}},
        },
        # SLOs as in test_planner_sim_proxy.py: far above what the ITL of a loaded 2-core machine reaches, far below
        # the TTFT of 6 long prompts queued at one prefill worker
        "planner": {"enabled": True, "ttft_ms": 3000, "itl_ms": 5000, "interval_s": INTERVAL_S,
                    "hysteresis_steps": 2, "window_s": 4, "min_samples": 3, "cooldown_s": 600,
                    "allow_aggregated": True, "aggregate_below": 0.0, "min_decode_workers": 2,
                    "engine_profile": profile.model_dump()},
    }, router={"num_retries": 0, "timeout": 120})


async def test_the_planner_in_the_proxy_crosses_a_split_that_misses_its_slo_to_aggregated_serving(tmp_path) -> None:
    async with switchable_split(tmp_path, proxy_config, sim_settings(), name="sim-crossing", model=MODEL) as split:
        workers, proxy = split.workers, split.proxy
        headers = {"Authorization": f"Bearer {MASTER_KEY}"}
        async with httpx.AsyncClient(base_url=proxy.url, headers=headers, timeout=120) as c:
            long = StreamingTraffic(c, model=MODEL, words=4000, concurrency=6, tag="long")
            try:
                try:
                    await eventually(lambda: all(w.role is WorkerRole.BOTH for w in workers)
                                     or bool(long.failures), timeout_s=120, interval_s=0.2)
                except AssertionError:
                    decisions = planner_decisions(proxy.log.read_text())
                    raise AssertionError(f"no crossing: {[w.role for w in workers]}, {long.done} done, "
                                         f"last decisions {decisions[-3:]}") from None
                crossed_at = long.done
                # the new layout serves: more long prompts complete on it
                await eventually(lambda: long.done >= crossed_at + 6 or bool(long.failures), timeout_s=90)
            finally:
                await long.stop()
            assert long.failures == [], long.failures[:3]
        published = await split.published()
    log = proxy.log.read_text()

    moves = planner_moves(log)
    assert moves, "no move"
    assert {condition for condition, _ in moves} == {"aggregation_pays"}, moves
    assert sorted(worker_id for _, (worker_id, _, _) in moves) == ["d1", "d2", "p1"], moves
    assert all(to_role == "both" for _, (_, _, to_role) in moves), moves
    assert set(published.values()) == {WorkerRole.BOTH}, published
    # the first crossing step's evidence: the split missed the TTFT SLO (prefill pressure over 1) while the
    # estimate for three ``both`` workers, from the proxy's prompt rate and the workers' output rate, held the ITL
    first = next(d for d in planner_decisions(log) if d["moves"])
    assert first["prefill_pressure"] > 1.0, first
    assert first["aggregated_itl_ratio"] is not None and first["aggregated_itl_ratio"] < 0.7, first
    assert 0 < first["aggregated_busy"] < 0.9, first
    assert "now serves both" in log

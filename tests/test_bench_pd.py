"""bench.serving.pd: the P/D arms are what they claim, the ranges add up, and the oracle arm really runs the
prefill-then-decode protocol against simulated pools (the proxy arms run through ``python -m bench.serving.pd``)."""

from __future__ import annotations

import asyncio
import os

import pytest

from bench.serving import breakdown, pd, workloads
from bench.serving.variants import Variant
from bench.serving.workers import read_counters, vllm_worker_argvs
from litellm_disagg.settings import DisaggSettings
from litellm_disagg.sim.request_log import read as read_traces


def test_each_arm_is_the_strategy_it_names(tmp_path):
    pools = pd.Pools(tmp_path, [], [], [])
    settings = {arm: DisaggSettings.from_proxy_config(pd.proxy_config(arm, pools)) for arm in pd.PD_ARMS if arm != "pd_oracle"}
    precise, approximate = settings["pd_kv_precise"].kv_routing, settings["pd_kv_approximate"].kv_routing
    assert precise.enabled and precise.index.mode == "precise" and precise.disaggregation.mode == "auto"
    assert approximate.enabled and approximate.index.mode == "approximate" and approximate.disaggregation.mode == "auto"
    assert not settings["pd_least_inflight"].kv_routing.enabled and settings["pd_least_inflight"].picker == "least_inflight"
    assert not settings["pd_round_robin"].kv_routing.enabled and settings["pd_round_robin"].picker == "round_robin"


def _row(arm: str, run: int, ttft: float) -> pd.PDFigures:
    return pd.PDFigures(arm, run, 10, 10, ttft, 2 * ttft, 5.0, 3 * ttft, 0.5, 0.25, 1.0, 1.5)


def test_ranges_are_min_to_max_over_runs_per_arm():
    rows = [_row("a", 1, 10), _row("b", 1, 40), _row("a", 2, 30), _row("b", 2, 40)]
    rng = pd.ranges(rows)
    assert rng["a"]["ttft_p50_ms"] == (10, 30) and rng["b"]["ttft_p99_ms"] == (80, 80)
    table = pd.ranges_table(rows)
    assert "| a | 2 | 10-30 | 20-60 |" in table and "| b | 2 | 40 | 80 |" in table


def test_the_oracle_prefills_remotely_once_per_document_then_locally(tmp_path):
    pools = pd.start_pools(tmp_path, prefill=1, decode=1, speedup=1.0, blocks=4096, block_size=16)
    try:
        schedule = workloads.build("shared", workloads.Shape(requests=4, rate=2.0, documents=1, prefix_words=300,
                                                             question_words=10))
        before = asyncio.run(read_counters(pools.all))
        results, _ = asyncio.run(pd.run_oracle(schedule, pools, max_tokens=4))
        after = asyncio.run(read_counters(pools.all))
    finally:
        pools.close()
    assert [r.error for r in results] == [None] * 4 and all(r.ttft_s for r in results)
    rows = pd.figures("pd_oracle", 1, results, pools, before, after)
    assert rows.remote_share == 0.25  # the document's first request went to the prefill pool, the others stayed local
    assert rows.hit_rate > 0.5  # the decode worker held the transferred document
    # The remote prefill's prompt is looked up twice (prefill worker, then the decode worker, where what it pulls is a
    # miss): the hit rate counts it twice, the reuse once.
    computed = sum(after[w]["computed_tokens"] - before[w]["computed_tokens"] for w in after)
    served = after[pools.decode[0].worker_id]["prompt_tokens"] - before[pools.decode[0].worker_id]["prompt_tokens"]
    assert 0 < computed < served and rows.reuse == pytest.approx(1 - computed / served)
    assert rows.reuse > rows.hit_rate
    # Every request's TTFT broken down from the workers' traces: the first one prefilled remotely, in parts that
    # add up to its TTFT.
    assert pools.request_log is not None
    parts = breakdown.join(results, read_traces(pools.request_log)[0])
    assert len(parts) == 4
    remote = [b for b in parts if b.prefill_worker is not None]
    assert len(remote) == 1 and remote[0].prefill_worker == pools.prefill[0].worker_id
    assert set(remote[0].parts_ms) == set(breakdown.PARTS) - {"frontend"}  # vLLM only
    for b in parts:
        assert b.worker == pools.decode[0].worker_id
        assert sum(b.parts_ms.values()) == pytest.approx(b.ttft_ms, abs=0.01)


def test_vllm_backend_defaults_fit_two_cores_and_leave_the_sim_defaults_alone():
    real, sim = pd.parse_args(["--backend", "vllm"]), pd.parse_args([])
    assert (real.prefill, real.decode, real.requests, real.max_tokens) == (1, 2, 16, 12)
    assert (sim.prefill, sim.decode, sim.requests, sim.max_tokens) == (4, 4, 120, 24)
    assert pd.parse_args(["--backend", "vllm", "--decode", "3", "--requests", "8"]).decode == 3
    assert real.warm_up_words < sim.warm_up_words
    assert sim.variants == [Variant(1)]
    assert pd.parse_args(["--proxies", "1,2,2r"]).variants == [Variant(1), Variant(2), Variant(2, redis=True)]
    with pytest.raises(SystemExit):
        pd.parse_args(["--proxies", "0"])


def test_vllm_pools_are_prefill_and_decode_workers_and_the_proxy_tokenizes_with_the_model_dir(tmp_path):
    argvs = vllm_worker_argvs(tmp_path, count=3, model_dir="/models/smol", served="smollm2", kv_cache_mib=768,
                              max_model_len=4096, roles=["prefill", "decode", "decode"])
    roles = [argv[argv.index("--role") + 1] for argv in argvs]
    ids = [argv[argv.index("--worker-id") + 1] for argv in argvs]
    events = [argv[argv.index("--kv-events-port") + 1] for argv in argvs]
    assert roles == ["prefill", "decode", "decode"] and len(set(ids)) == 3 and len(set(events)) == 3
    small = dict(model_dir="m", served="s", kv_cache_mib=1, max_model_len=1)
    assert [argv[argv.index("--role") + 1] for argv in vllm_worker_argvs(tmp_path, count=2, **small)] == ["both"] * 2
    with pytest.raises(ValueError):
        vllm_worker_argvs(tmp_path, count=3, roles=["decode"], **small)
    pools = pd.Pools(tmp_path, [], [], [], None, "smollm2", "/models/smol")
    settings = DisaggSettings.from_proxy_config(pd.proxy_config("pd_kv_precise", pools))
    assert settings.kv_routing.tokenizer.model_dirs == {"smollm2": "/models/smol"}


def test_connect_pairs_moves_kv_once_between_every_prefill_and_decode_worker(tmp_path):
    pools = pd.start_pools(tmp_path, prefill=1, decode=2, speedup=1.0, blocks=4096, block_size=16)
    try:
        before = asyncio.run(read_counters(pools.all))
        asyncio.run(pd.connect_pairs(pools))
        after = asyncio.run(read_counters(pools.all))
    finally:
        pools.close()
    served = {w: after[w]["requests_finished"] - before[w]["requests_finished"] for w in after}
    assert served[pools.prefill[0].worker_id] == 2  # one prefill per decode worker
    assert all(served[d.worker_id] == 1 for d in pools.decode)


def test_runs_rotate_the_arm_order_so_no_arm_always_runs_first():
    arms = ["a", "b", "c"]
    orders = [pd.run_order(arms, run) for run in (1, 2, 3, 4)]
    assert orders == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]
    assert {o[0] for o in orders[:3]} == set(arms)


def test_kv_arms_set_shared_compute_and_serve_metrics_when_asked(tmp_path):
    pools = pd.Pools(tmp_path, [], [], [])
    settings = DisaggSettings.from_proxy_config(pd.proxy_config("pd_kv_precise", pools, shared_compute=0.5,
                                                                metrics_port=9123))
    assert settings.kv_routing.disaggregation.shared_compute == 0.5 and settings.metrics.port == 9123
    cpus = os.cpu_count() or 1
    assert pd.parse_args(["--backend", "vllm"]).shared_compute == round(max(0.0, 1 - cpus / 3), 3)  # 1P+2D, 1 thread
    assert pd.parse_args(["--backend", "vllm", "--shared-compute", "0"]).shared_compute == 0.0
    assert pd.parse_args([]).shared_compute == 0.0


def test_decision_summary_is_one_arms_means_from_two_scrapes():
    before = {"prefill_cost_estimate_seconds:remote:sum": 1.0, "prefill_cost_estimate_seconds:remote:count": 2,
              "time_to_first_token_seconds:disaggregated:sum": 3.0, "time_to_first_token_seconds:disaggregated:count": 2,
              "local:cost_model": 1, "prefill_backlog_tokens:local:sum": 100.0, "prefill_backlog_tokens:local:count": 1}
    after = {"prefill_cost_estimate_seconds:remote:sum": 4.0, "prefill_cost_estimate_seconds:remote:count": 8,
             "time_to_first_token_seconds:disaggregated:sum": 9.0, "time_to_first_token_seconds:disaggregated:count": 5,
             "local:cost_model": 4, "fit:tokens_per_second:prefill": 400.0,
             "prefill_backlog_tokens:local:sum": 1300.0, "prefill_backlog_tokens:local:count": 5,
             "prompt_tokens:decode": 1000.0, "cached_prompt_tokens:decode": 750.0}
    assert pd.decision_summary(before, after) == {
        "predicted_remote_n": 6, "predicted_remote_mean_s": 0.5, "ttft_disaggregated_n": 3,
        "ttft_disaggregated_mean_s": 2.0, "backlog_local_n": 4, "backlog_local_mean_tokens": 300.0,
        "seen_cached_decode": 0.75, "local:cost_model": 3, "fit:tokens_per_second:prefill": 400.0,
    }


def test_replicas_summary_adds_the_replicas_decisions_and_keeps_each_ones_fitted_lines():
    before = [{"prefill_cost_estimate_seconds:remote:sum": 1.0, "prefill_cost_estimate_seconds:remote:count": 2},
              {"prefill_cost_estimate_seconds:remote:sum": 0.0, "prefill_cost_estimate_seconds:remote:count": 0}]
    after = [{"prefill_cost_estimate_seconds:remote:sum": 3.0, "prefill_cost_estimate_seconds:remote:count": 4,
              "local:cost_model": 2, "fit:overhead_seconds:local": 0.03},
             {"prefill_cost_estimate_seconds:remote:sum": 2.0, "prefill_cost_estimate_seconds:remote:count": 4,
              "local:cost_model": 5, "fit:overhead_seconds:local": 0.08}]
    summary = pd.replicas_summary(before, after)
    assert summary["predicted_remote_n"] == 6 and summary["predicted_remote_mean_s"] == pytest.approx(4 / 6)
    assert summary["local:cost_model"] == 7
    assert summary["fit:overhead_seconds:local#0"] == 0.03 and summary["fit:overhead_seconds:local#1"] == 0.08
    assert summary["predicted_remote_n#0"] == 2 and summary["local:cost_model#1"] == 5
    assert "fit:overhead_seconds:local" not in summary  # no replica's line stands for all of them
    assert pd.replicas_summary(before[:1], after[:1]) == pd.decision_summary(before[0], after[0])


def test_decision_figures_read_the_proxys_page():
    page = "\n".join([
        'litellm_disagg_prefill_backlog_tokens_sum{model="m",option="local"} 300.0',
        'litellm_disagg_prefill_backlog_tokens_count{model="m",option="local"} 2.0',
        'litellm_disagg_prompt_tokens_total{model="m",role="decode",worker="d0"} 1000.0',
        'litellm_disagg_prompt_tokens_total{model="m",role="decode",worker="d1"} 1000.0',
        'litellm_disagg_cached_prompt_tokens_total{model="m",role="decode",worker="d0"} 900.0',
        'litellm_disagg_local_prefills_total{model="m",reason="cost_model"} 3.0',
        "",
    ])
    figures = pd.decision_figures(page)
    assert figures["prefill_backlog_tokens:local:sum"] == 300.0
    assert figures["prefill_backlog_tokens:local:count"] == 2.0
    assert figures["prompt_tokens:decode"] == 2000.0 and figures["cached_prompt_tokens:decode"] == 900.0
    assert figures["local:cost_model"] == 3.0
    summary = pd.decision_summary({}, figures)
    assert summary["seen_cached_decode"] == 0.45 and summary["backlog_local_mean_tokens"] == 150.0

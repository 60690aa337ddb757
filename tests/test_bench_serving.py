"""bench.serving: the schedules are seeded, the arms are what they claim, the figures add up, and one small run goes
through the real proxy end to end (so the benchmark cannot rot unnoticed)."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from bench.serving import arms, report, workloads
from bench.serving.loadgen import RequestResult
from bench.serving.workers import Worker, WorkerSet, parse_counters
from litellm_disagg.settings import DisaggSettings

ROOT = Path(__file__).resolve().parent.parent


def test_schedules_are_seeded_and_sized():
    shape = workloads.Shape(requests=40, rate=4.0, turns=4)
    for workload in workloads.WORKLOADS:
        first, again = workloads.build(workload, shape, seed=3), workloads.build(workload, shape, seed=3)
        assert first == again
        assert first.requests == 40
        assert workloads.build(workload, shape, seed=4) != first
    starts = [s.start_s for s in workloads.build("shared", shape).sessions]
    assert starts == sorted(starts) and starts[0] == 0.0


def test_multi_turn_resends_the_history_with_the_answers():
    schedule = workloads.build("multi-turn", workloads.Shape(requests=8, turns=4))
    session = schedule.sessions[0]
    third = workloads.conversation(session, 2, ["first answer", "second answer"])
    assert [m["role"] for m in third] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert third[2]["content"] == "first answer" and third[4]["content"] == "second answer"
    assert third[-1] == session.turns[2].messages[-1]
    assert {t.prefix_key for t in session.turns} == {session.session_id}


def test_shared_and_skewed_reuse_documents_and_skewed_is_skewed():
    shape = workloads.Shape(requests=400, documents=4)
    shared = [s.turns[0].prefix_key for s in workloads.build("shared", shape).sessions]
    skewed = [s.turns[0].prefix_key for s in workloads.build("skewed", shape).sessions]
    unique = [s.turns[0].prefix_key for s in workloads.build("unique", shape).sessions]
    assert len(set(shared)) == 4 and len(set(unique)) == 400
    hottest = max(skewed.count(k) for k in set(skewed))
    assert hottest > 0.3 * len(skewed) > max(shared.count(k) for k in set(shared))


def test_round_robin_rotates_and_the_oracle_sticks_and_spreads():
    rr = arms.Placement("round_robin", 3)
    assert [rr.pick("same") for _ in range(6)] == [0, 1, 2, 0, 1, 2]
    oracle = arms.Placement("oracle", 3)
    first = [oracle.pick(k) for k in ("a", "b", "c", "d")]
    assert first == [0, 1, 2, 0]
    assert [oracle.pick(k) for k in ("c", "a", "d", "b")] == [2, 0, 0, 1]


def worker_set(tmp_path: Path) -> WorkerSet:
    workers = [Worker(f"w{i}", f"http://127.0.0.1:{9000 + i}") for i in range(3)]
    return WorkerSet("m", "/models/m", tmp_path / "registry", workers, [])


def test_the_kv_aware_arm_is_our_plugin_with_kv_routing_and_no_static_deployments(tmp_path):
    arm = arms.build("kv_aware", worker_set(tmp_path), kv_routing={"seed": 1})
    assert arm.config["model_list"] == []
    assert arm.config["litellm_settings"]["callbacks"] == ["litellm_disagg.plugin.handler"]
    settings = DisaggSettings.model_validate(arm.config["litellm_disagg"])
    assert settings.kv_routing.enabled and settings.kv_routing.seed == 1
    assert settings.kv_routing.tokenizer.model_dirs == {"m": "/models/m"}
    assert not arm.pinned and not arm.session_header


@pytest.mark.parametrize(
    ("name", "strategy", "checks", "pinned", "header"),
    [
        ("simple_shuffle", "simple-shuffle", None, False, False),
        ("least_busy", "least-busy", None, False, False),
        ("session_affinity", "simple-shuffle", ["session_affinity"], False, True),
        ("round_robin", "simple-shuffle", None, True, False),
        ("oracle", "simple-shuffle", None, True, False),
    ],
)
def test_litellm_arms_list_every_worker_plainly_and_per_worker(tmp_path, name, strategy, checks, pinned, header):
    arm = arms.build(name, worker_set(tmp_path))
    router = arm.config["router_settings"]
    assert router["routing_strategy"] == strategy
    assert router.get("optional_pre_call_checks") == checks
    groups = [d["model_name"] for d in arm.config["model_list"]]
    assert groups == ["m", "m", "m", "m@0", "m@1", "m@2"]
    assert arm.config["model_list"][3]["litellm_params"]["api_base"] == "http://127.0.0.1:9000/v1"
    assert "callbacks" not in arm.config["litellm_settings"]
    assert (arm.pinned, arm.session_header) == (pinned, header)


def test_counters_sum_label_sets():
    text = """# HELP vllm:prefix_cache_hits_total x
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 30.0
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 100.0
vllm:request_success_total{finished_reason="length",model_name="m"} 2.0
vllm:request_success_total{finished_reason="stop",model_name="m"} 3.0
vllm:prefix_cache_hits_created 1.7e9
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_compute"} 60.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_cache_hit"} 30.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="external_kv_transfer"} 10.0
"""
    counters = parse_counters(text)
    assert counters["prefix_cache_hits"] == 30 and counters["prefix_cache_queries"] == 100
    assert counters["computed_tokens"] == 60  # only the tokens the engine computed itself
    assert math.isnan(parse_counters("vllm:prompt_tokens_total 5\n")["computed_tokens"])  # unknown, not zero
    assert counters["requests_finished"] == 5 and counters["generation_tokens"] == 0


def test_figures_from_results_and_counter_deltas():
    def result(ttft: float | None, error: str | None = None) -> RequestResult:
        return RequestResult("s", 0, "k", 0.0, ttft, 1.0, 0.02, 5, error)

    before = {w: dict.fromkeys(("prefix_cache_queries", "prefix_cache_hits", "requests_finished",
                                "generation_tokens"), 0.0) for w in "ab"}
    after = {
        "a": {**before["a"], "prefix_cache_queries": 100, "prefix_cache_hits": 60, "requests_finished": 3,
              "generation_tokens": 15},
        "b": {**before["b"], "prefix_cache_queries": 100, "prefix_cache_hits": 20, "requests_finished": 1,
              "generation_tokens": 5},
    }
    fig = report.figures("x", [result(0.1), result(0.3), result(0.2), result(None, "boom")], 2.0, before, after)
    assert (fig.requests, fig.completed, fig.failed) == (4, 3, 1)
    assert fig.ttft_p50_ms == pytest.approx(200)
    assert fig.hit_rate == pytest.approx(0.4)
    assert fig.per_worker_requests == {"a": 3, "b": 1} and fig.imbalance == pytest.approx(1.5)
    assert fig.output_tokens_per_s == pytest.approx(10)
    assert fig.first_errors == ["boom"]


def test_process_cpu_seconds_counts_this_process_and_the_table_shows_it(tmp_path):
    import os
    import time

    from bench.serving import profiling
    from bench.serving.proxy import process_cpu_seconds

    start = process_cpu_seconds(os.getpid())
    deadline = time.process_time() + 0.1
    while time.process_time() < deadline:
        pass
    assert process_cpu_seconds(os.getpid()) >= start + 0.05
    assert process_cpu_seconds(2**22 + 12345) == 0.0  # no such process
    row = report.ArmFigures("kv_aware", 1, 1, 0, 1, 1, 1, 1, 1, 0.5, 1, 1, proxy_cpu_s=12.5, workers_cpu_s=3.0)
    assert "CPU during the load: proxy 12.5 s, workers 3.0 s" in report.table([row])
    raw = tmp_path / "raw.txt"
    raw.write_text("thread (1): MainThread;a (x.py:1);b (y.py:2) 3\nthread (1): MainThread;a (x.py:1) 2\n")
    assert profiling.summarize(raw) == [(3, "b (y.py:2)"), (2, "a (x.py:1)")]


def test_a_small_run_through_the_real_proxy(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.serving", "--backend", "sim", "--workload", "multi-turn", "--workers", "2",
         "--requests", "6", "--rate", "6", "--turns", "3", "--prefix-words", "200", "--max-tokens", "4",
         "--speedup", "20", "--arms", "kv_aware,session_affinity,oracle", "--out", str(out)],
        # A generous limit: the subject is that no request is lost (the keep-alive race), not speed; on a busy 2-core
        # machine this run took 290-425 s and a 400 s limit failed it three times in eleven.
        cwd=ROOT, capture_output=True, text=True, timeout=1200,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for arm in ("kv_aware", "session_affinity", "oracle"):
        assert any(line.startswith(arm) and " 6/6 " in line for line in proc.stdout.splitlines()), proc.stdout
    assert (out / "serving_sim_multi-turn.json").is_file() and (out / "serving_sim_multi-turn.png").is_file()


def test_the_engine_warm_up_reaches_every_worker_directly_at_the_workloads_size(tmp_path):
    """``warm_engines`` (run before the first arm on real vLLM): every worker serves ``rounds`` x 2 requests itself,
    no proxy in between, with prompts of about the size asked and twice it (here on simulated workers, which speak
    vLLM's API and counters)."""
    import asyncio

    from bench.serving.workers import read_counters, start_sim, warm_engines

    workers = start_sim(tmp_path, count=2, speedup=20, blocks=4096, block_size=16)
    try:
        before = asyncio.run(read_counters(workers.workers))
        asyncio.run(warm_engines(workers.workers, workers.model, prompt_words=40, max_tokens=2, rounds=2))
        after = asyncio.run(read_counters(workers.workers))
    finally:
        workers.close()
    for w in workers.workers:
        assert after[w.worker_id]["requests_finished"] - before[w.worker_id]["requests_finished"] == 4, (before, after)
        prompts = after[w.worker_id]["prompt_tokens"] - before[w.worker_id]["prompt_tokens"]
        assert prompts >= 2 * (40 + 80), prompts   # a word is one token or more


def test_the_engines_own_queue_prefill_and_ttft_means_come_from_its_histograms():
    """Real vLLM pages carry per-request histograms; an arm's means are their sums' and counts' increases over all
    workers. A page without them (the simulator's) gives no means rather than zeros."""
    from bench.serving.workers import engine_time_means_ms

    def page(queue_s: float, prefill_s: float, n: float) -> str:
        return "\n".join([
            f'vllm:request_queue_time_seconds_sum{{engine="0"}} {queue_s}',
            f'vllm:request_queue_time_seconds_count{{engine="0"}} {n}',
            f'vllm:request_prefill_time_seconds_sum{{engine="0"}} {prefill_s}',
            f'vllm:request_prefill_time_seconds_count{{engine="0"}} {n}',
            'vllm:request_success_total{engine="0",finished_reason="stop"} 1.0', ""])

    before = {"a": parse_counters(page(1.0, 2.0, 10)), "b": parse_counters(page(0.0, 0.0, 0))}
    after = {"a": parse_counters(page(1.3, 2.5, 12)), "b": parse_counters(page(0.1, 0.5, 2))}
    means = engine_time_means_ms(before, after)
    assert means == pytest.approx({"queue": 100.0, "prefill": 250.0})   # (0.3 + 0.1) / 4 s, (0.5 + 0.5) / 4 s
    assert engine_time_means_ms({"a": parse_counters("")}, {"a": parse_counters("")}) == {}


def test_the_oracle_plugin_arm_pins_its_load_through_a_proxy_running_the_plugin(tmp_path):
    """The oracle's placement, with the plugin loaded (KV routing on) but never choosing: only the pinned per-worker
    groups are plain deployments, so the plain group (the warm-up's) is the plugin's, from discovery."""
    workers = worker_set(tmp_path)
    arm = arms.build("oracle_plugin", workers)
    assert (arm.pinned, arm.session_header) == (True, False)
    assert [d["model_name"] for d in arm.config["model_list"]] == ["m@0", "m@1", "m@2"]
    assert arm.config["litellm_settings"]["callbacks"] == ["litellm_disagg.plugin.handler"]
    assert arm.config["litellm_disagg"] == arms.build("kv_aware", workers).config["litellm_disagg"]
    assert arms.Placement("oracle_plugin", 3).pick("a") == arms.Placement("oracle", 3).pick("a")
    assert "oracle_plugin" in arms.ARMS and "oracle_plugin" not in arms.DEFAULT_ARMS

"""bench.serving --probe-proxy: the arm config it changes and the summary it prints (bench/serving/probe_report.py)."""

from __future__ import annotations

import json
import os
import time

from bench.serving import probe_report
from bench.serving.loadgen import RequestResult
from litellm_disagg.sim.request_log import RequestTrace


def test_enable_adds_the_probe_callback_and_names_its_file(tmp_path, monkeypatch):
    monkeypatch.delenv("BENCH_PROXY_PROBE", raising=False)
    config = {"litellm_settings": {"callbacks": ["litellm_disagg.plugin.handler"]}}
    path = probe_report.enable(config, tmp_path, "multi-turn-kv_aware")
    assert config["litellm_settings"]["callbacks"] == ["litellm_disagg.plugin.handler", "bench.serving.probe.handler"]
    assert os.environ["BENCH_PROXY_PROBE"] == str(path) and path.parent == tmp_path
    bare: dict = {}
    probe_report.enable(bare, tmp_path, "multi-turn-oracle")
    assert bare["litellm_settings"]["callbacks"] == ["bench.serving.probe.handler"]


def test_summary_splits_proxy_in_by_stage_and_counts_lag_and_events(tmp_path):
    path = tmp_path / "probe.jsonl"
    lines = [
        {"user": "c#0", "asgi": 10.002, "pre_hook": 10.005, "route_start": 10.006, "route_end": 10.008,
         "route_cpu": 0.0005, "pre_api": 10.010},
        {"lag": 0.012, "t": 10.5}, {"lag": 0.003, "t": 11.0}, {"lag": 0.050, "t": 99.0},  # the last: after the load
        {"events": 5, "t": 9.0}, {"events": 25, "t": 12.0}, {"threads": {"7": "MainThread"}, "t": 12.0},
    ]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    result = RequestResult("c", 0, "k", 0.0, 0.05, 0.3, 0.02, 4, user="c#0", sent_at=10.000)
    trace = RequestTrace("w", "both", "r", "r", "c#0", 100, arrived=10.015, running_at_arrival=0,
                         waiting_at_arrival=0, prefill_tokens_ahead=0)
    text = probe_report.summary("kv_aware", path, [result], [trace], (9.5, 19.5), {7: 1.0}, {7: 3.5})
    assert "client>asgi 2.0 / 2.0" in text and "asgi>pre_hook 3.0" in text and "route 2.0" in text
    assert "pre_api>worker 5.0" in text
    assert "route: 0.50 / 0.50 ms of the event loop thread's CPU (p50 / p90), 2.00 / 2.00 ms wall" in text
    assert "2 wake-ups >1 ms late, total 15 ms; >5 ms 1, >10 ms 1, >20 ms 0" in text
    assert "KV event messages received during the load: 20 (2/s)" in text
    assert "MainThread 2.50" in text


def test_machine_line_attributes_what_the_known_processes_did_not_use():
    line = probe_report.machine_line((100.0, 50.0), (130.0, 70.0), proxy_s=10.0, workers_s=3.0, client_s=2.0)
    assert "busy 30.0 s, idle 20.0 s" in line and "everything else 15.0" in line


def test_late_wake_ups_are_split_into_time_on_a_core_in_the_run_queue_and_blocked(tmp_path):
    path = tmp_path / "probe.jsonl"
    lines = [
        {"lag": 0.020, "t": 10.5, "span": 0.022, "on_cpu": 0.015, "runqueue": 0.004},
        {"lag": 0.008, "t": 11.0, "span": 0.010, "on_cpu": 0.001, "runqueue": 0.007},
        {"lag": 0.002, "t": 11.5, "span": 0.004, "on_cpu": 0.002, "runqueue": 0.0},  # under 5 ms: not split
    ]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    text = probe_report.summary("kv_aware", path, [], [], (9.5, 19.5), {}, {})
    assert ("the 2 wake-ups >5 ms late span 32 ms of the loop thread (4 ms asked-for sleep, 28 ms late): on a core "
            "16 ms (running callbacks), runnable without a core 11 ms (the OS), neither 5 ms") in text
    assert "the 5 latest (lag / on a core / run queue, ms): 20 / 15 / 4, 8 / 1 / 7" in text


def test_schedstat_reads_the_calling_threads_time_on_a_core():
    from bench.serving.probe import _SchedStat

    stat = _SchedStat.of_this_thread()
    first = stat.read()
    assert first is not None, "no /proc/<pid>/task/<tid>/schedstat on this kernel"
    deadline = time.thread_time() + 0.05
    while time.thread_time() < deadline:  # 50 ms of this thread's CPU
        pass
    on_cpu, runqueue = stat.read()
    assert on_cpu - first[0] >= 40e6 and runqueue >= first[1]

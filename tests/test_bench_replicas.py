"""bench.serving with several proxy replicas: the load generator spreads sessions over them round robin, keeping a
conversation's turns on one replica (fake OpenAI servers stand in for the proxies); the replicas comparison's
options and its ranges table. Under 5 s."""

from __future__ import annotations

import httpx
import pytest

from bench.serving import arms, replicas, report, workloads
from bench.serving.arms import Arm
from bench.serving.loadgen import run
from bench.serving.workers import WorkerSet
from tests.support.fake_worker import FakeWorker
from tests.support.net import free_port


async def test_sessions_are_spread_over_the_replicas_round_robin_and_stay_on_theirs():
    fakes = [FakeWorker(f"replica-{i}", free_port()) for i in range(2)]
    for f in fakes:
        await f.start()
    try:
        schedule = workloads.build("multi-turn", workloads.Shape(requests=8, rate=50.0, turns=2, think_s=0.0,
                                                                 prefix_words=20, question_words=5))
        results, _ = await run(schedule, arm=Arm("kv_aware", {}), base_url=[f.url for f in fakes], key="k",
                               model="m", workers=2, max_tokens=2)
        assert len(results) == 8 and all(r.error is None for r in results)
        seen: list[set[str]] = []
        async with httpx.AsyncClient(timeout=10) as client:
            for f in fakes:
                bodies = [r["body"] for r in (await client.get(f"{f.url}/_requests")).json()]
                seen.append({b["messages"][1]["content"] for b in bodies if len(b["messages"]) == 2})
                assert len(bodies) == 4  # two sessions of two turns each
        sessions = schedule.sessions
        for i, session in enumerate(sessions):
            first_question = session.turns[0].messages[-1]["content"]
            assert first_question in seen[i % 2] and first_question not in seen[1 - i % 2]
    finally:
        for f in fakes:
            await f.stop()


def test_replica_counts_runs_and_the_serving_options():
    args = replicas.parse_args(["--workload", "shared", "--proxies", "1,3,2r", "--runs", "2", "--arms", "kv_aware",
                                "--documents", "32"])
    assert args.variants == [replicas.Variant(1), replicas.Variant(3), replicas.Variant(2, redis=True)]
    assert [v.label for v in args.variants] == ["x1", "x3", "x2+redis"]
    assert args.runs == 2 and args.documents == 32 and args.arms == "kv_aware"
    assert args.requests == 160  # the simulator's defaults filled in
    for bad in ("0", "r", "2x"):
        with pytest.raises(SystemExit):
            replicas.parse_args(["--proxies", bad])


def test_an_arm_with_redis_names_it_in_litellms_router_settings(tmp_path):
    workers = WorkerSet(model="m", model_dir=None, registry_dir=tmp_path, workers=[], procs=[])
    for name in ("kv_aware", "least_busy"):
        assert "redis_host" not in arms.build(name, workers).config["router_settings"]
        router = arms.build(name, workers, redis_port=6399).config["router_settings"]
        assert (router["redis_host"], router["redis_port"]) == ("127.0.0.1", 6399)


def test_ranges_table_spans_the_runs_per_arm_and_replica_count():
    def fig(p50: float, hit: float) -> report.ArmFigures:
        return report.ArmFigures(arm="kv_aware", requests=10, completed=10, failed=0, ttft_p50_ms=p50,
                                 ttft_p99_ms=p50 * 3, itl_p50_ms=20, e2e_p50_ms=500, e2e_p99_ms=900, hit_rate=hit,
                                 throughput_rps=8, output_tokens_per_s=100, imbalance=1.25)

    rows = [replicas.Row("kv_aware", 1, 1, fig(60, 0.78)), replicas.Row("kv_aware", 1, 2, fig(70, 0.80)),
            replicas.Row("kv_aware", 2, 1, fig(90, 0.70)), replicas.Row("kv_aware", 2, 1, fig(80, 0.75), redis=True)]
    lines = replicas.ranges_table(rows).splitlines()
    assert lines[2].split() == ["kv_aware", "x1", "60-70", "180-210", "78.0-80.0", "1.25-1.25", "0"]
    assert lines[3].split() == ["kv_aware", "x2", "90-90", "270-270", "70.0-70.0", "1.25-1.25", "0"]
    assert lines[4].split() == ["kv_aware", "x2+redis", "80-80", "240-240", "75.0-75.0", "1.25-1.25", "0"]

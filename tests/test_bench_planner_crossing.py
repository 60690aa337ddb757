"""``bench.planner_crossing``'s pure parts: the load and SLOs it derives from a measured profile, its arrivals, its
attainment and the proxy config each arm runs (the measurement itself needs real vLLM workers: docs/benchmarks.md)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from bench.planner_crossing import Cluster, Setup, attainment, parse_arms, proxy_config, rotated, schedule
from bench.serving.loadgen import RequestResult
from litellm_disagg.planner.mixing import EngineProfile
from litellm_disagg.planner.settings import PlannerSettings

PROFILE = EngineProfile(weight_read_ms=50.0, per_sequence_ms=2.0, prefill_tokens_per_s=400.0,
                        max_num_batched_tokens=2048)


def setup(**over: float) -> Setup:
    args = argparse.Namespace(load=0.9, ttft_x=3.0, itl_x=4.0, prompt_tokens=1000, output_tokens=32)
    vars(args).update(over)
    return Setup.of(PROFILE, args)


def test_the_load_and_the_slos_scale_with_the_measured_profile():
    s = setup()
    # one 1,000-token prompt takes 2.5 s at 400 tokens/s: 0.9 of one worker is 0.36 prompts a second
    assert abs(s.rate - 0.36) < 1e-9
    assert s.ttft_ms == 7500.0 and s.itl_ms == 4 * 52.0  # a lone decode step: 50 + 1 x 2 ms
    faster = Setup.of(PROFILE.model_copy(update={"prefill_tokens_per_s": 800.0}),
                      argparse.Namespace(load=0.9, ttft_x=3.0, itl_x=4.0, prompt_tokens=1000, output_tokens=32))
    assert abs(faster.rate - 0.72) < 1e-9 and faster.ttft_ms == 3750.0


def test_every_arm_of_a_run_gets_the_same_arrivals_and_every_prompt_is_new():
    s = setup()
    a, b = schedule(s, 50, 300.0, seed=1), schedule(s, 50, 300.0, seed=1)
    assert [x.start_s for x in a.sessions] == [x.start_s for x in b.sessions]
    assert a.sessions == b.sessions
    assert 0.36 * 300 * 0.6 < len(a.sessions) < 0.36 * 300 * 1.4
    prompts = [x.turns[0].messages[0]["content"] for x in a.sessions]
    assert len(set(prompts)) == len(prompts) and all(len(p.split()) == 50 for p in prompts)
    assert [x.start_s for x in schedule(s, 50, 300.0, seed=2).sessions] != [x.start_s for x in a.sessions]


def _result(ttft_s: float | None, itl_s: float | None, error: str | None = None) -> RequestResult:
    return RequestResult("s", 0, "s", 0.0, ttft_s, 1.0, itl_s, 8, error)


def test_attainment_counts_a_request_that_meets_both_slos_and_a_failure_as_missed():
    s = setup()  # TTFT 7,500 ms, ITL 208 ms
    results = [_result(1.0, 0.1), _result(8.0, 0.1), _result(1.0, 0.3), _result(None, None, "500"), _result(7.5, None)]
    assert attainment(results, s) == 2 / 5


def test_each_arm_runs_the_shipped_config_with_its_planner_and_mode(tmp_path: Path):
    cluster = Cluster(tmp_path, tmp_path / "registry", [], [], tmp_path / "model")
    on = proxy_config(cluster, setup(), planner=True, mode="auto")
    disagg = on["litellm_disagg"]
    assert disagg["registry"]["path"] == str(tmp_path / "registry")
    assert disagg["kv_routing"]["enabled"] is True and disagg["kv_routing"]["disaggregation"]["mode"] == "auto"
    planner = PlannerSettings.model_validate(disagg["planner"])
    assert planner.enabled and planner.engine_profile == PROFILE and planner.ttft_ms == 7500.0
    assert planner.window_s == PlannerSettings().window_s  # the shipped window unless asked
    longer = proxy_config(cluster, setup(planner_window=60.0), planner=True, mode="auto")["litellm_disagg"]
    assert PlannerSettings.model_validate(longer["planner"]).window_s == 60.0
    assert planner.window_max_s is None                           # no reach unless asked
    reach = proxy_config(cluster, setup(planner_window_max=60.0), planner=True, mode="auto")["litellm_disagg"]
    assert PlannerSettings.model_validate(reach["planner"]).window_max_s == 60.0
    off = proxy_config(cluster, setup(), planner=False, mode="always")["litellm_disagg"]
    assert off["planner"]["enabled"] is False and off["kv_routing"]["disaggregation"]["mode"] == "always"


def test_the_plot_draws_the_committed_results(tmp_path: Path):
    """``--plot`` redraws docs/img/planner_crossing_real.png from the JSON the docs quote (docs/data/)."""
    import json
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    files = [root / "docs/data/planner_crossing_window10.json", root / "docs/data/planner_crossing_window60.json",
             root / "docs/data/planner_crossing_refutation.json"]
    for f in files:
        data = json.loads(f.read_text())
        arms = {r["arm"] for r in data["results"]}
        assert arms <= {"split", "planner", "both"} and "planner" in arms
        assert len(data["results"]) == 3 * len(arms) and all(r["failures"] == 0 for r in data["results"])
    png = tmp_path / "plot.png"
    done = subprocess.run([sys.executable, "-m", "bench.planner_crossing", "--plot", *(f"{f.stem}={f}" for f in files),
                           "--png", str(png)], cwd=root, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_arms_are_chosen_by_name_and_rotated_per_run():
    assert parse_arms("planner,split") == ["planner", "split"]
    for bad in ("planner,planner", "planner,static", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_arms(bad)
    assert [rotated(["split", "planner"], run) for run in range(3)] == [
        ["split", "planner"], ["planner", "split"], ["split", "planner"]]
    assert rotated(["split", "planner", "both"], 1) == ["planner", "both", "split"]

"""``litellm-disagg profile`` against a real vLLM CPU worker: the command measures decode steps and prompts through
the worker's OpenAI API (the engine's own scheduler, streaming and usage) and prints a profile the planner's
settings take. No timing is asserted (two shared cores): that the engine's answers can be measured at all (usage in
streamed and plain completions, ``ignore_eos``, prompts the prefix cache has not seen) and give a physical profile."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from litellm_disagg.planner.mixing import EngineProfile
from litellm_disagg.planner.settings import PlannerSettings

from .support.procs import WorkerProc

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def worker(tiny_model, tmp_path_factory):
    base = tmp_path_factory.mktemp("profile-vllm")
    proc = WorkerProc("both", tiny_model, base / "registry", base, extra=["--max-num-batched-tokens", "512"])
    try:
        proc.start()
        proc.wait_ready()
        yield proc
    finally:
        proc.kill()


def test_the_command_measures_a_real_engine(worker):
    argv = [sys.executable, "-m", "litellm_disagg.cli", "profile", "--url", worker.url,
            "--max-num-batched-tokens", "512", "--batches", "1,4,8", "--output-tokens", "12",
            "--prompt-tokens", "128,768", "--repeats", "1", "--json"]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout)
    profile = EngineProfile.model_validate(out["engine_profile"])
    assert profile.weight_read_ms > 0 and profile.prefill_tokens_per_s > 0 and profile.max_num_batched_tokens == 512
    assert [p["batch"] for p in out["decode_points"]] == [1, 4, 8]
    # the prompts came out the lengths asked for, as the engine counted them (the words-per-token calibration
    # works with a real tokenizer)
    tokens = [p["prompt_tokens"] for p in out["prefill_points"]]
    assert 0.8 * 128 < tokens[0] < 1.25 * 128 and 0.8 * 768 < tokens[1] < 1.25 * 768
    assert PlannerSettings.model_validate({"engine_profile": out["engine_profile"]}).engine_profile == profile


def test_the_mixing_check_serves_a_mixed_load_on_a_real_engine(worker, tmp_path):
    """``--check-load``: prompts arriving while earlier requests decode, streamed through the real engine; the
    check's figures come out (no timing asserted: what it measured is in docs/benchmarks.md). The profile is given
    (``--profile``), not measured: the tiny model's millisecond steps on a loaded machine can fit no line (a CI run
    got a negative fixed cost from two batch sizes), and the check's mechanics do not depend on its numbers."""
    given = tmp_path / "profile.yaml"
    given.write_text("engine_profile:\n  weight_read_ms: 5.0\n  per_sequence_ms: 0.2\n"
                     "  prefill_tokens_per_s: 20000\n  max_num_batched_tokens: 512\n")
    argv = [sys.executable, "-m", "litellm_disagg.cli", "profile", "--url", worker.url, "--profile", str(given),
            "--check-load", "2", "--check-seconds", "4", "--check-prompt-tokens", "256",
            "--check-output-tokens", "12", "--json"]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout)
    [check] = out["mixing_checks"]
    assert out["engine_profile"]["mixing_correction"] == check["correction"]
    assert check["requests"] >= 1 and check["itl_p_ms"] > 0 and check["correction"] >= 1.0
    # the prompts the length asked for, as the engine counted them; every request's 12 tokens
    assert 0.8 * 256 < check["prompt_tokens_per_s"] * 4 / check["requests"] < 1.25 * 256
    assert check["output_tokens_per_s"] * 4 == 12 * check["requests"]

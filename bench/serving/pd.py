"""``python -m bench.serving.pd``: routing over a prefill pool and a decode pool, through the real LiteLLM proxy.

    flock -x /tmp/ld-cpu.lock .venv/bin/python -m bench.serving.pd --prefill 4 --decode 4 --runs 3
    flock -x /tmp/ld-vllm.lock flock -x /tmp/ld-cpu.lock .venv/bin/python -m bench.serving.pd --backend vllm

Simulated workers (``litellm_disagg.sim``, KV events on) in two pools, or real vLLM CPU workers (``--backend vllm``:
``litellm-disagg worker --role prefill|decode``, SmolLM2-135M, NixlConnector, KV events on; 1 prefill + 2 decode by
default, and sizes that fit two cores: 16 requests per arm at 0.25/s over four ~800-token documents; every pair's
NIXL handshake is done before the first arm). Every arm runs the same seeded schedule, arms interleaved within each
run (run 1: every arm, run 2: every arm, ...), the order rotated by one arm per run (so no arm always runs first),
prefix caches emptied before each arm. The KV arms' proxies serve their metrics, and each KV arm prints its decisions:
the mean predicted remote and local cost (``predicted_remote``/``predicted_local``, both priced for every request), the
measured TTFT per path (``ttft_disaggregated``, ``ttft_local_prefill``), local prefills by reason and the fitted lines.
``--shared-compute`` sets the KV arms' ``disaggregation.shared_compute`` (default: for vllm, as ``litellm-disagg up``
computes it for one-thread engines on this machine's cores; 0 for sim).

| arm                  | prefill worker             | decode worker              | remote or local prefill        |
|----------------------|----------------------------|----------------------------|--------------------------------|
| ``pd_kv_precise``    | KV-aware (index from events) | KV-aware                 | cost model (``mode: auto``)    |
| ``pd_kv_approximate``| KV-aware (index from the router's own decisions) | KV-aware | cost model               |
| ``pd_least_inflight``| fewest in flight           | fewest in flight           | always remote (the old default) |
| ``pd_round_robin``   | rotating                   | rotating                   | always remote                  |
| ``pd_oracle``        | sticky per prefix key      | sticky per prefix key      | remote the first time a key is seen, then local on its decode worker |

The first four are litellm-disagg's strategy in the proxy (``kv_routing.enabled`` true or false). LiteLLM's own
strategies know nothing of prefill and decode, so they have no P/D arm. The oracle is the client itself: it calls the
pinned prefill worker (vLLM's NixlConnector protocol, as the orchestrator would) and then the pinned decode worker
with the transfer parameters, directly, without the proxy (so it does not pay the proxy's hop: a bound, not a peer).
Its TTFT counts from before its prefill call.

Prints one table per run and the ranges (min-max over runs) per arm; writes ``<out>/serving_pd_<workload>.json`` and
``.png`` (TTFT p50/p99 ranges, hit rate, share of requests prefilled remotely).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import math
import os
import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import httpx

from bench.serving import breakdown, cli, cold_placement, loadgen, proxy, workloads
from bench.serving.arms import Arm, ArmName, Placement
from bench.serving.engine_traces import SpanCollector
from bench.serving.loadgen import RequestResult
from bench.serving.redis_server import redis_server
from bench.serving.report import percentile
from bench.serving.trace_source import TraceSource
from bench.serving.variants import ONE, Variant
from bench.serving.workers import SIM_TOKENIZER, Worker, read_counters, reset_prefix_caches, start_vllm
from bench.serving.workloads import Schedule, Session, conversation
from litellm_disagg.discovery.file.registry import FileRegistry
from litellm_disagg.engines.base import Endpoint
from litellm_disagg.engines.vllm.transfer import build_prefill_body, parse_transfer_params
from litellm_disagg.http_client import pooled_client
from litellm_disagg.ports import free_port
from litellm_disagg.processes import spawn, stop
from litellm_disagg.stack_config import shared_compute_share

PD_ARMS = ("pd_kv_precise", "pd_kv_approximate", "pd_least_inflight", "pd_round_robin", "pd_oracle")
MODEL = "sim-model"

DEFAULTS: dict[str, dict[str, Any]] = {
    "sim": dict(prefill=4, decode=4, requests=120, rate=8.0, documents=16, prefix_words=2000, question_words=60,
                max_tokens=24),
    # Two cores for three one-thread engines: a cold ~1k-token prompt took SmolLM2 about 4 s to prefill (smoke run,
    # load 5), a transfer 0.1-0.8 s; 0.5 requests/s over ~1.1k-token documents queued every arm to 7-12 s TTFT.
    "vllm": dict(prefill=1, decode=2, requests=16, rate=0.25, documents=4, prefix_words=350, question_words=25,
                 max_tokens=12),
}
"""Per backend, what an option left out means."""


@dataclass
class Pools:
    registry_dir: Path
    prefill: list[Worker]
    decode: list[Worker]
    procs: list[Any]
    request_log: Path | None = None
    """The workers' per-request traces (``litellm_disagg/sim/request_log.py``), for ``breakdown.py``; None for vLLM."""
    model: str = MODEL
    """Served model name."""
    tokenizer: str = SIM_TOKENIZER
    """What the KV-aware proxy tokenizes with: the model directory, or the simulator's ``python:`` factory."""
    spans: SpanCollector | None = None
    """Real vLLM workers: the receiver of their OpenTelemetry spans (``engine_traces.py``); None without."""
    roles: dict[str, str] = field(default_factory=dict)
    """Worker id to role, for the spans."""

    @property
    def all(self) -> list[Worker]:
        return [*self.prefill, *self.decode]

    @property
    def traces(self) -> TraceSource:
        """Where the pools' per-request traces are read (the simulator's log, or the vLLM workers' spans)."""
        return TraceSource(self.request_log, self.spans, self.roles)

    def close(self) -> None:
        for proc in self.procs:
            stop(proc, timeout_s=60)
        if self.spans is not None:
            self.spans.close()


def start_pools(run_dir: Path, *, prefill: int, decode: int, speedup: float, blocks: int, block_size: int) -> Pools:
    import sys

    registry = run_dir / "registry"
    argv = [sys.executable, "-m", "litellm_disagg.sim", "--prefill", str(prefill), "--decode", str(decode),
            "--both", "0", "--model", MODEL, "--name", "pd", "--registry-dir", str(registry), "--kv-events",
            "--speedup", str(speedup), "--num-gpu-blocks", str(blocks), "--block-size", str(block_size),
            "--max-model-len", "32768", "--drain-settle", "0", "--log-level", "WARNING",
            "--request-log", str(run_dir / "requests.jsonl")]
    proc = spawn(argv, log=run_dir / "sim.log")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        configs = asyncio.run(FileRegistry(registry).snapshot()) if registry.exists() else []
        ready = sorted((c for c in configs if c.model == MODEL and c.routable), key=lambda c: c.worker_id)
        p = [Worker(c.worker_id, c.server_url) for c in ready if c.role.value == "prefill"]
        d = [Worker(c.worker_id, c.server_url) for c in ready if c.role.value == "decode"]
        if len(p) >= prefill and len(d) >= decode:
            return Pools(registry, p[:prefill], d[:decode], [proc], run_dir / "requests.jsonl")
        if proc.poll() is not None:
            raise RuntimeError(f"the simulator exited (see {run_dir / 'sim.log'})")
        time.sleep(0.5)
    stop(proc, timeout_s=30)
    raise TimeoutError("the simulated pools did not register")


def start_vllm_pools(run_dir: Path, *, prefill: int, decode: int, model_dir: str, served: str, kv_cache_mib: int,
                     max_model_len: int, engine_traces: bool = False) -> Pools:
    """Real vLLM CPU workers, ``prefill`` with role prefill and ``decode`` with role decode (NixlConnector pull),
    registered in one file registry; their pools as discovery lists them."""
    roles = ["prefill"] * prefill + ["decode"] * decode
    workers = start_vllm(run_dir, count=len(roles), model_dir=model_dir, served=served, kv_cache_mib=kv_cache_mib,
                         max_model_len=max_model_len, roles=roles, engine_traces=engine_traces)
    try:
        configs = asyncio.run(FileRegistry(workers.registry_dir).snapshot())
        role = {c.worker_id: c.role.value for c in configs}
        p = [w for w in workers.workers if role.get(w.worker_id) == "prefill"]
        d = [w for w in workers.workers if role.get(w.worker_id) == "decode"]
        if (len(p), len(d)) != (prefill, decode):
            raise RuntimeError(f"discovery lists {len(p)} prefill and {len(d)} decode workers, not {prefill}+{decode}")
    except BaseException:
        workers.close()
        raise
    return Pools(workers.registry_dir, p, d, list(workers.procs), None, served, model_dir, workers.spans,
                 dict(workers.roles))


async def connect_pairs(pools: Pools) -> None:
    """One short disaggregated request per (prefill, decode) pair, straight to the workers (NixlConnector protocol):
    a pair's first transfer includes the decode worker's NIXL handshake with the prefill worker (up to seconds on a
    busy CPU), which would otherwise land in whichever arm runs first. Not measured; caches are emptied before every
    arm."""
    async with httpx.AsyncClient(timeout=300) as client:
        for p in pools.prefill:
            for d in pools.decode:
                name = f"pd-connect-{p.worker_id}-{d.worker_id}"
                body: dict[str, Any] = {"model": pools.model, "max_tokens": 2, "temperature": 0,
                                        "messages": [{"role": "user", "content": f"{name}: " + "hello there " * 40}]}
                r = await client.post(f"{p.server_url}/v1/chat/completions", headers={"X-Request-Id": name},
                                      json=build_prefill_body(Endpoint.CHAT, pools.model, body))
                r.raise_for_status()
                body["kv_transfer_params"] = parse_transfer_params(r.json()).for_decode()
                r = await client.post(f"{d.server_url}/v1/chat/completions", headers={"X-Request-Id": name}, json=body)
                r.raise_for_status()


KV_ARMS = ("pd_kv_precise", "pd_kv_approximate")


def proxy_config(arm: str, pools: Pools, *, shared_compute: float = 0.0,
                 metrics_port: int | None = None) -> dict[str, Any]:
    """The arm's proxy config. ``shared_compute``: the KV arms' ``disaggregation.shared_compute`` (the share of a
    remote prefill's compute the decode workers lose, as ``litellm-disagg up`` computes it for engines on one machine);
    ``metrics_port``: serve the plugin's metrics there."""
    kv: dict[str, Any]
    if arm in KV_ARMS:
        kv = {"enabled": True, "disaggregation": {"mode": "auto", "shared_compute": shared_compute},
              "tokenizer": {"model_dirs": {pools.model: pools.tokenizer}},
              "index": {"mode": "precise" if arm == "pd_kv_precise" else "approximate"}}
        picker = "least_inflight"
    else:
        kv = {"enabled": False}
        picker = "round_robin" if arm == "pd_round_robin" else "least_inflight"
    section: dict[str, Any] = {
        "registry": {"backend": "file", "path": str(pools.registry_dir), "poll_interval_s": 0.25},
        "picker": picker,
        "kv_routing": kv,
    }
    if metrics_port is not None:
        section["metrics"] = {"port": metrics_port}
    return {
        "general_settings": {"master_key": "os.environ/LITELLM_MASTER_KEY"},
        "litellm_settings": {"drop_params": False, "request_timeout": 600, "callbacks": ["litellm_disagg.plugin.handler"]},
        "router_settings": {"num_retries": 1, "timeout": 600},
        "model_list": [],
        "litellm_disagg": section,
    }


_DECISION_SERIES = {
    "litellm_disagg_prefill_cost_estimate_seconds": "option",
    "litellm_disagg_time_to_first_token_seconds": "mode",
    "litellm_disagg_prefill_backlog_tokens": "option",
}


async def scrape_decisions(url: str) -> dict[str, float]:
    """The proxy's decision figures (``observability/metrics.py``) as flat counters: ``<series>:<label>:sum|count``
    for the cost estimates per option and the TTFT per mode, ``local:<reason>`` for the local prefills by reason,
    ``fit:<gauge>:<phase>`` for the cost model's current lines, ``prompt_tokens:<role>`` and
    ``cached_prompt_tokens:<role>`` summed over workers. Two scrapes' difference is one arm's share."""
    async with httpx.AsyncClient(timeout=10) as client:
        return decision_figures((await client.get(url)).text)


def decision_figures(text: str) -> dict[str, float]:
    """``scrape_decisions``'s figures from one page of the proxy's metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name, labels = sample.name, sample.labels
            for series, label in _DECISION_SERIES.items():
                for suffix in ("_sum", "_count"):
                    if name == series + suffix:
                        key = f"{series.removeprefix('litellm_disagg_')}:{labels.get(label, '')}:{suffix[1:]}"
                        out[key] = out.get(key, 0.0) + sample.value
            if name in ("litellm_disagg_prompt_tokens_total", "litellm_disagg_cached_prompt_tokens_total"):
                key = f"{name.removeprefix('litellm_disagg_').removesuffix('_total')}:{labels.get('role', '')}"
                out[key] = out.get(key, 0.0) + sample.value
            if name == "litellm_disagg_local_prefills_total":
                out[f"local:{labels.get('reason', '')}"] = out.get(f"local:{labels.get('reason', '')}", 0.0) + sample.value
            if name in ("litellm_disagg_cost_model_tokens_per_second", "litellm_disagg_cost_model_overhead_seconds"):
                out[f"fit:{name.removeprefix('litellm_disagg_cost_model_')}:{labels.get('phase', '')}"] = sample.value
            if name == "litellm_disagg_cost_model_decode_time_weight":
                out[f"fit:decode_time_weight:{labels.get('source', '')}"] = sample.value
            if name in ("litellm_disagg_cost_model_decode_gap_seconds", "litellm_disagg_cost_model_decode_gaps"):
                out[f"fit:{name.removeprefix('litellm_disagg_cost_model_')}:{labels.get('kind', '')}"] = sample.value
    return out


def decision_summary(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """One arm's means from two scrapes: predicted remote and local cost over all its decisions (both options are
    priced for every request), measured TTFT per path (``disaggregated``: remote prefill; ``local_prefill``), counts,
    and the fitted lines at the end."""
    def delta(key: str) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)

    summary: dict[str, float] = {}
    for prefix, what, unit in (("prefill_cost_estimate_seconds", "predicted", "s"),
                               ("time_to_first_token_seconds", "ttft", "s"), ("prefill_backlog_tokens", "backlog", "tokens")):
        for key in sorted(k for k in after if k.startswith(prefix + ":") and k.endswith(":count")):
            label = key.split(":")[1]
            n = delta(key)
            if n > 0:
                summary[f"{what}_{label}_n"] = n
                summary[f"{what}_{label}_mean_{unit}"] = delta(f"{prefix}:{label}:sum") / n
    for role in ("decode", "prefill"):  # the share of the prompt the router saw cached on the worker it chose
        prompt = delta(f"prompt_tokens:{role}")
        if prompt > 0:
            summary[f"seen_cached_{role}"] = delta(f"cached_prompt_tokens:{role}") / prompt
    for key in after:
        if key.startswith("local:") and delta(key) > 0:
            summary[key] = delta(key)
        elif key.startswith("fit:"):
            summary[key] = after[key]
    return summary


def replicas_summary(before: list[dict[str, float]], after: list[dict[str, float]]) -> dict[str, float]:
    """``decision_summary`` over several replicas: counts and sums added up, then the means; each replica's fitted
    lines and local-prefill reasons under its index (``fit:...#1``), as they are its own. One replica: unchanged."""
    if len(after) == 1:
        return decision_summary(before[0], after[0])

    def added(scrapes: list[dict[str, float]]) -> dict[str, float]:
        total: dict[str, float] = {}
        for scrape in scrapes:
            for key, value in scrape.items():
                if not key.startswith("fit:"):
                    total[key] = total.get(key, 0.0) + value
        return total

    summary = decision_summary(added(before), added(after))
    for i, (b, a) in enumerate(zip(before, after, strict=True)):
        for key, value in decision_summary(b, a).items():
            if key.startswith(("fit:", "local:")) or key.endswith("_n"):
                summary[f"{key}#{i}"] = value
    return summary


async def run_oracle(schedule: Schedule, pools: Pools, *, max_tokens: int) -> tuple[list[RequestResult], float]:
    """The client as router: sticky placement per prefix key in both pools, remote the first time a key is seen."""
    p_place, d_place = Placement("oracle", len(pools.prefill)), Placement("oracle", len(pools.decode))
    seen: set[str] = set()
    results: list[RequestResult] = []
    timeout = httpx.Timeout(600, connect=10)
    clients = [pooled_client(base_url=w.server_url, timeout=timeout, max_connections=1000,
                             max_keepalive_connections=1000) for w in pools.decode]
    prefill_client = pooled_client(timeout=timeout, max_connections=1000, max_keepalive_connections=1000)
    try:
        t0 = time.monotonic()

        async def one_session(session: Session) -> None:
            await asyncio.sleep(max(0.0, session.start_s - (time.monotonic() - t0)))
            answers: list[str] = []
            for index, turn in enumerate(session.turns):
                name = loadgen.request_name(session, index)
                body: dict[str, Any] = {"model": pools.model, "messages": conversation(session, index, answers),
                                        "max_tokens": max_tokens, "temperature": 0, "stream": True}
                headers = {"X-Request-Id": name}  # both halves under one id, as the router sends them
                d = d_place.pick(turn.prefix_key)
                started = time.monotonic()
                if turn.prefix_key not in seen:
                    seen.add(turn.prefix_key)
                    p = pools.prefill[p_place.pick(turn.prefix_key)]
                    r = await prefill_client.post(f"{p.server_url}/v1/chat/completions", headers=headers,
                                                  json=build_prefill_body(Endpoint.CHAT, pools.model, body))
                    if r.status_code == 200:
                        body["kv_transfer_params"] = parse_transfer_params(r.json()).for_decode()
                prefill_s = time.monotonic() - started
                result, answer = await loadgen._one(clients[d], body | {"user": name}, headers, session, index, t0)
                result = dataclasses.replace(
                    result, start_s=result.start_s - prefill_s, latency_s=result.latency_s + prefill_s,
                    sent_at=result.sent_at - prefill_s,
                    ttft_s=None if result.ttft_s is None else result.ttft_s + prefill_s)
                results.append(result)
                if result.error is not None:
                    return
                answers.append(answer)
                if index + 1 < len(session.turns):
                    await asyncio.sleep(session.think_s)

        await asyncio.gather(*(one_session(s) for s in schedule.sessions))
        wall = time.monotonic() - t0
    finally:
        await prefill_client.aclose()
        for c in clients:
            await c.aclose()
    return results, wall


@dataclass
class PDFigures:
    arm: str
    run: int
    requests: int
    completed: int
    ttft_p50_ms: float
    ttft_p99_ms: float
    itl_p50_ms: float
    e2e_p50_ms: float
    hit_rate: float
    """Prompt tokens found in a prefix cache / looked up, over both pools (engine counters)."""
    remote_share: float
    """Requests the prefill pool served / requests completed: the share prefilled remotely."""
    prefill_imbalance: float
    decode_imbalance: float
    """Busiest worker's requests / the pool's mean (1.0: even)."""
    first_errors: list[str] = field(default_factory=list)
    ttft_parts_p50_ms: dict[str, float] = field(default_factory=dict)
    """The p50 of each part of TTFT (``breakdown.PARTS``) over the arm's requests."""
    ttft_parts_mean_ms: dict[str, float] = field(default_factory=dict)
    """TTFT's mean and each part's (``breakdown.means``): the parts add up to TTFT's."""
    slowest: list[dict[str, object]] = field(default_factory=list)
    """The breakdowns of the slowest 2% of requests by TTFT (``breakdown.Breakdown``)."""
    cold_placement: dict[str, object] = field(default_factory=dict)
    """Cold prompts that arrived while every worker of their pool computed one, and how many went to the one that
    finished first (``cold_placement.ColdPlacement``)."""
    reuse: float | None = None
    """Prompt tokens served without being computed, each request counted once: 1 - the tokens any worker computed
    (``prompt_tokens_by_source{source="local_compute"}``) / the prompt tokens the decode pool served. ``hit_rate``
    counts a remote prefill's prompt twice (looked up on its prefill worker, and again on its decode worker, where the
    pulled part is a miss), so it falls as the remote share rises even where no work is repeated."""
    decisions: dict[str, float] = field(default_factory=dict)
    """KV arms: the proxy's predicted costs against measured TTFT per path (``decision_summary``)."""


def figures(arm: str, run: int, results: list[RequestResult], pools: Pools, before: dict[str, dict[str, float]],
            after: dict[str, dict[str, float]]) -> PDFigures:
    ok = [r for r in results if r.error is None]

    def delta(worker: str, name: str) -> float:
        return after[worker][name] - before[worker][name]

    def imbalance(workers: list[Worker]) -> float:
        counts = [delta(w.worker_id, "requests_finished") for w in workers]
        mean = statistics.mean(counts) if counts else 0.0
        return max(counts) / mean if mean else 0.0

    queries = sum(delta(w, "prefix_cache_queries") for w in after)
    hits = sum(delta(w, "prefix_cache_hits") for w in after)
    remote = sum(delta(w.worker_id, "requests_finished") for w in pools.prefill)
    served = sum(delta(w.worker_id, "prompt_tokens") for w in pools.decode)
    computed = sum(delta(w, "computed_tokens") for w in after)
    return PDFigures(
        arm=arm, run=run, requests=len(results), completed=len(ok),
        ttft_p50_ms=percentile([r.ttft_s for r in ok if r.ttft_s is not None], 0.5) * 1e3,
        ttft_p99_ms=percentile([r.ttft_s for r in ok if r.ttft_s is not None], 0.99) * 1e3,
        itl_p50_ms=percentile([r.itl_s for r in ok if r.itl_s is not None], 0.5) * 1e3,
        e2e_p50_ms=percentile([r.latency_s for r in ok], 0.5) * 1e3,
        hit_rate=hits / queries if queries else 0.0,
        remote_share=remote / len(ok) if ok else 0.0,
        prefill_imbalance=imbalance(pools.prefill), decode_imbalance=imbalance(pools.decode),
        first_errors=[r.error for r in results if r.error is not None][:3],
        reuse=1.0 - computed / served if served and not math.isnan(computed) else None,
    )


def run_arm(arm: str, run: int, schedule: Schedule, pools: Pools, args: argparse.Namespace, run_dir: Path,
            variant: Variant = ONE) -> PDFigures:
    """One arm's figures, and the breakdown of its slowest requests' TTFT printed. ``variant``: through how many
    proxy replicas, sharing a Redis or not (``args.redis_port``); its label joins the arm's name past one proxy."""
    source = pools.traces
    mark = source.mark()
    row, results = _run_arm(arm, run, schedule, pools, args, run_dir, variant)
    if variant != ONE:
        row = dataclasses.replace(row, arm=f"{arm} {variant.label}")
    if source.empty:
        return row
    traces = source.since(mark)
    parts = breakdown.join(results, traces)
    print(breakdown.table(f"{row.arm} (run {run})", parts), flush=True)
    placed = cold_placement.cold_placement(traces)
    print(placed.line(), flush=True)
    return dataclasses.replace(row, ttft_parts_p50_ms=breakdown.medians(parts), cold_placement=dataclasses.asdict(placed),
                               ttft_parts_mean_ms=breakdown.means(parts),
                               slowest=[dataclasses.asdict(b) for b in breakdown.slowest(parts)])


def _run_arm(arm: str, run: int, schedule: Schedule, pools: Pools, args: argparse.Namespace,
             run_dir: Path, variant: Variant) -> tuple[PDFigures, list[RequestResult]]:
    asyncio.run(reset_prefix_caches(pools.all))
    if arm == "pd_oracle":
        time.sleep(0.5)
        before = asyncio.run(read_counters(pools.all))
        results, _ = asyncio.run(run_oracle(schedule, pools, max_tokens=args.max_tokens))
        after = asyncio.run(read_counters(pools.all))
        return figures(arm, run, results, pools, before, after), results
    # Each KV replica serves its decisions on a metrics port of its own.
    metrics_ports = [free_port() for _ in range(variant.proxies)] if arm in KV_ARMS else None
    config = proxy_config(arm, pools, shared_compute=args.shared_compute)
    if variant.redis:
        config["router_settings"] |= {"redis_host": "127.0.0.1", "redis_port": args.redis_port}
        if args.shared_inflight:
            config.setdefault("litellm_disagg", {})["shared_inflight"] = json.loads(args.shared_inflight)
    if getattr(args, "kv_routing", None) and arm in KV_ARMS:  # one level deep: {"load": {...}} adds to the arm's load section
        kv = config["litellm_disagg"]["kv_routing"]
        for name, value in json.loads(args.kv_routing).items():
            kv[name] = kv.get(name, {}) | value if isinstance(value, dict) else value
    label = f"{arm}-{run}" + ("" if variant == ONE else f"-{variant.label[1:]}")
    servers = proxy.start_replicas(config, run_dir, label, model=pools.model, count=variant.proxies, timeout_s=600,
                                   metrics_ports=metrics_ports)
    server = servers[0]
    metrics_urls = [f"http://127.0.0.1:{port}/metrics" for port in metrics_ports or []]
    decisions_before: list[dict[str, float]] = []
    try:
        time.sleep(1.0)  # discovery, KV event subscriptions and the load scraper catch up
        for each in servers:
            asyncio.run(warm_up(each.base_url, each.key, pools, words=args.warm_up_words))
        time.sleep(0.5)  # the warm-up's in-flight entries end
        asyncio.run(reset_prefix_caches(pools.all))
        time.sleep(0.5)  # the AllBlocksCleared events reach the router
        before = asyncio.run(read_counters(pools.all))
        if metrics_urls:
            decisions_before = [asyncio.run(scrape_decisions(url)) for url in metrics_urls]
        results, _ = asyncio.run(loadgen.run(schedule, arm=Arm(cast(ArmName, arm), {}),
                                             base_url=[each.base_url for each in servers], key=server.key,
                                             model=pools.model, workers=len(pools.decode),
                                             max_tokens=args.max_tokens))
        after = asyncio.run(read_counters(pools.all))
        decisions: dict[str, float] = {}
        if metrics_urls:
            time.sleep(0.5)  # the last requests' TTFT and ends are recorded
            decisions = replicas_summary(decisions_before, [asyncio.run(scrape_decisions(url)) for url in metrics_urls])
            print(f"{arm} (run {run}) decisions: " + ", ".join(f"{k}={v:.3g}" for k, v in decisions.items()),
                  flush=True)
    finally:
        for each in servers:
            each.close()
    row = figures(arm, run, results, pools, before, after)
    return dataclasses.replace(row, decisions=decisions), results


async def warm_up(base_url: str, key: str, pools: Pools, *, rounds: int = 2, words: int = 600) -> None:
    """Before an arm is measured, as ``bench.serving`` warms up its proxies: ``rounds`` waves of one streamed request
    per decode worker, each prompt unique and long enough for a remote prefill, so that the proxy's first calls to
    every worker, its tokenizer's first prompts and the orchestrator's first prefills are behind it (without it, the
    first two or three measured requests of the KV arms took 0.9-1.1 s, 300-400 ms of it before the prefill and as
    much between the prefill and the decode, and set the arms' p99). Not measured; the prefix caches are emptied
    after it. Each proxy its own prompts: with the same ones, every replica after the first found them held by a
    decode worker and prefilled 4 tokens locally, which is not the warm-up it was meant to be."""
    rng = random.Random(f"pd-warm-up {base_url}")
    async with httpx.AsyncClient(base_url=base_url, timeout=300) as client:

        async def one(i: int) -> None:
            text = " ".join(rng.choice(("ka", "ri", "to", "na", "me", "so")) + str(rng.randrange(1000))
                            for _ in range(words))
            body = {"model": pools.model, "max_tokens": 2, "stream": True,
                    "messages": [{"role": "user", "content": f"warm-up {i}: {text}"}]}
            async with client.stream("POST", "/v1/chat/completions", json=body,
                                     headers={"Authorization": f"Bearer {key}"}) as r:
                if r.status_code != 200:
                    raise RuntimeError(f"warm-up request failed: {r.status_code} {(await r.aread())[:300]!r}")
                async for _ in r.aiter_lines():
                    pass

        for wave in range(rounds):
            await asyncio.gather(*(one(wave * len(pools.decode) + i) for i in range(len(pools.decode))))


def table(rows: list[PDFigures]) -> str:
    head = (f"{'arm':18s} {'run':>3s} {'ok/all':>7s} {'TTFT p50':>9s} {'TTFT p99':>9s} {'ITL p50':>8s} {'e2e p50':>8s} "
            f"{'hit rate':>8s} {'reuse':>6s} {'remote':>7s} {'P imbal':>7s} {'D imbal':>7s}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r.arm:18s} {r.run:3d} {f'{r.completed}/{r.requests}':>7s} {r.ttft_p50_ms:7.0f}ms "
                     f"{r.ttft_p99_ms:7.0f}ms {r.itl_p50_ms:6.1f}ms {r.e2e_p50_ms:6.0f}ms {r.hit_rate:8.1%} "
                     f"{'-' if r.reuse is None else format(r.reuse, '.1%'):>6s} {r.remote_share:7.0%} {r.prefill_imbalance:7.2f} {r.decode_imbalance:7.2f}")
        lines += [f"{'':18s} error: {e}" for e in r.first_errors]
    return "\n".join(lines)


RANGED = ("ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "e2e_p50_ms", "hit_rate", "remote_share", "prefill_imbalance",
          "decode_imbalance")


def ranges(rows: list[PDFigures]) -> dict[str, dict[str, tuple[float, float]]]:
    out: dict[str, dict[str, tuple[float, float]]] = {}
    for arm in dict.fromkeys(r.arm for r in rows):
        mine = [r for r in rows if r.arm == arm]
        out[arm] = {k: (min(getattr(r, k) for r in mine), max(getattr(r, k) for r in mine)) for k in RANGED}
    return out


def ranges_table(rows: list[PDFigures]) -> str:
    """Markdown: one row per arm, each figure as min-max over the runs."""
    def fmt(lo: float, hi: float, spec: str, scale: float = 1.0, unit: str = "") -> str:
        a, b = format(lo * scale, spec), format(hi * scale, spec)
        return f"{a}{unit}" if a == b else f"{a}-{b}{unit}"

    lines = ["| arm | runs | TTFT p50 (ms) | TTFT p99 (ms) | ITL p50 (ms) | e2e p50 (ms) | hit rate | prefilled remotely "
             "| prefill imbal. | decode imbal. | failed |", "|---" * 11 + "|"]
    for arm, rng in ranges(rows).items():
        mine = [r for r in rows if r.arm == arm]
        failed = sum(r.requests - r.completed for r in mine)
        lines.append(
            f"| {arm} | {len(mine)} | {fmt(*rng['ttft_p50_ms'], '.0f')} | {fmt(*rng['ttft_p99_ms'], '.0f')} | "
            f"{fmt(*rng['itl_p50_ms'], '.1f')} | {fmt(*rng['e2e_p50_ms'], '.0f')} | {fmt(*rng['hit_rate'], '.1f', 100, '%')} | "
            f"{fmt(*rng['remote_share'], '.0f', 100, '%')} | {fmt(*rng['prefill_imbalance'], '.2f')} | "
            f"{fmt(*rng['decode_imbalance'], '.2f')} | {failed} |")
    return "\n".join(lines)


def plot(rows: list[PDFigures], title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rng = ranges(rows)
    arms = list(rng)
    x = list(range(len(arms)))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for offset, key, label in ((-0.2, "ttft_p50_ms", "p50"), (0.2, "ttft_p99_ms", "p99")):
        lo = [rng[a][key][0] for a in arms]
        hi = [rng[a][key][1] for a in arms]
        axes[0].bar([i + offset for i in x], hi, width=0.4, label=f"{label} (bar: worst run)", alpha=0.8)
        axes[0].scatter([i + offset for i in x], lo, color="black", s=12, zorder=3)
    axes[0].set_yscale("log")
    axes[0].set_ylabel("ms (dot: best run)")
    axes[0].set_title("time to first token")
    axes[0].legend(fontsize=8)
    for ax, key, label in ((axes[1], "hit_rate", "prefix-cache hit rate (%)"),
                           (axes[2], "remote_share", "prefilled remotely (%)")):
        lo = [rng[a][key][0] * 100 for a in arms]
        hi = [rng[a][key][1] * 100 for a in arms]
        ax.bar(x, hi, color="tab:green" if key == "hit_rate" else "tab:purple")
        ax.scatter(x, lo, color="black", s=12, zorder=3)
        ax.set_title(label)
    for ax in axes:
        ax.set_xticks(x, [a.removeprefix("pd_").replace("_", "\n") for a in arms], fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.serving.pd", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=["sim", "vllm"], default="sim")
    p.add_argument("--prefill", type=int)
    p.add_argument("--decode", type=int)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--first-run", type=int, default=1,
                   help="number of the first run (its arm order: run_order), to continue a set over invocations")
    p.add_argument("--arms", default=",".join(PD_ARMS), help="comma-separated, from: " + ", ".join(PD_ARMS))
    p.add_argument("--workload", default="shared", choices=workloads.WORKLOADS)
    p.add_argument("--requests", type=int)
    p.add_argument("--rate", type=float)
    p.add_argument("--documents", type=int)
    p.add_argument("--prefix-words", type=int)
    p.add_argument("--question-words", type=int)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--think", type=float, default=0.5)
    p.add_argument("--max-tokens", type=int)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="bench/results")
    p.add_argument("--proxies", default="1",
                   help="comma-separated proxy replica counts, each arm through each (the oracle through none); N r "
                        "(e.g. 2r): N replicas sharing a redis-server the benchmark starts (LiteLLM's router_settings)")
    p.add_argument("--shared-inflight",
                   help="JSON for the replicas' litellm_disagg.shared_inflight where they share a Redis "
                        "(e.g. '{\"interval_s\": 0.02}')")
    p.add_argument("--kv-routing",
                   help="JSON added to the KV arms' litellm_disagg.kv_routing, one level deep "
                        "(e.g. '{\"load\": {\"advance_scrapes\": false}}')")
    p.add_argument("--shared-compute", type=float,
                   help="the KV arms' disaggregation.shared_compute, 0-1 (default: for vllm, the share by which the "
                        "one-thread engines outnumber this machine's cores, as `litellm-disagg up` computes it: 1/3 "
                        "for 1P+2D on 2 cores; 0 for sim, whose workers have modeled hardware each)")
    cli.add_worker_arguments(p, kv_cache_mib=768)
    args = p.parse_args(argv)
    for name, value in DEFAULTS[args.backend].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    try:
        args.variants = [Variant.parse(n) for n in args.proxies.split(",")]
    except ValueError:
        raise SystemExit("--proxies takes counts >= 1, each optionally followed by r (with Redis)") from None
    args.warm_up_words = 600 if args.backend == "sim" else 250
    if args.shared_compute is None:
        args.shared_compute = 0.0 if args.backend == "sim" else shared_compute_share(
            device="cpu", cpus=os.cpu_count() or 1, threads_per_engine=1, engines=args.prefill + args.decode)
    for arm in args.arms.split(","):
        if arm not in PD_ARMS:
            raise SystemExit(f"unknown arm {arm!r}; choose from {', '.join(PD_ARMS)}")
    return args


def start(args: argparse.Namespace, run_dir: Path) -> Pools:
    if args.backend == "sim":
        return start_pools(run_dir, prefill=args.prefill, decode=args.decode, speedup=args.speedup,
                           blocks=args.blocks, block_size=args.block_size)
    model_dir = args.model_dir
    if model_dir is None:
        from litellm_disagg.models.smollm2 import prepare_smollm2

        model_dir = str(prepare_smollm2())
    pools = start_vllm_pools(run_dir, prefill=args.prefill, decode=args.decode, model_dir=model_dir,
                             served=args.served_model_name, kv_cache_mib=args.kv_cache_mib,
                             max_model_len=args.max_model_len, engine_traces=args.engine_traces)
    try:
        asyncio.run(connect_pairs(pools))
    except BaseException:
        pools.close()
        raise
    return pools


def run_order(arms: list[str], run: int) -> list[str]:
    """Run ``run``'s arm order (1-based): the list rotated by ``run - 1``, so that no arm always runs first (or
    right after the workers' start)."""
    k = (run - 1) % len(arms) if arms else 0
    return arms[k:] + arms[:k]


def main(argv: list[str] | None = None) -> list[PDFigures]:
    args = parse_args(argv)
    arms = args.arms.split(",")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    run_dir = cli.new_run_dir("serving-pd-")
    shape = cli.shape_from_args(args)
    schedule = workloads.build(args.workload, shape, seed=args.seed)
    pools = start(args, run_dir)
    rows: list[PDFigures] = []
    with contextlib.ExitStack() as stack:
        stack.callback(pools.close)
        args.redis_port = (stack.enter_context(redis_server(run_dir / "redis"))
                           if any(v.redis for v in args.variants) else None)
        for run in range(args.first_run, args.first_run + args.runs):
            for arm in run_order(arms, run):
                for variant in args.variants if arm != "pd_oracle" else [ONE]:
                    print(f"[run {run}] {arm} {variant.label} ...", flush=True)
                    rows.append(run_arm(arm, run, schedule, pools, args, run_dir, variant))
            print(table([r for r in rows if r.run == run]), flush=True)
    kind = "simulated workers" if args.backend == "sim" else f"vLLM CPU workers ({pools.model})"
    title = (f"{args.workload}: {schedule.requests} requests at {args.rate:g}/s, {args.prefill}P+{args.decode}D "
             f"{kind}, {args.runs} runs")
    print(f"\n{title}\n{ranges_table(rows)}")
    stem = out / (f"serving_pd_{args.workload}" if args.backend == "sim" else f"serving_pd_vllm_{args.workload}")
    stem.with_suffix(".json").write_text(json.dumps(
        {"meta": {k: v for k, v in vars(args).items() if k not in ("out", "variants")},
         "runs": [dataclasses.asdict(r) for r in rows]},
        indent=2))
    plot(rows, title, stem.with_suffix(".png"))
    print(f"wrote {stem}.json and {stem}.png", flush=True)
    return rows


if __name__ == "__main__":
    main()

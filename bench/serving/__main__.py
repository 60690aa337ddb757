"""``python -m bench.serving``: compare routing strategies through the real LiteLLM proxy on one set of workers.

    .venv/bin/python -m bench.serving --backend sim --workload all
    .venv/bin/python -m bench.serving --backend vllm --workload multi-turn

For each workload, every arm (see ``arms.py``) runs the same seeded schedule against the same workers, one after
another, with the workers' prefix caches emptied before each arm. Prints one table per workload (TTFT p50/p99,
inter-token latency, end-to-end latency, prefix-cache hit rate, throughput, per-worker balance) and how the
KV-aware arm compares with each reference; writes ``<out>/serving_<backend>_<workload>.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import time
from pathlib import Path

import httpx

from bench.serving import arms as arms_mod
from bench.serving import breakdown, cli, cold_placement, loadgen, probe_report, profiling, proxy, report, workloads
from bench.serving.workers import (
    WorkerSet,
    engine_time_means_ms,
    read_counters,
    reset_prefix_caches,
    start_sim,
    start_vllm,
    warm_engines,
)

DEFAULTS = {
    # backend: (workers, requests, rate, prefix words, question words, max tokens, turns, think)
    "sim": dict(workers=8, requests=160, rate=8.0, prefix_words=4000, question_words=60, max_tokens=24, turns=4,
                think=0.5),
    "vllm": dict(workers=3, requests=48, rate=0.6, prefix_words=350, question_words=25, max_tokens=12, turns=4,
                 think=0.5),
}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.serving", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=["sim", "vllm"], default="sim")
    p.add_argument("--workload", default="all",
                   help="comma-separated, from: " + ", ".join(workloads.WORKLOADS) + "; or all")
    p.add_argument("--arms", default=",".join(arms_mod.DEFAULT_ARMS),
                   help="comma-separated, from: " + ", ".join(arms_mod.ARMS) + " (default: all but oracle_plugin)")
    p.add_argument("--workers", type=int)
    p.add_argument("--requests", type=int, help="requests per arm")
    p.add_argument("--rate", type=float, help="requests per second (Poisson arrivals)")
    p.add_argument("--turns", type=int, help="turns per multi-turn conversation")
    p.add_argument("--think", type=float, help="seconds between a conversation's turns")
    p.add_argument("--prefix-words", type=int, help="system prompt / shared document length, in words")
    p.add_argument("--question-words", type=int)
    p.add_argument("--documents", type=int, default=4, help="shared documents (skewed: twice as many)")
    p.add_argument("--zipf", type=float, default=workloads.Shape.zipf_s,
                   help="skewed: Zipf exponent of the documents' popularity (higher: hotter top document)")
    p.add_argument("--max-tokens", type=int)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--proxies", type=int, default=1,
                   help="proxy replicas per arm, same config; sessions spread over them round robin")
    p.add_argument("--kv-routing", default="{}", help="JSON merged into the KV-aware arm's kv_routing section")
    p.add_argument("--out", default="bench/results")
    p.add_argument("--profile-proxy", action="store_true",
                   help="sample each arm's proxy with py-spy while the load runs (raw stacks in the run directory)")
    p.add_argument("--probe-proxy", action="store_true",
                   help="load bench/serving/probe.py into each arm's proxy: proxy_in split by stage, event-loop lag, "
                        "GC, per-thread and machine CPU (printed after each arm; simulated workers only)")
    cli.add_worker_arguments(p, kv_cache_mib=1024)
    args = p.parse_args()
    for name, value in DEFAULTS[args.backend].items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    return args


def start_workers(args: argparse.Namespace, run_dir: Path) -> WorkerSet:
    if args.backend == "sim":
        return start_sim(run_dir, count=args.workers, speedup=args.speedup, blocks=args.blocks,
                         block_size=args.block_size)
    model_dir = args.model_dir
    if model_dir is None:
        from litellm_disagg.models.smollm2 import prepare_smollm2

        model_dir = str(prepare_smollm2())
    return start_vllm(run_dir, count=args.workers, model_dir=model_dir, served=args.served_model_name,
                      kv_cache_mib=args.kv_cache_mib, max_model_len=args.max_model_len,
                      engine_traces=args.engine_traces)


async def warm_up(base_url: str, key: str, model: str, workers: int) -> None:
    """A few short requests (first calls load code paths in the proxy), not measured."""
    async with httpx.AsyncClient(base_url=base_url, timeout=300) as client:
        for i in range(workers):
            r = await client.post("/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                                  json={"model": model, "max_tokens": 2,
                                        "messages": [{"role": "user", "content": f"warm-up {i}"}]})
            if r.status_code != 200:
                raise RuntimeError(f"warm-up request failed: {r.status_code} {r.text[:300]}")


def run_arm(name: arms_mod.ArmName, schedule: workloads.Schedule, workers: WorkerSet, args: argparse.Namespace,
            run_dir: Path) -> report.ArmFigures:
    arm = arms_mod.build(name, workers, kv_routing=json.loads(args.kv_routing),
                         redis_port=getattr(args, "redis_port", None))
    probing = getattr(args, "probe_proxy", False)
    if probing:
        probe_file = probe_report.enable(arm.config, run_dir, f"{schedule.workload}-{name}")
    asyncio.run(reset_prefix_caches(workers.workers))
    count = getattr(args, "proxies", 1)
    label = f"{schedule.workload}-{name}" if count == 1 else f"{schedule.workload}-{name}-x{count}"
    if getattr(args, "redis_port", None) is not None:
        label += "-redis"
    servers = proxy.start_replicas(arm.config, run_dir, label, model=workers.model, count=count)
    key = servers[0].key
    try:
        for server in servers:
            asyncio.run(warm_up(server.base_url, key, workers.model, len(workers.workers)))
        time.sleep(1.0)  # discovery and the load scraper catch up; in-flight entries of the warm-up end
        asyncio.run(reset_prefix_caches(workers.workers))
        time.sleep(0.5)  # the AllBlocksCleared events reach the router
        before = asyncio.run(read_counters(workers.workers))
        source = workers.traces
        mark = source.mark()
        samplers = [profiling.start(s.proc.pid, run_dir / f"profile-{label}-{i}.txt")
                    for i, s in enumerate(servers)] if getattr(args, "profile_proxy", False) else []
        cpu_before = sum(s.cpu_seconds() for s in servers)
        threads_before = probe_report.thread_cpu(servers[0].proc.pid) if probing else {}
        load_started = time.monotonic()
        machine_before = probe_report.machine_cpu() if probing else (0.0, 0.0)
        client_before = proxy.process_cpu_seconds(os.getpid())
        workers_cpu_before = sum(proxy.process_cpu_seconds(p.pid) for p in workers.procs)
        results, wall = asyncio.run(loadgen.run(schedule, arm=arm, base_url=[s.base_url for s in servers], key=key,
                                                model=workers.model, workers=len(workers.workers),
                                                max_tokens=args.max_tokens))
        proxy_cpu = sum(s.cpu_seconds() for s in servers) - cpu_before
        load_ended = time.monotonic()
        machine_after = probe_report.machine_cpu() if probing else (0.0, 0.0)
        client_cpu = proxy.process_cpu_seconds(os.getpid()) - client_before
        threads_after = probe_report.thread_cpu(servers[0].proc.pid) if probing else {}
        workers_cpu = sum(proxy.process_cpu_seconds(p.pid) for p in workers.procs) - workers_cpu_before
        for sampler in samplers:
            print(f"  proxy profile: {profiling.stop(sampler)}", flush=True)
        after = asyncio.run(read_counters(workers.workers))
    finally:
        for server in servers:
            server.close()
    row = dataclasses.replace(report.figures(name, results, wall, before, after), proxy_cpu_s=proxy_cpu,
                              workers_cpu_s=workers_cpu, engine_means_ms=engine_time_means_ms(before, after))
    if source.empty:
        return row
    traces = source.since(mark)
    parts = breakdown.join(results, traces)
    print(breakdown.table(name, parts), flush=True)
    placed = cold_placement.cold_placement(traces)
    print(placed.line(), flush=True)
    if probing:
        print(probe_report.summary(name, probe_file, results, traces, (load_started, load_ended), threads_before,
                                   threads_after), flush=True)
        print(probe_report.machine_line(machine_before, machine_after, proxy_cpu, workers_cpu, client_cpu), flush=True)
    return dataclasses.replace(row, ttft_parts_p50_ms=breakdown.medians(parts), cold_placement=dataclasses.asdict(placed),
                               ttft_parts_mean_ms=breakdown.means(parts),
                               slowest=[dataclasses.asdict(b) for b in breakdown.slowest(parts)])


def warm_if_real(args: argparse.Namespace, workers: WorkerSet) -> None:
    """Real engines' first prefills of a size are slower than later ones: send them the workload's sizes first."""
    if args.backend != "vllm":
        return
    print("warming the engines (not measured) ...", flush=True)
    asyncio.run(warm_engines(workers.workers, workers.model, max_tokens=args.max_tokens,
                             prompt_words=args.prefix_words + args.question_words))


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.WARNING)
    arm_names: list[arms_mod.ArmName] = []
    for name in args.arms.split(","):
        if name not in arms_mod.ARMS:
            raise SystemExit(f"unknown arm {name!r}; choose from {', '.join(arms_mod.ARMS)}")
        arm_names.append(name)  # type: ignore[arg-type]
    chosen = list(workloads.WORKLOADS) if args.workload == "all" else args.workload.split(",")
    for workload in chosen:
        if workload not in workloads.WORKLOADS:
            raise SystemExit(f"unknown workload {workload!r}; choose from {', '.join(workloads.WORKLOADS)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    run_dir = cli.new_run_dir(f"serving-{args.backend}-")
    workers = start_workers(args, run_dir)
    try:
        warm_if_real(args, workers)
        for workload in chosen:
            shape = cli.shape_from_args(args)
            schedule = workloads.build(workload, shape, seed=args.seed)  # type: ignore[arg-type]
            rows = []
            for name in arm_names:
                print(f"[{workload}] {name} ...", flush=True)
                rows.append(run_arm(name, schedule, workers, args, run_dir))
            title = (f"{workload}: {schedule.requests} requests at {args.rate:g}/s over {args.workers} "
                     f"{'simulated' if args.backend == 'sim' else 'vLLM CPU'} workers ({workers.model})")
            print(f"\n{title}\n{report.table(rows)}")
            for line in report.verdicts(rows):
                print(line)
            stem = out / f"serving_{args.backend}_{workload}"
            meta = {"backend": args.backend, "workload": workload, "model": workers.model,
                    **{k: v for k, v in vars(args).items() if k not in ("out",)}}
            report.save(rows, meta, stem.with_suffix(".json"))
            report.plot(rows, title, stem.with_suffix(".png"))
            print(f"wrote {stem}.json and {stem}.png\n", flush=True)
    finally:
        workers.close()


if __name__ == "__main__":
    main()

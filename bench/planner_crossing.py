"""Does the planner's crossing to aggregated serving, decided from a *measured* engine profile, pay on real workers?

    .venv/bin/python -m bench.planner_crossing [--runs 3] [--load 0.5] [--seconds 150] [--profile FILE]

Real: two vLLM CPU workers (SmolLM2-135M-Instruct, ``litellm-disagg worker --switchable``, one thread each), NIXL
between them, the real LiteLLM proxy on the shipped ``proxy_config.yaml`` (KV routing on, every prompt prefilled
remotely or locally as the per-request decision says: ``--mode``, the shipped ``auto`` by default), a file registry.

1. ``litellm-disagg profile`` measures one of the workers (``--profile-runs`` runs, the median kept), unless
   ``--profile`` gives a profile this command measured before (its ``profile.json``).
2. The load and the SLOs follow from that profile, so the question is the same on a faster or slower machine:
   Poisson arrivals of ``--prompt-tokens`` prompts of fresh random words (no prefix-cache hit) and
   ``--output-tokens`` streamed outputs, at ``--load`` times what one worker prefills a second by the profile;
   a TTFT SLO of ``--ttft-x`` times one prompt's prefill alone, an ITL SLO of ``--itl-x`` times a lone decode step.
3. Per run, three arms in a rotated order, each ``--seconds`` of the same arrival times on a fresh proxy:
   ``split`` (1 prefill + 1 decode, no planner), ``both`` (both workers ``both``, no planner) and ``planner``: the
   split, and after ``--planner-after`` seconds of its load ``litellm-disagg planner`` started on its own with the
   shipped planner settings, this run's SLOs and the measured profile (an operator turning the planner on while a
   split is loaded; a planner running from idle would have moved both workers to ``both`` on ``low_load`` before
   the load came). Whatever it does is recorded from the registry every 0.5 s and from its decision log lines.

Reports per arm: requests, failures, TTFT and ITL (a request's mean time per output token after its first)
percentiles, and SLO attainment (both SLOs met, DistServe's definition); for the planner arm, when it moved and the
attainment before its first move and after its last. ``--out`` writes it all as JSON. Take both locks on a shared
machine (``flock -x /tmp/ld-vllm.lock flock -x /tmp/ld-cpu.lock``): the engines share two cores with the proxy.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.serving import proxy as proxy_mod
from bench.serving.arms import Arm
from bench.serving.cli import new_run_dir
from bench.serving.loadgen import RequestResult
from bench.serving.loadgen import run as run_load
from bench.serving.workers import VLLM_WORKER_ENV, Worker, warm_engines
from bench.serving.workloads import Schedule, Session, Turn
from litellm_disagg.discovery.file.registry import FileRegistry
from litellm_disagg.planner.mixing import EngineProfile, aggregated_estimate
from litellm_disagg.planner.profiler import ProfileTarget, Words, tokens_per_word
from litellm_disagg.processes import interrupt_on_sigterm, spawn, stop, wait_until
from litellm_disagg.runtime_config import WorkerRole
from litellm_disagg.workers.wrapper import free_port

ROOT = Path(__file__).resolve().parents[1]
MODEL = "smollm2"
BUDGET = 2048
ARMS = ("split", "planner", "both")
LAYOUTS = {"split": (WorkerRole.PREFILL, WorkerRole.DECODE), "planner": (WorkerRole.PREFILL, WorkerRole.DECODE),
           "both": (WorkerRole.BOTH, WorkerRole.BOTH)}


@dataclass(frozen=True)
class Setup:
    """What the profile sets: the load and the SLOs (module docstring, step 2)."""

    profile: EngineProfile
    rate: float
    ttft_ms: float
    itl_ms: float
    prompt_tokens: int
    output_tokens: int
    window_s: float | None = None
    """The planner's ``window_s`` (None: the shipped one)."""
    window_max_s: float | None = None
    """The planner's ``window_max_s`` (None: the shipped one, no reach)."""

    @classmethod
    def of(cls, profile: EngineProfile, args: argparse.Namespace) -> Setup:
        prompt_s = args.prompt_tokens / profile.prefill_tokens_per_s
        return cls(profile, args.load / prompt_s, args.ttft_x * 1000.0 * prompt_s,
                   args.itl_x * profile.step_ms(0, 1), args.prompt_tokens, args.output_tokens,
                   getattr(args, "planner_window", None), getattr(args, "planner_window_max", None))


@dataclass
class ArmResult:
    arm: str
    run: int
    requests: int
    failures: int
    ttft_p50_ms: float | None
    ttft_p90_ms: float | None
    itl_p50_ms: float | None
    itl_p90_ms: float | None
    attainment: float
    role_changes: list[tuple[float, str, str]] = field(default_factory=list)
    """(seconds since the load started, worker, role published)."""
    moves: list[dict[str, Any]] = field(default_factory=list)
    """The planner's decisions that moved a worker (its log lines' fields)."""
    attainment_before_first_move: float | None = None
    attainment_after_last_move: float | None = None
    proxy_cpu_s: float = 0.0


@dataclass
class Cluster:
    run_dir: Path
    registry: Path
    workers: list[Worker]
    procs: list[subprocess.Popen[bytes]]
    model_dir: Path

    def close(self) -> None:
        for proc in self.procs:
            stop(proc, timeout_s=60)


def start_workers(run_dir: Path, model_dir: Path) -> Cluster:
    registry = run_dir / "registry"
    procs, ids = [], []
    for i, role in enumerate(("prefill", "decode")):
        worker_id = f"w{i}"
        argv = [sys.executable, "-m", "litellm_disagg.cli", "worker", "--role", role, "--switchable",
                "--model", str(model_dir), "--served-model-name", MODEL, "--kv-cache-mib", "768",
                "--max-model-len", "2048", "--registry-dir", str(registry), "--worker-id", worker_id,
                "--kv-events-port", str(free_port()), "--heartbeat-interval", "1",
                "--", "--max-num-seqs", "16", "--max-num-batched-tokens", str(BUDGET)]
        procs.append(spawn(argv, env=dict(os.environ, **VLLM_WORKER_ENV), log=run_dir / f"{worker_id}.log"))
        ids.append(worker_id)

    def ready() -> list[Worker] | None:
        configs = asyncio.run(FileRegistry(registry).snapshot()) if registry.exists() else []
        live = {c.worker_id: c for c in configs if c.routable}
        if any(p.poll() is not None for p in procs):
            raise RuntimeError(f"a worker exited before registering; logs in {run_dir}")
        return [Worker(i, live[i].server_url) for i in ids] if all(i in live for i in ids) else None

    try:
        wait_until(lambda: ready() is not None, timeout_s=900, interval_s=1.0, what="both workers to register")
    except BaseException:
        for proc in procs:
            stop(proc, timeout_s=30)
        raise
    workers = ready()
    assert workers is not None
    return Cluster(run_dir, registry, workers, procs, model_dir)


def measure_profile(cluster: Cluster, runs: int) -> EngineProfile:
    """``litellm-disagg profile`` against the decode worker (idle, as is the other one), its defaults otherwise."""
    argv = [sys.executable, "-m", "litellm_disagg.cli", "profile", "--url", cluster.workers[1].server_url,
            "--max-num-batched-tokens", str(BUDGET), "--runs", str(runs), "--json"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=3600, cwd=ROOT)
    (cluster.run_dir / "profile.out").write_text(done.stdout + "\n" + done.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"profile failed: {done.stderr[-2000:]}")
    profile = EngineProfile.model_validate(json.loads(done.stdout)["engine_profile"])
    (cluster.run_dir / "profile.json").write_text(profile.model_dump_json())
    return profile


async def set_roles(cluster: Cluster, roles: tuple[WorkerRole, ...]) -> None:
    registry = FileRegistry(cluster.registry)
    try:
        for worker, role in zip(cluster.workers, roles, strict=True):
            current = {c.worker_id: c.role for c in await registry.snapshot()}
            if current.get(worker.worker_id) is not role:
                await registry.request_role(worker.worker_id, role)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            current = {c.worker_id: c.role for c in await registry.snapshot()}
            if all(current.get(w.worker_id) is r for w, r in zip(cluster.workers, roles, strict=True)):
                return
            await asyncio.sleep(0.2)
        raise TimeoutError(f"roles {roles} not published")
    finally:
        await registry.close()


def proxy_config(cluster: Cluster, setup: Setup, *, planner: bool, mode: str) -> dict[str, Any]:
    config = yaml.safe_load((ROOT / "proxy_config.yaml").read_text())
    disagg = config["litellm_disagg"]
    disagg["registry"] = {**disagg["registry"], "path": str(cluster.registry)}
    kv = disagg["kv_routing"]
    kv["disaggregation"] = {**(kv.get("disaggregation") or {}), "mode": mode}
    kv["tokenizer"] = {**(kv.get("tokenizer") or {}), "model_dirs": {MODEL: str(cluster.model_dir)}}
    disagg["planner"] = {**disagg["planner"], "enabled": planner, "ttft_ms": setup.ttft_ms, "itl_ms": setup.itl_ms,
                         "engine_profile": setup.profile.model_dump()}
    if setup.window_s is not None:
        disagg["planner"]["window_s"] = setup.window_s
    if setup.window_max_s is not None:
        disagg["planner"]["window_max_s"] = setup.window_max_s
    return config


def start_planner(cluster: Cluster, setup: Setup, proxy: proxy_mod.Proxy, name: str) -> tuple[subprocess.Popen[bytes], Path]:
    """``litellm-disagg planner`` on its own (the shipped planner settings, this run's SLOs and measured profile),
    reading the proxy's ``/metrics/`` page and the workers' pages, acting through the registry."""
    config = proxy_config(cluster, setup, planner=True, mode="auto")
    path = cluster.run_dir / f"planner-{name}.yaml"
    path.write_text(yaml.safe_dump({"litellm_disagg": {"registry": config["litellm_disagg"]["registry"],
                                                       "planner": config["litellm_disagg"]["planner"]}}))
    log = cluster.run_dir / f"planner-{name}.log"
    argv = [sys.executable, "-m", "litellm_disagg.cli", "planner", "--config", str(path),
            "--proxy-metrics", f"{proxy.base_url}/metrics/", "--metrics-key", proxy.key]
    return spawn(argv, env=dict(os.environ, LITELLM_DISAGG_LOG_LEVEL="INFO"), log=log), log


def schedule(setup: Setup, words_per_prompt: int, seconds: float, seed: int) -> Schedule:
    """Seeded Poisson arrivals (the same times in every arm of a run); every prompt new words."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    sessions, t, i = [], rng.expovariate(setup.rate), 0
    while t < seconds:
        text = " ".join("".join(rng.choices(letters, k=rng.randint(3, 8))) for _ in range(words_per_prompt))
        sid = f"r{seed}-{i}"
        sessions.append(Session(sid, t, (Turn(sid, sid, ({"role": "user", "content": text},)),), 0.0))
        t += rng.expovariate(setup.rate)
        i += 1
    return Schedule("crossing", tuple(sessions))  # type: ignore[arg-type]


def quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, max(0, round(q * (len(values) - 1))))]


def attainment(results: list[RequestResult], setup: Setup) -> float:
    if not results:
        return float("nan")
    met = sum(1 for r in results if r.error is None and r.ttft_s is not None
              and 1000 * r.ttft_s <= setup.ttft_ms and (r.itl_s is None or 1000 * r.itl_s <= setup.itl_ms))
    return met / len(results)


async def watch_roles(cluster: Cluster, t0: float, out: list[tuple[float, str, str]], stop_event: asyncio.Event) -> None:
    registry = FileRegistry(cluster.registry)
    last: dict[str, str] = {}
    try:
        while not stop_event.is_set():
            for c in await registry.snapshot():
                if last.get(c.worker_id) not in (None, c.role.value):
                    out.append((round(time.monotonic() - t0, 1), c.worker_id, c.role.value))
                last[c.worker_id] = c.role.value
            await asyncio.sleep(0.5)
    finally:
        await registry.close()


def decisions(log: Path) -> list[dict[str, Any]]:
    text = log.read_text(errors="replace") if log.exists() else ""
    return [json.loads(line.split("planner decision ", 1)[1]) for line in text.splitlines()
            if "planner decision " in line]


async def run_arm(cluster: Cluster, setup: Setup, arm: str, run: int, sched: Schedule, *, mode: str,
                  planner_after_s: float) -> ArmResult:
    await set_roles(cluster, LAYOUTS[arm])
    name = f"{arm}-{run}"
    proxy = await asyncio.to_thread(proxy_mod.start, proxy_config(cluster, setup, planner=False, mode=mode),
                                    cluster.run_dir, name, model=MODEL, timeout_s=600)
    planner: subprocess.Popen[bytes] | None = None
    planner_log: Path | None = None
    try:
        async with httpx.AsyncClient(base_url=proxy.base_url, timeout=600,
                                     headers={"Authorization": f"Bearer {proxy.key}"}) as client:
            for i in range(2):  # the proxy's first requests load its tokenizer; not measured
                r = await client.post("/v1/chat/completions", json={
                    "model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": f"warm {name} {i}"}]})
                r.raise_for_status()
        cpu0 = proxy.cpu_seconds()
        changes: list[tuple[float, str, str]] = []
        stop_event = asyncio.Event()
        t0 = time.monotonic()
        watcher = asyncio.create_task(watch_roles(cluster, t0, changes, stop_event))
        load = asyncio.create_task(run_load(sched, arm=Arm(arm, {}), base_url=proxy.base_url,  # type: ignore[arg-type]
                                            key=proxy.key, model=MODEL, workers=2, max_tokens=setup.output_tokens))
        try:
            if arm == "planner":
                await asyncio.wait([load], timeout=planner_after_s)
                if not load.done():
                    planner, planner_log = start_planner(cluster, setup, proxy, name)
            results, _ = await load
        finally:
            stop_event.set()
            await watcher
            if planner is not None:
                await asyncio.to_thread(stop, planner, timeout_s=30)
        cpu = proxy.cpu_seconds() - cpu0
    finally:
        await asyncio.to_thread(proxy.close)
    ok = [r for r in results if r.error is None]
    ttfts = [1000 * r.ttft_s for r in ok if r.ttft_s is not None]
    itls = [1000 * r.itl_s for r in ok if r.itl_s is not None]
    result = ArmResult(arm, run, len(results), len(results) - len(ok), quantile(ttfts, 0.5), quantile(ttfts, 0.9),
                       quantile(itls, 0.5), quantile(itls, 0.9), attainment(results, setup), changes,
                       proxy_cpu_s=round(cpu, 1))
    if arm == "planner":
        result.moves = [d for d in decisions(planner_log) if d["moves"]] if planner_log is not None else []
        if changes:
            first, last = changes[0][0], changes[-1][0]
            result.attainment_before_first_move = attainment([r for r in results if r.start_s < first], setup)
            result.attainment_after_last_move = attainment([r for r in results if r.start_s >= last], setup)
    return result


def rotated(arms: Sequence[str], run: int) -> list[str]:
    """The arms in run ``run``'s order: each run starts one arm later (a slow start or a warm cache is spread)."""
    k = run % len(arms)
    return [*arms[k:], *arms[:k]]


def parse_arms(text: str) -> list[str]:
    """``--arms``: comma-separated names of ``ARMS``, each once."""
    arms = [a.strip() for a in text.split(",") if a.strip()]
    unknown = [a for a in arms if a not in ARMS]
    if not arms or unknown or len(set(arms)) != len(arms):
        raise argparse.ArgumentTypeError(f"--arms takes distinct names of {', '.join(ARMS)}: got {text!r}")
    return arms


def fmt(v: float | None, pct: bool = False) -> str:
    if v is None or v != v:
        return "-"
    return f"{100 * v:.0f}%" if pct else f"{v:,.0f}"


def report(setup: Setup, results: list[ArmResult]) -> str:
    p = setup.profile
    lines = [f"profile: weight_read {p.weight_read_ms:.1f} ms, per_sequence {p.per_sequence_ms:.2f} ms, prefill "
             f"{p.prefill_tokens_per_s:.0f} tokens/s, correction {p.mixing_correction:.2f}",
             f"load {setup.rate:.3f} req/s of {setup.prompt_tokens}+{setup.output_tokens} tokens; SLOs TTFT "
             f"{setup.ttft_ms:.0f} ms, ITL {setup.itl_ms:.0f} ms; planner window "
             f"{'shipped' if setup.window_s is None else f'{setup.window_s:.0f} s'}"
             f"{'' if setup.window_max_s is None else f', reaching back up to {setup.window_max_s:.0f} s'}",
             "run | arm | requests | failed | TTFT p50/p90 (ms) | ITL p50/p90 (ms) | attainment | proxy CPU (s) | "
             "moves (s since start: worker -> role)"]
    for r in results:
        moves = ", ".join(f"{t:.0f}: {w} -> {role}" for t, w, role in r.role_changes) or "-"
        extra = ""
        if r.arm == "planner" and r.role_changes:
            extra = (f" (before {fmt(r.attainment_before_first_move, True)}, after "
                     f"{fmt(r.attainment_after_last_move, True)})")
        lines.append(f"{r.run} | {r.arm} | {r.requests} | {r.failures} | {fmt(r.ttft_p50_ms)} / "
                     f"{fmt(r.ttft_p90_ms)} | {fmt(r.itl_p50_ms)} / {fmt(r.itl_p90_ms)} | "
                     f"{fmt(r.attainment, True)}{extra} | {r.proxy_cpu_s} | {moves}")
    for arm in ARMS:
        mine = [r.attainment for r in results if r.arm == arm]
        if mine:
            lines.append(f"{arm}: attainment {fmt(min(mine), True)}-{fmt(max(mine), True)} over {len(mine)} runs "
                         f"(median {fmt(statistics.median(mine), True)})")
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> None:
    from litellm_disagg.models.smollm2 import prepare_smollm2

    model_dir = Path(args.model_dir) if args.model_dir else prepare_smollm2()
    run_dir = new_run_dir("planner-crossing-")
    cluster = await asyncio.to_thread(start_workers, run_dir, model_dir)
    try:
        print(f"workers: {[(w.worker_id, w.server_url) for w in cluster.workers]}", flush=True)
        profile = (args.given_profile if args.given_profile is not None
                   else await asyncio.to_thread(measure_profile, cluster, args.profile_runs))
        setup = Setup.of(profile, args)
        estimate = aggregated_estimate(profile, 2, setup.rate * setup.prompt_tokens, setup.rate * setup.output_tokens)
        print(f"profile {profile.model_dump()}; rate {setup.rate:.3f} req/s; TTFT SLO {setup.ttft_ms:.0f} ms, ITL "
              f"SLO {setup.itl_ms:.0f} ms; the estimate for two both workers: ITL {estimate.itl_ms} ms, prompt "
              f"share {estimate.prefill_busy:.2f}", flush=True)
        async with httpx.AsyncClient(timeout=120) as client:
            per_word = await tokens_per_word(client, ProfileTarget.of(cluster.workers[0].server_url, MODEL), MODEL,
                                             Words(0))
        words = max(1, round(args.prompt_tokens / per_word))
        print(f"{per_word:.2f} tokens a word: {words} words a prompt", flush=True)
        await warm_engines(cluster.workers, MODEL, prompt_words=words // 2, max_tokens=8)
        results: list[ArmResult] = []
        for run in range(args.runs):
            sched = schedule(setup, words, args.seconds, seed=run)
            order = rotated(args.arms, run)
            for arm in order:
                result = await run_arm(cluster, setup, arm, run + 1, sched, mode=args.mode,
                                       planner_after_s=args.planner_after)
                results.append(result)
                print(report(setup, [result]).splitlines()[-2], flush=True)
        print(report(setup, results), flush=True)
        if args.out:
            text = json.dumps({"setup": {**asdict(setup), "profile": profile.model_dump()},
                               "results": [asdict(r) for r in results]}, indent=1)
            await asyncio.to_thread(Path(args.out).write_text, text)
    finally:
        await asyncio.to_thread(cluster.close)


def plot(series: list[tuple[str, dict[str, Any]]], path: Path) -> None:
    """Attainment per arm and run, one panel per series (``--out`` JSON files)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(series), figsize=(5 * len(series), 3.6), sharey=True, squeeze=False)
    for ax, (title, data) in zip(axes[0], series, strict=True):
        results = data["results"]
        runs = sorted({r["run"] for r in results})
        arms = [arm for arm in ARMS if any(r["arm"] == arm for r in results)]
        width = 0.8 / len(arms)
        for i, arm in enumerate(arms):
            values = [next((100 * r["attainment"] for r in results if r["arm"] == arm and r["run"] == run), 0.0)
                      for run in runs]
            ax.bar([run + (i - (len(arms) - 1) / 2) * width for run in runs], values, width, label=arm)
            for run, r in ((r["run"], r) for r in results if r["arm"] == arm and r["role_changes"]):
                ax.annotate("moved", (run + (i - (len(arms) - 1) / 2) * width, 100 * r["attainment"]), ha="center", va="bottom",
                            fontsize=7)
        ax.set_xticks(runs, [f"run {run}" for run in runs])
        ax.set_title(title, fontsize=9)
        ax.set_ylim(0, 110)
    axes[0][0].set_ylabel("SLO attainment (%)")
    labelled = {label: handle for ax in axes[0] for handle, label in zip(*ax.get_legend_handles_labels(), strict=True)}
    axes[0][-1].legend(labelled.values(), labelled.keys(), loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=150.0, help="each arm's arrivals span (150)")
    parser.add_argument("--load", type=float, default=0.5,
                        help="prompt tokens a second as a share of one worker's profiled prefill rate (0.5)")
    parser.add_argument("--planner-after", type=float, default=30.0,
                        help="seconds of load on the split before the planner arm's planner starts (30)")
    parser.add_argument("--prompt-tokens", type=int, default=1024)
    parser.add_argument("--output-tokens", type=int, default=32)
    parser.add_argument("--ttft-x", type=float, default=3.0, help="TTFT SLO over one prompt's profiled prefill (3)")
    parser.add_argument("--itl-x", type=float, default=4.0, help="ITL SLO over a lone decode step, profiled (4)")
    parser.add_argument("--planner-window", type=float,
                        help="the planner's window_s (default: the shipped 10 s; at a few requests a minute a 10 s "
                             "window holds fewer first tokens than min_samples)")
    parser.add_argument("--planner-window-max", type=float,
                        help="the planner's window_max_s: a window short of min_samples first tokens reaches back "
                             "for them up to this (default: the shipped setting, no reach)")
    parser.add_argument("--arms", type=parse_arms, default=list(ARMS),
                        help=f"comma-separated arms, rotated per run (default {','.join(ARMS)})")
    parser.add_argument("--mode", choices=("auto", "always", "never"), default="auto",
                        help="kv_routing.disaggregation.mode in every arm (auto: the shipped one, the per-request "
                             "remote-or-local decision; always: a split is a pure split, and both workers prefill "
                             "each other's prompts)")
    parser.add_argument("--profile", help="a profile.json this command wrote (skips the measurement)")
    parser.add_argument("--profile-runs", type=int, default=3)
    parser.add_argument("--model-dir", help="default: SmolLM2-135M-Instruct, prepared offline")
    parser.add_argument("--out", help="write the setup and every arm's figures as JSON here")
    parser.add_argument("--plot", nargs="+", metavar="TITLE=JSON",
                        help="draw --png from earlier --out files instead of measuring")
    parser.add_argument("--png", default="planner_crossing.png")
    args = parser.parse_args()
    if args.plot:
        series = [(title, json.loads(Path(file).read_text()))
                  for title, file in (item.split("=", 1) for item in args.plot)]
        plot(series, Path(args.png))
        return
    args.given_profile = EngineProfile.model_validate_json(Path(args.profile).read_text()) if args.profile else None
    interrupt_on_sigterm()  # a killed run still stops its workers (the finally blocks)
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()

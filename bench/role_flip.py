"""How fast a worker changes pool: a role flip through discovery against stopping it and starting one in the new role.

    .venv/bin/python -m bench.role_flip [--runs 3] [--routing shipped|round_robin]

Real vLLM CPU workers (the tiny test Llama, ``litellm-disagg worker``), the real LiteLLM proxy with the shipped
``proxy_config.yaml`` and a file registry. One switchable worker (``--switchable``, starts as prefill) and one decode
worker; a client sends a short chat every 100 ms (4 at most in flight) through the proxy the whole time.

Per run, interleaved:

- **flip prefill -> decode**: ``Registry.request_role(worker, decode)`` (what the planner calls); clocks stop at the
  worker's publish (the registry entry shows the role) and at the first response the proxy names as served by the
  worker (its ``x-litellm-model-id`` header: a decode deployment only the new role has);
- **flip decode -> prefill**: the same back; the first request served in the new role is the first that completes
  after the worker's count of one-token requests (prefills) grew;
- **restart prefill -> decode**: the decision is taken at SIGTERM of the prefill worker (it drains, leaves, stops
  vLLM), and a new worker is started in the new role at once; the clock stops at the first response it serves. The
  new worker is switchable, so the next run flips it back to prefill (not timed) and starts from the same place.

Each flip also prints what the proxy did with the requests between the decision and the first one served in the
new role (from the plugin's own counters, ``litellm_disagg.metrics.port``): how many went disaggregated and how many
were prefilled locally and why, and which workers each pool chose, so a slow "first served" can be told apart:
the flip (published late) or the routing (requests that did not need the new role). ``--prompt-repeat`` lengthens the
chats (the default is a 70-token prompt with the chat template) for a workload whose prompts may be worth a remote prefill.

Prints one line per measurement and a table of ranges. Take the exclusive CPU lock on a shared machine
(``flock -x /tmp/ld-cpu.lock``): the restart arm is CPU-bound (vLLM start-up).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import yaml

from bench.serving import proxy as proxy_mod
from litellm_disagg.discovery.file.registry import FileRegistry
from litellm_disagg.engines.prom_text import samples
from litellm_disagg.processes import interrupt_on_sigterm, spawn, stop, wait_until
from litellm_disagg.runtime_config import WorkerRole
from litellm_disagg.workers.wrapper import free_port

ROOT = Path(__file__).resolve().parents[1]
MODEL_NAME = "tiny"


@dataclass
class Worker:
    worker_id: str
    port: int
    proc: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def start_worker(run_dir: Path, registry: Path, model_dir: Path, role: str, name: str, *, switchable: bool) -> Worker:
    port = free_port()
    worker_id = f"{name}-{port}"
    argv = [sys.executable, "-m", "litellm_disagg.cli", "worker", "--role", role, "--model", str(model_dir),
            "--served-model-name", MODEL_NAME, "--port", str(port), "--worker-id", worker_id, "--registry-dir",
            str(registry), "--kv-cache-mib", "64", "--max-model-len", "1024", "--heartbeat-interval", "1",
            "--drain-settle", "1", *(["--switchable"] if switchable else []), "--", "--max-num-seqs", "8"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return Worker(worker_id, port, spawn(argv, env=env, log=run_dir / f"{worker_id}.log"))


def published_role(registry: Path, worker_id: str) -> WorkerRole | None:
    for config in asyncio.run(FileRegistry(registry).snapshot()):
        if config.worker_id == worker_id:
            return config.role
    return None


def wait_published(registry: Path, worker: Worker, role: WorkerRole, timeout_s: float = 600) -> None:
    wait_until(lambda: published_role(registry, worker.worker_id) is role, timeout_s=timeout_s, interval_s=0.02,
               alive=lambda: worker.proc.poll() is None, what=f"{worker.worker_id} to publish {role.value}")


def prefills_served(worker: Worker) -> float:
    text = httpx.get(f"{worker.url}/metrics", timeout=10).text
    return sum(s.value for s in samples(text)
               if s.name == "vllm:request_params_max_tokens_bucket" and s.labels.get("le") == "1.0")


@dataclass(frozen=True)
class RoutingCounts:
    """The plugin's routing counters at one moment (its metrics page): requests by mode, local prefills by reason,
    workers chosen by (pool, worker)."""

    modes: dict[str, float]
    local_reasons: dict[str, float]
    routed: dict[tuple[str, str], float]

    @classmethod
    def read(cls, url: str) -> RoutingCounts:
        modes: dict[str, float] = {}
        reasons: dict[str, float] = {}
        routed: dict[tuple[str, str], float] = {}
        for s in samples(httpx.get(url, timeout=10).text):
            if s.name == "litellm_disagg_requests_total":
                modes[s.labels.get("mode", "")] = s.value
            elif s.name == "litellm_disagg_local_prefills_total":
                reasons[s.labels.get("reason", "")] = s.value
            elif s.name == "litellm_disagg_routed_total":
                routed[(s.labels.get("role", ""), s.labels.get("worker", ""))] = s.value
        return cls(modes, reasons, routed)

    def since(self, before: RoutingCounts) -> str:
        """What changed since ``before``, one line: ``disaggregated 3, local_prefill 12 (cost_model 12); prefill:
        switch-1 3; decode: decode-2 15``."""
        def grown(now: dict, then: dict) -> dict:
            return {k: now[k] - then.get(k, 0.0) for k in sorted(now) if now[k] - then.get(k, 0.0) > 0}

        modes = grown(self.modes, before.modes)
        reasons = grown(self.local_reasons, before.local_reasons)
        routed = grown(self.routed, before.routed)
        parts = [", ".join(f"{m} {n:.0f}" for m, n in modes.items()) or "no request routed"]
        if reasons:
            parts[0] += " (local: " + ", ".join(f"{r} {n:.0f}" for r, n in reasons.items()) + ")"
        for pool in ("prefill", "decode"):
            chosen = {worker: n for (role, worker), n in routed.items() if role == pool}
            if chosen:
                parts.append(f"{pool}: " + ", ".join(f"{w} {n:.0f}" for w, n in chosen.items()))
        return "; ".join(parts)


@dataclass
class Completion:
    started: float
    ended: float
    deployment: str
    ok: bool


@dataclass
class Load:
    """A chat every ``interval_s`` through the proxy, at most ``limit`` in flight, every completion recorded."""

    base_url: str
    key: str
    interval_s: float = 0.1
    limit: int = 4
    repeat: int = 4
    done: list[Completion] = field(default_factory=list)

    async def run(self, stop_event: asyncio.Event) -> None:
        sem = asyncio.Semaphore(self.limit)
        tasks: set[asyncio.Task[None]] = set()
        async with httpx.AsyncClient(base_url=self.base_url, timeout=120,
                                     headers={"Authorization": f"Bearer {self.key}"}) as client:
            i = 0
            while not stop_event.is_set():
                await sem.acquire()
                i += 1
                task = asyncio.create_task(self._one(client, i, sem))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                await asyncio.sleep(self.interval_s)
            await asyncio.gather(*tasks)

    async def _one(self, client: httpx.AsyncClient, i: int, sem: asyncio.Semaphore) -> None:
        started = time.time()
        try:
            r = await client.post("/v1/chat/completions", json={
                "model": MODEL_NAME, "max_tokens": 4, "temperature": 0,
                "messages": [{"role": "user", "content": f"Request {i}: which pool serves me? " * self.repeat}]})
            self.done.append(Completion(started, time.time(), r.headers.get("x-litellm-model-id", ""), r.status_code == 200))
        except httpx.HTTPError:
            self.done.append(Completion(started, time.time(), "", False))
        finally:
            sem.release()

    def first_by(self, deployment_suffix: str, after: float) -> float | None:
        ends = [c.ended for c in self.done if c.ok and c.started >= after and c.deployment.endswith(deployment_suffix)]
        return min(ends) if ends else None

    def first_completed_after(self, after: float) -> float | None:
        ends = [c.ended for c in self.done if c.ok and c.started >= after]
        return min(ends) if ends else None


async def in_thread(fn, *args):
    return await asyncio.to_thread(fn, *args)


async def flip_to_decode(registry: Path, worker: Worker, load: Load, metrics_url: str,
                         wait_s: float) -> tuple[float, float | None, str]:
    """Published after, first served after (None: not within ``wait_s``), what the proxy routed meanwhile."""
    before = await in_thread(RoutingCounts.read, metrics_url)
    t0 = time.time()
    await FileRegistry(registry).request_role(worker.worker_id, WorkerRole.DECODE)
    await in_thread(wait_published, registry, worker, WorkerRole.DECODE)
    published = time.time() - t0
    while (first := load.first_by(worker.worker_id, t0)) is None and time.time() - t0 < wait_s:
        await asyncio.sleep(0.02)
    routing = (await in_thread(RoutingCounts.read, metrics_url)).since(before)
    return published, None if first is None else first - t0, routing


async def flip_to_prefill(registry: Path, worker: Worker, load: Load, metrics_url: str,
                          wait_s: float) -> tuple[float, float | None, str]:
    """As ``flip_to_decode``."""
    before = await in_thread(prefills_served, worker)
    counts = await in_thread(RoutingCounts.read, metrics_url)
    t0 = time.time()
    await FileRegistry(registry).request_role(worker.worker_id, WorkerRole.PREFILL)
    await in_thread(wait_published, registry, worker, WorkerRole.PREFILL)
    published = time.time() - t0
    while await in_thread(prefills_served, worker) <= before:
        if time.time() - t0 >= wait_s:
            return published, None, (await in_thread(RoutingCounts.read, metrics_url)).since(counts)
        await asyncio.sleep(0.02)
    grew = time.time()
    # The first request served with this worker as its prefill completes right after its prefill; bound it by the
    # first completion that started after the decision and ended after the prefill count grew.
    while not (ends := [c.ended for c in load.done if c.ok and c.started >= t0 and c.ended >= grew - 0.05]):
        await asyncio.sleep(0.02)
    routing = (await in_thread(RoutingCounts.read, metrics_url)).since(counts)
    return published, min(ends) - t0, routing


async def restart_as_decode(run_dir: Path, registry: Path, model_dir: Path, worker: Worker, load: Load,
                            n: int) -> tuple[Worker, float]:
    t0 = time.time()
    worker.proc.terminate()  # SIGTERM: drain, withdraw, stop vLLM
    new = await asyncio.to_thread(
        functools.partial(start_worker, run_dir, registry, model_dir, "decode", f"restarted{n}", switchable=True))
    await in_thread(lambda: worker.proc.wait(timeout=300))
    while (first := load.first_by(new.worker_id, t0)) is None:
        if new.proc.poll() is not None:
            raise RuntimeError(f"{new.worker_id} exited; see {run_dir}")
        await asyncio.sleep(0.05)
    return new, first - t0


def record(results: dict[str, list[float]], n: int, key: str, flip: tuple[float, float | None, str],
           wait_s: float) -> None:
    """One flip's figures into ``results`` (``key``: ``P->D`` or ``D->P``), and its line."""
    published, first, routing = flip
    results[f"flip {key} published"].append(published)
    if first is None:
        results[f"flip {key} not used"].append(1.0)
    else:
        results[f"flip {key} first served"].append(first)
    served = f"not used within {wait_s:.0f} s" if first is None else f"first served {first:.3f} s"
    print(f"run {n + 1}: flip {key}: published {published:.3f} s, {served}; meanwhile {routing}", flush=True)


async def main_async(args: argparse.Namespace) -> dict[str, list[float]]:
    from litellm_disagg.models.tiny import make_tiny_llama

    model_dir = make_tiny_llama(Path.home() / ".cache" / "litellm-disagg" / "test-models" / "tiny-llama-v1")
    run_dir = Path(tempfile.mkdtemp(prefix="role-flip-"))
    registry = run_dir / "registry"
    print(f"logs: {run_dir}", flush=True)
    switch = start_worker(run_dir, registry, model_dir, "prefill", "switch", switchable=True)
    decode = start_worker(run_dir, registry, model_dir, "decode", "decode", switchable=False)
    workers = [switch, decode]
    results: dict[str, list[float]] = {"flip P->D published": [], "flip P->D first served": [],
                                       "flip D->P published": [], "flip D->P first served": [],
                                       "restart P->D first served": [], "flip P->D not used": [],
                                       "flip D->P not used": []}
    proxy = None
    stop_load = asyncio.Event()
    try:
        for w in workers:
            await in_thread(wait_published, registry, w, WorkerRole.PREFILL if w is switch else WorkerRole.DECODE)
        config = yaml.safe_load((ROOT / "proxy_config.yaml").read_text())
        disagg = config.setdefault("litellm_disagg", {})
        disagg.setdefault("registry", {})["path"] = str(registry)
        metrics_port = free_port()
        disagg["metrics"] = {"port": metrics_port}
        metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        if args.routing == "round_robin":  # the flip's own time, not a picker's choice between two decode workers
            disagg.setdefault("kv_routing", {})["enabled"] = False
            disagg["picker"] = "round_robin"
        proxy = await in_thread(lambda: proxy_mod.start(config, run_dir, "flip", model=MODEL_NAME))
        load = Load(proxy.base_url, proxy.key, repeat=args.prompt_repeat)
        load_task = asyncio.create_task(load.run(stop_load))
        await asyncio.sleep(3)  # steady state
        for n in range(args.runs):
            record(results, n, "P->D", await flip_to_decode(registry, switch, load, metrics_url, args.wait_s),
                   args.wait_s)
            await asyncio.sleep(2)
            record(results, n, "D->P", await flip_to_prefill(registry, switch, load, metrics_url, args.wait_s),
                   args.wait_s)
            await asyncio.sleep(2)
            switch, took = await restart_as_decode(run_dir, registry, model_dir, switch, load, n)
            workers.append(switch)
            results["restart P->D first served"].append(took)
            print(f"run {n + 1}: restart prefill->decode: first served {took:.3f} s", flush=True)
            await FileRegistry(registry).request_role(switch.worker_id, WorkerRole.PREFILL)  # back to the start
            await in_thread(wait_published, registry, switch, WorkerRole.PREFILL)
            await asyncio.sleep(2)
        stop_load.set()
        await load_task
        failed = sum(not c.ok for c in load.done)
        print(f"requests: {len(load.done)} completed, {failed} failed", flush=True)
        results["failed requests"] = [float(failed)]
    finally:
        stop_load.set()
        if proxy is not None:
            proxy.close()
        for w in workers:
            if w.proc.poll() is None:
                stop(w.proc, timeout_s=30)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--routing", choices=["shipped", "round_robin"], default="shipped",
                        help="the shipped config's routing (KV-aware, per-request remote-or-local prefill), or "
                             "round robin with every prompt prefilled remotely: at this light load the shipped "
                             "routing can keep choosing the other decode worker for many seconds, which times the "
                             "picker rather than the flip")
    parser.add_argument("--prompt-repeat", type=int, default=4,
                        help="the chat's sentence repeated this many times (4: about 70 prompt tokens with the "
                             "template; the tiny model's limit is 1,024)")
    parser.add_argument("--wait-s", type=float, default=60.0,
                        help="a flip whose new role serves nothing for this long is reported as not used (the "
                             "routing had no request for it) and the run goes on")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    interrupt_on_sigterm()  # a killed run still stops its workers (the finally blocks)
    results = asyncio.run(main_async(args))
    print("\n| measurement | runs | min | median | max |\n|---|---|---|---|---|")
    for name, values in results.items():
        if name == "failed requests" or not values:
            continue
        if name.endswith("not used"):
            print(f"| {name} within {args.wait_s:.0f} s | {len(values)} | | | |")
            continue
        print(f"| {name} | {len(values)} | {min(values):.2f} s | {statistics.median(values):.2f} s | {max(values):.2f} s |")
    print(f"failed requests: {int(results['failed requests'][0])}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

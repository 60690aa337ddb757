"""Serving benchmark on simulated workers: KV-aware routing against prefix-blind pickers, same workload, same run.

Workloads (seeded):
  multi-turn  conversations that resend their growing history each turn (prefix reuse within a session)
  shared      many independent users over a few long shared system prompts (reuse across sessions)
  unique      unique prompts (control: nothing to reuse)

Arms: kv_aware (kv_routing enabled, every request disaggregated), least_inflight, round_robin. Each arm gets a fresh
simulated cluster (same size, same timing model) and the same request schedule. Prints TTFT p50/p99, end-to-end
latency, the decode pool's prefix-cache hit rate (prompt tokens served from a worker's own cache) and per-worker
balance, and writes bench/results/serving_sim.png.

    .venv/bin/python bench/serving_sim.py [--workload multi-turn] [--sessions 16] [--turns 5] [--decode 4]

Not yet here (see docs/benchmarks.md): LiteLLM's own simple-shuffle, least-busy and session-affinity arms, the oracle,
and runs on real vLLM workers.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from litellm_disagg.runtime_config import WorkerRole  # noqa: E402
from litellm_disagg.settings import DisaggSettings, FileRegistrySettings  # noqa: E402
from litellm_disagg.sim import SimCluster, SimSettings  # noqa: E402
from litellm_disagg.sim.settings import EngineSettings  # noqa: E402
from litellm_disagg.workers.file_registry import FileRegistry  # noqa: E402

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau".split()


def text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def schedule(workload: str, sessions: int, turns: int, seed: int) -> list[list[list[dict[str, str]]]]:
    """Per session, the message list of each turn (each turn resends the history)."""
    rng = random.Random(seed)
    systems = [text(rng, 600) for _ in range(3)]
    out = []
    for s in range(sessions):
        if workload == "unique":
            out.append([[{"role": "user", "content": f"{s}-{t} " + text(rng, 700)}] for t in range(turns)])
            continue
        system = systems[s % len(systems)] if workload == "shared" else f"session {s}: " + text(rng, 600)
        history: list[dict[str, str]] = [{"role": "system", "content": system}]
        per_turn = []
        for t in range(turns):
            history = history + [{"role": "user", "content": f"turn {t}: " + text(rng, 40)}]
            per_turn.append(list(history))
            history = history + [{"role": "assistant", "content": text(rng, 30)}]
        out.append(per_turn)
    return out


@dataclass
class ArmResult:
    arm: str
    ttft: list[float] = field(default_factory=list)
    latency: list[float] = field(default_factory=list)
    failed: int = 0
    hit_rate: float = 0.0
    per_worker: dict[str, int] = field(default_factory=dict)

    def row(self) -> str:
        def pct(values: list[float], q: float) -> float:
            return sorted(values)[min(len(values) - 1, int(q * len(values)))] * 1000 if values else float("nan")

        return (f"{self.arm:15s} TTFT p50 {pct(self.ttft, .5):7.0f} ms  p99 {pct(self.ttft, .99):7.0f} ms  "
                f"e2e p50 {pct(self.latency, .5):7.0f} ms  hit rate {self.hit_rate:5.1%}  failed {self.failed}  "
                f"per decode worker {sorted(self.per_worker.values())}")


async def run_arm(arm: str, plan: list[list[list[dict[str, str]]]], args: argparse.Namespace) -> ArmResult:
    import litellm

    from litellm_disagg.plugin import DisaggPlugin

    workdir = Path(tempfile.mkdtemp(prefix=f"serving-{arm}-"))
    engine = EngineSettings.model_validate({"num_gpu_blocks": args.blocks, "max_model_len": 16384, "block_size": 16})
    sim = SimSettings(engine=engine, kv_events=True).with_speedup(args.speedup)
    cluster = SimCluster(registry=FileRegistry(workdir / "registry"), settings=sim, heartbeat_interval_s=0.2, name=arm)
    plugin = DisaggPlugin()
    router = litellm.Router(model_list=[], num_retries=1)
    result = ArmResult(arm)
    try:
        await cluster.start(prefill=args.prefill, decode=args.decode)
        kv: dict[str, Any] = {"enabled": arm == "kv_aware", "seed": args.seed, "disaggregation": {"mode": "always"}}
        settings = DisaggSettings(
            registry=FileRegistrySettings(path=str(workdir / "registry"), poll_interval_s=0.05),
            picker="round_robin" if arm == "round_robin" else "least_inflight",
            kv_routing=kv,
        )
        controller = await plugin.attach(router, settings)
        while len(controller.pool.decode_candidates(sim.model)) < args.decode:  # noqa: ASYNC110 (a startup poll)
            await asyncio.sleep(0.05)

        async def session(turns: list[list[dict[str, str]]], delay: float) -> None:
            await asyncio.sleep(delay)
            for messages in turns:
                t0 = time.monotonic()
                try:
                    data = {"model": sim.model, "messages": messages, "max_tokens": args.max_tokens, "stream": True}
                    await plugin.async_pre_call_hook(None, None, data, "acompletion")
                    stream = await router.acompletion(**data)
                    first = None
                    async for chunk in stream:
                        if first is None and chunk.choices and chunk.choices[0].delta.content:
                            first = time.monotonic() - t0
                    result.ttft.append(first if first is not None else time.monotonic() - t0)
                    result.latency.append(time.monotonic() - t0)
                except Exception:
                    result.failed += 1
                await asyncio.sleep(args.think)

        rng = random.Random(args.seed)
        await asyncio.gather(*(session(turns, rng.uniform(0, args.ramp)) for turns in plan))
        decode_workers = cluster.workers_with(WorkerRole.DECODE)
        hit = sum(w.engine.stats.prompt_tokens_local_cache_hit for w in decode_workers)
        total = sum(w.engine.stats.prompt_tokens_local_cache_hit + w.engine.stats.prompt_tokens_local_compute
                    + w.engine.stats.prompt_tokens_external_kv_transfer for w in decode_workers)
        result.hit_rate = hit / total if total else 0.0
        result.per_worker = {w.worker_id: w.engine.stats.finished for w in decode_workers}
    finally:
        await plugin.detach()
        await cluster.close()
    return result


def plot(results: list[ArmResult], workload: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    names = [r.arm for r in results]
    p50 = [statistics.median(r.ttft) * 1000 if r.ttft else 0 for r in results]
    p99 = [sorted(r.ttft)[int(0.99 * (len(r.ttft) - 1))] * 1000 if r.ttft else 0 for r in results]
    x = range(len(names))
    ax1.bar([i - 0.2 for i in x], p50, width=0.4, label="TTFT p50")
    ax1.bar([i + 0.2 for i in x], p99, width=0.4, label="TTFT p99")
    ax1.set_xticks(list(x), names)
    ax1.set_ylabel("ms")
    ax1.set_title(f"{workload}: time to first token")
    ax1.legend()
    ax2.bar(names, [r.hit_rate * 100 for r in results])
    ax2.set_ylabel("% of prompt tokens")
    ax2.set_title("decode pool prefix-cache hit rate")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=["multi-turn", "shared", "unique"], default="multi-turn")
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--prefill", type=int, default=2)
    parser.add_argument("--decode", type=int, default=4)
    parser.add_argument("--blocks", type=int, default=3000, help="KV blocks per simulated worker")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--speedup", type=float, default=10.0)
    parser.add_argument("--think", type=float, default=0.3, help="seconds between a session's turns")
    parser.add_argument("--ramp", type=float, default=2.0, help="sessions start at random within this many seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--arms", default="kv_aware,least_inflight,round_robin")
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    plan = schedule(args.workload, args.sessions, args.turns, args.seed)
    results = [asyncio.run(run_arm(arm, plan, args)) for arm in args.arms.split(",")]
    print(f"workload {args.workload}: {args.sessions} sessions x {args.turns} turns, "
          f"{args.prefill}P{args.decode}D simulated workers, speed-up {args.speedup}")
    for r in results:
        print(r.row())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    png = out / f"serving_sim_{args.workload}.png"
    plot(results, args.workload, png)
    print(f"plot: {png}")


if __name__ == "__main__":
    main()

"""Figures of one arm, the comparison table, the JSON record and the PNG."""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench.serving.loadgen import RequestResult


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


@dataclass
class ArmFigures:
    arm: str
    requests: int
    completed: int
    failed: int
    ttft_p50_ms: float
    ttft_p99_ms: float
    itl_p50_ms: float
    e2e_p50_ms: float
    e2e_p99_ms: float
    hit_rate: float
    """Prompt tokens served from the prefix cache / prompt tokens looked up, over all workers (engine counters)."""
    throughput_rps: float
    output_tokens_per_s: float
    per_worker_requests: dict[str, int] = field(default_factory=dict)
    imbalance: float = 0.0
    """Busiest worker's requests / the mean (1.0: perfectly even)."""
    first_errors: list[str] = field(default_factory=list)
    ttft_by_turn_p50_ms: dict[int, float] = field(default_factory=dict)
    """Multi-turn: TTFT p50 of each turn index (the first turn is always cold)."""
    ttft_parts_p50_ms: dict[str, float] = field(default_factory=dict)
    """The p50 of each part of TTFT (``breakdown.PARTS``) over the arm's requests."""
    ttft_parts_mean_ms: dict[str, float] = field(default_factory=dict)
    """TTFT's mean and each part's (``breakdown.means``): the parts add up to TTFT's."""
    slowest: list[dict[str, object]] = field(default_factory=list)
    """The breakdowns of the slowest 2% of requests by TTFT (``breakdown.Breakdown``)."""
    cold_placement: dict[str, object] = field(default_factory=dict)
    """Cold prompts that arrived while every worker computed one, and how many went to the worker that finished
    first (``cold_placement.ColdPlacement``)."""
    proxy_cpu_s: float = 0.0
    """CPU seconds (user + system, all threads) the proxy process(es) used while the arm's load ran."""
    workers_cpu_s: float = 0.0
    """The same for the worker processes (simulated workers: the one process that runs them all)."""
    engine_means_ms: dict[str, float] = field(default_factory=dict)
    """Real vLLM workers: the engine's own mean queue time, prefill time and TTFT over the arm's requests
    (``workers.engine_time_means_ms``)."""


def figures(arm: str, results: list[RequestResult], wall_s: float, before: dict[str, dict[str, float]],
            after: dict[str, dict[str, float]]) -> ArmFigures:
    ok = [r for r in results if r.error is None]
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    itl = [r.itl_s for r in ok if r.itl_s is not None]
    e2e = [r.latency_s for r in ok]

    def delta(worker: str, name: str) -> float:
        return after[worker][name] - before[worker][name]

    queries = sum(delta(w, "prefix_cache_queries") for w in after)
    hits = sum(delta(w, "prefix_cache_hits") for w in after)
    per_worker = {w: round(delta(w, "requests_finished")) for w in after}
    mean = statistics.mean(per_worker.values()) if per_worker else 0
    generated = sum(delta(w, "generation_tokens") for w in after)
    return ArmFigures(
        arm=arm,
        requests=len(results),
        completed=len(ok),
        failed=len(results) - len(ok),
        ttft_p50_ms=percentile(ttft, 0.5) * 1e3,
        ttft_p99_ms=percentile(ttft, 0.99) * 1e3,
        itl_p50_ms=percentile(itl, 0.5) * 1e3,
        e2e_p50_ms=percentile(e2e, 0.5) * 1e3,
        e2e_p99_ms=percentile(e2e, 0.99) * 1e3,
        hit_rate=hits / queries if queries else 0.0,
        throughput_rps=len(ok) / wall_s if wall_s > 0 else 0.0,
        output_tokens_per_s=generated / wall_s if wall_s > 0 else 0.0,
        per_worker_requests=per_worker,
        imbalance=max(per_worker.values()) / mean if mean else 0.0,
        first_errors=[r.error for r in results if r.error is not None][:3],
        ttft_by_turn_p50_ms={
            turn: percentile([r.ttft_s for r in ok if r.turn == turn and r.ttft_s is not None], 0.5) * 1e3
            for turn in sorted({r.turn for r in ok})
        },
    )


def table(rows: list[ArmFigures]) -> str:
    head = (f"{'arm':17s} {'ok/all':>7s} {'TTFT p50':>9s} {'TTFT p99':>9s} {'ITL p50':>8s} {'e2e p50':>8s} "
            f"{'e2e p99':>8s} {'hit rate':>8s} {'req/s':>6s} {'tok/s':>7s} {'imbal.':>6s}  per worker")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r.arm:17s} {f'{r.completed}/{r.requests}':>7s} {r.ttft_p50_ms:7.0f}ms {r.ttft_p99_ms:7.0f}ms "
            f"{r.itl_p50_ms:6.1f}ms {r.e2e_p50_ms:6.0f}ms {r.e2e_p99_ms:6.0f}ms {r.hit_rate:8.1%} "
            f"{r.throughput_rps:6.2f} {r.output_tokens_per_s:7.1f} {r.imbalance:6.2f}  "
            f"{sorted(r.per_worker_requests.values(), reverse=True)}"
        )
        if r.proxy_cpu_s:
            lines.append(f"{'':17s} CPU during the load: proxy {r.proxy_cpu_s:.1f} s, workers {r.workers_cpu_s:.1f} s")
        if r.engine_means_ms:
            means = ", ".join(f"{part} {ms:.0f} ms" for part, ms in r.engine_means_ms.items())
            lines.append(f"{'':17s} engine means: {means}")
        if len(r.ttft_by_turn_p50_ms) > 1:
            by_turn = ", ".join(f"{t}: {v:.0f}" for t, v in r.ttft_by_turn_p50_ms.items())
            lines.append(f"{'':17s} TTFT p50 by turn (ms): {by_turn}")
        lines += [f"{'':17s} error: {e}" for e in r.first_errors]
    return "\n".join(lines)


def verdicts(rows: list[ArmFigures]) -> list[str]:
    """How the KV-aware arm compares with the references the issue names (printed, not asserted)."""
    by = {r.arm: r for r in rows}
    kv = by.get("kv_aware")
    if kv is None:
        return []
    out = []
    for other in ("simple_shuffle", "least_busy", "session_affinity", "round_robin", "oracle", "oracle_plugin"):
        ref = by.get(other)
        if ref is None or not kv.ttft_p50_ms or not ref.ttft_p50_ms:
            continue
        out.append(
            f"kv_aware vs {other:16s}: TTFT p50 {ref.ttft_p50_ms / kv.ttft_p50_ms:5.2f}x lower, "
            f"p99 {ref.ttft_p99_ms / kv.ttft_p99_ms:5.2f}x lower, hit rate {kv.hit_rate:.1%} vs {ref.hit_rate:.1%}"
        )
    return out


def save(rows: list[ArmFigures], meta: dict[str, object], path: Path) -> None:
    path.write_text(json.dumps({"meta": meta, "arms": [asdict(r) for r in rows]}, indent=2))


def plot(rows: list[ArmFigures], title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r.arm.replace("_", "\n") for r in rows]
    x = list(range(len(rows)))
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 4.2))
    ax1.bar([i - 0.2 for i in x], [r.ttft_p50_ms for r in rows], width=0.4, label="p50")
    ax1.bar([i + 0.2 for i in x], [r.ttft_p99_ms for r in rows], width=0.4, label="p99")
    ax1.set_xticks(x, names, fontsize=8)
    ax1.set_ylabel("ms")
    ax1.set_yscale("log")
    ax1.set_title("time to first token")
    ax1.legend()
    ax2.bar(x, [r.hit_rate * 100 for r in rows], color="tab:green")
    ax2.set_xticks(x, names, fontsize=8)
    ax2.set_ylabel("% of prompt tokens")
    ax2.set_title("prefix-cache hit rate")
    for i, r in enumerate(rows):
        shares = sorted(r.per_worker_requests.values(), reverse=True)
        total = sum(shares) or 1
        bottom = 0.0
        for share in shares:
            ax3.bar(i, share / total * 100, bottom=bottom, color="tab:blue", edgecolor="white")
            bottom += share / total * 100
    ax3.set_xticks(x, names, fontsize=8)
    ax3.set_ylabel("% of requests (one block per worker)")
    ax3.set_title("balance across workers")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

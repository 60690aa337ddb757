"""``litellm-disagg top``: a live view of the cluster in the terminal, redrawn in place; and the ``workers`` table.

    litellm-disagg top [--metrics-url http://127.0.0.1:4000/metrics] [--metrics-key KEY] [--interval 2] [--once]
                       [registry flags]

One frame: the pools (per model: workers by role and state), one row per worker (role, state, running and waiting
requests, KV cache usage, prefix-cache hit rate, finished requests and their rate, all from the worker's own
``/metrics``), the proxy's request rate and TTFT / inter-token latency percentiles (from ``--metrics-url``; "n/a"
without it; ``--metrics-key``, default ``$LITELLM_MASTER_KEY``, for LiteLLM's ``/metrics``, which asks for a key) and
the planner's latest figures ("no planner" when the proxy reports none). ``--once`` prints one frame and exits
(scripts, tests). Data: ``cluster_view.py``; drawing: ``rich`` (a dependency of ``litellm[proxy]``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from collections import Counter
from collections.abc import Sequence

import httpx
from rich import box
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from litellm_disagg.discovery.cli import registry_from_args
from litellm_disagg.observability.cluster_view import QUANTILES, ClusterView, ClusterWatcher, ProxyView, WorkerView
from litellm_disagg.runtime_config import RuntimeConfig, WorkerState

_STATE_STYLE = {WorkerState.READY: "green", WorkerState.DRAINING: "yellow", WorkerState.STARTING: "cyan"}


def run_top(args: argparse.Namespace) -> int:
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_top(args))
    return 0


async def _top(args: argparse.Namespace) -> None:
    registry = registry_from_args(args)
    async with httpx.AsyncClient() as client:
        watcher = ClusterWatcher(registry, client, metrics_url=args.metrics_url, metrics_key=args.metrics_key)
        try:
            if args.once:
                _console().print(render(await watcher.sample()))
                return
            with Live(Text("reading the cluster..."), screen=True, auto_refresh=False) as live:
                while True:
                    started = time.monotonic()
                    live.update(render(await watcher.sample()), refresh=True)
                    await asyncio.sleep(max(0.05, args.interval - (time.monotonic() - started)))
        finally:
            await registry.close()


def render(view: ClusterView) -> RenderableType:
    stamp = time.strftime("%H:%M:%S", time.localtime(view.taken_at))
    header = Text.assemble(("litellm-disagg top", "bold"), f"  {stamp}  ", _pools_line(view))
    parts: list[RenderableType] = [header]
    if view.discovery_error:
        parts.append(Text(f"discovery: {view.discovery_error}", style="red"))
    parts.append(_workers_table(view.workers))
    parts.append(_proxy_table(view.proxy))
    return Group(*parts)


def _pools_line(view: ClusterView) -> str:
    if not view.workers:
        return "no workers in discovery"
    pools: dict[str, Counter[str]] = {}
    for w in view.workers:
        pools.setdefault(w.config.model, Counter())[w.config.role.value] += 1
    return "  ".join(
        f"{model}: " + " ".join(f"{n} {role}" for role, n in sorted(counts.items())) for model, counts in pools.items()
    )


def _workers_table(workers: Sequence[WorkerView]) -> Table:
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, expand=False)
    for name, justify in (
        ("WORKER", "left"), ("MODEL", "left"), ("ROLE", "left"), ("STATE", "left"), ("RUN", "right"),
        ("WAIT", "right"), ("KV", "right"), ("PREFIX HIT", "right"), ("DONE", "right"), ("DONE/s", "right"),
    ):
        table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for w in workers:
        c = w.config
        state = Text(c.state.value, style=_STATE_STYLE.get(c.state, ""))
        if not w.reachable:
            table.add_row(
                c.worker_id, Text(c.model), c.role.value, state, *(["-"] * 5), Text("unreachable", style="red")
            )
            continue
        table.add_row(
            c.worker_id, Text(c.model), c.role.value, state, _num(w.running), _num(w.waiting), _pct(w.kv_usage),
            _pct(w.prefix_hit_rate), _num(w.finished), "-" if w.finished_per_s is None else f"{w.finished_per_s:.1f}",
        )
    return table


def _proxy_table(proxy: ProxyView | None) -> Table:
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_header=True)
    table.add_column("PROXY", no_wrap=True)
    table.add_column("", no_wrap=False)
    if proxy is None or not proxy.reachable:
        why = "n/a (no --metrics-url)" if proxy is None else "n/a (metrics URL unreachable)"
        for row in ("requests/s", "TTFT p50/p95/p99", "ITL p50/p95/p99"):
            table.add_row(row, why)
        table.add_row("planner", "n/a")
        return table
    table.add_row("requests/s", "n/a" if proxy.request_rate is None else f"{proxy.request_rate:.2f}")
    table.add_row("TTFT p50/p95/p99", _quantiles(proxy.ttft))
    table.add_row("ITL p50/p95/p99", _quantiles(proxy.itl))
    table.add_row("planner", "no planner" if proxy.planner is None else Text("\n".join(proxy.planner[-6:])))
    return table


def _quantiles(values: dict[float, float] | object) -> str:
    if not isinstance(values, dict) or not values:
        return "n/a"
    return " / ".join(_ms(values[q]) if q in values else "-" for q in QUANTILES)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.0f} ms" if seconds < 10 else f"{seconds:.1f} s"


def _num(value: int | None) -> str:
    return "-" if value is None else str(value)


def _pct(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 100:.1f}%" if 0 < value < 0.1 else f"{value * 100:.0f}%"


# -- litellm-disagg workers ----------------------------------------------------------------------------------------


def print_workers(configs: Sequence[RuntimeConfig], *, as_json: bool) -> None:
    """One JSON object per line (``--json``: each worker's ``RuntimeConfig`` as published), or a table."""
    if as_json:
        for config in configs:
            print(json.dumps(config.model_dump(mode="json")))
        return
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for name in ("WORKER", "MODEL", "ROLE", "STATE", "ENGINE", "URL", "KV BLOCKS", "UP"):
        table.add_column(name, no_wrap=True)
    now = time.time()
    for c in sorted(configs, key=lambda c: (c.model, c.role.value, c.worker_id)):
        table.add_row(
            c.worker_id, Text(c.model), c.role.value, c.state.value, c.engine, Text(c.base_url),
            f"{c.kv_capacity_blocks} x {c.block_size}", _age(now - c.started_at),
        )
    console = _console()
    if not configs:
        console.print("no workers in discovery")
        return
    console.print(table)


def _console() -> Console:
    """The terminal's width on a terminal; wide enough for a full row when piped (rich would assume 80)."""
    console = Console()
    return console if console.is_terminal else Console(width=200)


def _age(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h"

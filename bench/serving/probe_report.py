"""``--probe-proxy``: turn the probe on in an arm's proxy config (``probe.py``) and summarize what it wrote."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.serving.loadgen import RequestResult
from bench.serving.report import percentile
from litellm_disagg.sim.request_log import RequestTrace

STAGES = (("client>asgi", "sent", "asgi"), ("asgi>pre_hook", "asgi", "pre_hook"),
          ("pre_hook>route", "pre_hook", "route_start"), ("route", "route_start", "route_end"),
          ("route>pre_api", "route_end", "pre_api"), ("pre_hook>pre_api", "pre_hook", "pre_api"),
          ("pre_api>worker", "pre_api", "arrived"))


def enable(config: dict[str, Any], run_dir: Path, label: str) -> Path:
    """Adds the probe to ``config``'s callbacks; the proxy started next writes to the returned file."""
    settings = config.setdefault("litellm_settings", {})
    settings["callbacks"] = [*settings.get("callbacks", []), "bench.serving.probe.handler"]
    path = run_dir / f"probe-{label}.jsonl"
    path.unlink(missing_ok=True)
    os.environ["BENCH_PROXY_PROBE"] = str(path)
    return path


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) of each thread of a live process."""
    out: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        out[int(task.name)] = (int(fields[11]) + int(fields[12])) / tick
    return out


def machine_cpu() -> tuple[float, float]:
    """(busy, idle) CPU seconds of the whole machine so far, all cores, from ``/proc/stat``."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    tick = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / tick, idle / tick


def machine_line(before: tuple[float, float], after: tuple[float, float], proxy_s: float, workers_s: float,
                 client_s: float) -> str:
    busy = after[0] - before[0]
    idle = after[1] - before[1]
    return (f"  machine CPU during the load: busy {busy:.1f} s, idle {idle:.1f} s; proxy {proxy_s:.1f}, workers "
            f"{workers_s:.1f}, this client {client_s:.1f}, everything else {busy - proxy_s - workers_s - client_s:.1f}")


def summary(arm: str, path: Path, results: Sequence[RequestResult], traces: Sequence[RequestTrace],
            window: tuple[float, float], threads_before: dict[int, float], threads_after: dict[int, float]) -> str:
    records: dict[str, dict[str, float]] = {}
    lags: list[float] = []
    late: list[dict[str, float]] = []
    names: dict[int, str] = {}
    events = [0, 0]
    collections: dict[int, list[float]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            item = json.loads(line)
            if "lag" in item:
                if window[0] <= item["t"] <= window[1]:
                    lags.append(item["lag"] * 1e3)
                    if item["lag"] > 0.005 and "on_cpu" in item:
                        late.append(item)
            elif "gc" in item:
                if window[0] <= item["t"] <= window[1]:
                    collections.setdefault(item["gc"], []).append(item["ms"])
            elif "events" in item:
                if item["t"] <= window[0]:
                    events[0] = item["events"]
                if item["t"] <= window[1]:
                    events[1] = item["events"]
            elif "threads" in item:
                names = {int(k): v for k, v in item["threads"].items()}
            elif "user" in item:
                records[item["user"]] = item
    arrived = {t.user: t.arrived for t in traces if t.role != "prefill" and t.user is not None}
    stages: dict[str, list[float]] = {s[0]: [] for s in STAGES}
    for r in results:
        rec = records.get(r.user)
        if rec is None or r.error is not None:
            continue
        points = dict(rec, sent=r.sent_at, arrived=arrived.get(r.user))
        for label, a, b in STAGES:
            if points.get(a) is not None and points.get(b) is not None:
                stages[label].append((points[b] - points[a]) * 1e3)
    lines = [f"{arm}: probe, {len(records)} requests timed; proxy_in by stage (ms, p50 / p90)"]
    lines.append("  " + ", ".join(f"{k} {percentile(v, 0.5):.1f} / {percentile(v, 0.9):.1f}"
                                  for k, v in stages.items() if v))
    route_cpu = [records[r.user]["route_cpu"] * 1e3 for r in results
                 if r.error is None and "route_cpu" in records.get(r.user, {})]
    if route_cpu:
        lines.append(f"  route: {percentile(route_cpu, 0.5):.2f} / {percentile(route_cpu, 0.9):.2f} ms of the event "
                     f"loop thread's CPU (p50 / p90), {percentile(stages['route'], 0.5):.2f} / "
                     f"{percentile(stages['route'], 0.9):.2f} ms wall")
    seconds = window[1] - window[0]
    if lags:
        lags.sort()
        lines.append(f"  loop lag over {seconds:.1f} s: {len(lags)} wake-ups >1 ms late, total {sum(lags):.0f} ms; "
                     f">5 ms {sum(x > 5 for x in lags)}, >10 ms {sum(x > 10 for x in lags)}, "
                     f">20 ms {sum(x > 20 for x in lags)}; p50 {percentile(lags, 0.5):.1f}, "
                     f"p99 {percentile(lags, 0.99):.1f}, max {lags[-1]:.1f} ms")
    if late:
        span = sum(x["span"] for x in late) * 1e3
        on_cpu = sum(x["on_cpu"] for x in late) * 1e3
        runqueue = sum(x["runqueue"] for x in late) * 1e3
        asleep = sum(x["span"] - x["lag"] for x in late) * 1e3
        lines.append(f"  the {len(late)} wake-ups >5 ms late span {span:.0f} ms of the loop thread ({asleep:.0f} ms "
                     f"asked-for sleep, {span - asleep:.0f} ms late): on a core {on_cpu:.0f} ms (running callbacks), "
                     f"runnable without a core {runqueue:.0f} ms (the OS), neither {span - on_cpu - runqueue:.0f} ms "
                     f"(idle in the sleep, or blocked: the GIL, a blocking call)")
        worst = sorted(late, key=lambda x: x["lag"], reverse=True)[:5]
        lines.append("  the 5 latest (lag / on a core / run queue, ms): " + ", ".join(
            f"{x['lag'] * 1e3:.0f} / {x['on_cpu'] * 1e3:.0f} / {x['runqueue'] * 1e3:.0f}" for x in worst))
    if collections:
        lines.append("  garbage collections during the load: " + "; ".join(
            f"gen {g}: {len(ms)}, total {sum(ms):.0f} ms, max {max(ms):.1f} ms, >10 ms {sum(x > 10 for x in ms)}"
            for g, ms in sorted(collections.items())))
    if events[1]:
        lines.append(f"  KV event messages received during the load: {events[1] - events[0]} "
                     f"({(events[1] - events[0]) / seconds:.0f}/s)")
    used = sorted(((threads_after.get(t, 0.0) - threads_before.get(t, 0.0), t) for t in threads_after), reverse=True)
    lines.append("  thread CPU (s): " + ", ".join(f"{names.get(t, t)} {cpu:.2f}" for cpu, t in used[:8] if cpu > 0))
    return "\n".join(lines)

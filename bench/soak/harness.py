"""Load and faults together: many concurrent streaming requests through a LiteLLM Router running the litellm-disagg
strategy, over simulated workers that join, drain and crash while the load runs.

Every request must end exactly once: completed with exactly the text the same prompt gives on a single worker, or
failed with an exception the client sees. ``SoakReport`` counts what happened; ``tests/test_soak.py`` asserts on it
and ``python -m bench.soak`` prints it and plots it.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from litellm_disagg.discovery.file.registry import FileRegistry
from litellm_disagg.discovery.file.settings import FileRegistrySettings
from litellm_disagg.runtime_config import WorkerRole
from litellm_disagg.settings import DisaggSettings
from litellm_disagg.sim.cluster import SimCluster
from litellm_disagg.sim.settings import SimSettings


@dataclass(frozen=True)
class SoakConfig:
    requests: int = 300
    concurrency: int = 200
    prefill: int = 2
    decode: int = 3
    prompts: int = 24
    max_tokens: int = 24
    speedup: float = 20.0
    registry_ttl_s: float = 10.0
    """The shipped proxy_config.yaml's ``registry.ttl_s``. At 3 s, workers' heartbeats starved on a loaded 2-core
    machine dropped them out of discovery (110-150 of 300 requests failed with "no healthy deployments")."""
    seed: int = 0
    chaos: bool = True
    """Join, drain and crash workers (both roles) while the load runs."""
    kv_release: bool = True
    """The router releases prefill KV that a failed or superseded attempt never read (routing/kv_release.py); off:
    the engine's lease frees it (the before of the before/after comparison)."""
    decode_crash: bool = True
    """Off: the chaos skips only the decode crash, noting where it would have been (the control arm of the pause
    after it: the same faults otherwise, the same load)."""
    liveness: bool = True
    """A worker whose port refuses connections is held out of new work until discovery drops it, and a request
    whose decode worker died during its prefill decodes elsewhere with that prefill (routing/liveness.py); off: only
    the failure cooldown (5 s) keeps new requests off a crashed worker, which discovery lists for up to its TTL, and
    such a request fails at the dead port and is retried with a fresh prefill (the before of that comparison)."""
    ramp_s: float = 0.0
    """The first ``concurrency`` clients start spread over this many seconds instead of all at once. All at once, they
    finish together and the next ones all prefill before any decodes: completions come in waves with pauses of 2-6 s
    between them, fault or none (the pause "after the decode crash" was mostly such a gap)."""
    disconnects: int = 0
    """Clients that go away: half of them right after their prefill (the proxy notices at its first write, before any
    token: the decode's stream is closed unread), half after the first streamed chunk. Their requests end as
    abandoned, not failed; their prefill KV must still be freed."""


@dataclass
class Outcome:
    index: int
    ends: int = 0
    """How many times this request ended (must be exactly 1)."""
    ok: bool = False
    text: str = ""
    error: str = ""
    detail: str = ""
    abandoned: bool = False
    """The client went away on purpose (``SoakConfig.disconnects``)."""
    ttft_s: float | None = None
    latency_s: float = 0.0
    finished_at_s: float = 0.0
    """When it ended, in seconds since the load started."""


@dataclass
class SoakReport:
    config: SoakConfig
    outcomes: list[Outcome]
    events: list[tuple[float, str]] = field(default_factory=list)
    expected: dict[int, str] = field(default_factory=dict)
    wall_s: float = 0.0
    cut_by_crashes: int = 0
    """Requests that were on decode workers when they crashed: their streams may be cut (an error, not a loss)."""
    routed_to_crashed: int = 0
    """Decode calls routed to a crashed decode worker after its crash (each one a prefill nobody reads, a refused
    connection and a retry): discovery lists the dead worker until its TTL runs out."""

    @property
    def completed(self) -> int:
        return sum(1 for o in self.outcomes if o.ok)

    held_kv_leases: int = 0
    """Prefill blocks still held for a decode when the run ended and settled (KV nobody will read, not freed)."""

    @property
    def failed(self) -> int:
        return sum(1 for o in self.outcomes if o.ends == 1 and not o.ok and not o.abandoned)

    @property
    def abandoned(self) -> int:
        return sum(1 for o in self.outcomes if o.ends == 1 and o.abandoned)

    @property
    def lost(self) -> int:
        return sum(1 for o in self.outcomes if o.ends == 0)

    @property
    def ended_twice(self) -> int:
        return sum(1 for o in self.outcomes if o.ends > 1)

    @property
    def wrong_text(self) -> int:
        return sum(1 for o in self.outcomes if o.ok and o.text != self.expected[o.index % self.config.prompts])

    def percentile(self, values: list[float], q: float) -> float:
        if not values:
            return float("nan")
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def summary(self) -> str:
        ttfts = [o.ttft_s for o in self.outcomes if o.ok and o.ttft_s is not None]
        latencies = [o.latency_s for o in self.outcomes if o.ok]
        errors: dict[str, int] = {}
        for o in self.outcomes:
            if o.ends == 1 and not o.ok and not o.abandoned:
                errors[o.error] = errors.get(o.error, 0) + 1
        lines = [
            f"requests {len(self.outcomes)}  concurrency {self.config.concurrency}  wall {self.wall_s:.1f}s",
            f"completed {self.completed}  failed cleanly {self.failed}  lost {self.lost}  ended twice {self.ended_twice}"
            f"  wrong text {self.wrong_text}  abandoned by their clients {self.abandoned}"
            f"  prefill KV still held at the end {self.held_kv_leases}",
            f"TTFT p50 {self.percentile(ttfts, 0.5) * 1000:.0f} ms  p99 {self.percentile(ttfts, 0.99) * 1000:.0f} ms;"
            f"  latency p50 {self.percentile(latencies, 0.5) * 1000:.0f} ms  p99 {self.percentile(latencies, 0.99) * 1000:.0f} ms"
            f"  mean {statistics.fmean(latencies) * 1000 if latencies else float('nan'):.0f} ms",
        ]
        lines += [f"  error: {count} x {name}" for name, count in sorted(errors.items())]
        details = sorted({o.detail for o in self.outcomes if o.ends == 1 and not o.ok and not o.abandoned})
        lines += [f"    e.g. {d}" for d in details[:3]]
        lines += [f"  t={t:5.2f}s {what}" for t, what in self.events]
        pause = self.completion_pause_after("crashed decode")
        control = self.completion_pause_after(NO_DECODE_CRASH)
        if control is not None:
            lines.append(f"longest pause in completions in the {PAUSE_WINDOW_S:.0f} s after where the decode crash would"
                         f" have been (control, no decode crash): {control:.2f} s")
        if pause is not None:
            lines.append(f"longest pause in completions in the {PAUSE_WINDOW_S:.0f} s after the decode crash: {pause:.2f} s;"
                         f"  decode calls routed to the crashed worker after its crash: {self.routed_to_crashed}")
        elif not self.config.chaos:  # the same measure without faults: the load's own rhythm
            lines.append(f"longest pause in completions in the {PAUSE_WINDOW_S:.0f} s after t={NO_CHAOS_PAUSE_FROM_S:.0f} s"
                         f" (no faults): {self.completion_pause_from(NO_CHAOS_PAUSE_FROM_S):.2f} s")
        return "\n".join(lines)

    def completion_pause_after(self, event: str, window_s: float | None = None) -> float | None:
        """The longest time without a completed request in the ``window_s`` after the first event starting with
        ``event`` (counted from the event): how long the stall after a crash lasted. None: no such event."""
        at = next((t for t, what in self.events if what.startswith(event)), None)
        return None if at is None else self.completion_pause_from(at, window_s)

    def completion_pause_from(self, at: float, window_s: float | None = None) -> float:
        """The longest time without a completed request in the ``window_s`` after ``at`` (counted from ``at``)."""
        window_s = PAUSE_WINDOW_S if window_s is None else window_s
        ends = sorted(o.finished_at_s for o in self.outcomes if o.ok and at < o.finished_at_s <= at + window_s)
        last = max((o.finished_at_s for o in self.outcomes if o.ok), default=at)
        horizon = min(at + window_s, last)  # after the last completion of the run there is nothing left to wait for
        marks = [at, *ends, max(horizon, ends[-1] if ends else at)]
        return max(b - a for a, b in zip(marks, marks[1:], strict=False))


PAUSE_WINDOW_S = 30.0
NO_DECODE_CRASH = "no decode crash here (control)"
NO_CHAOS_PAUSE_FROM_S = 12.0
"""Where a run without faults is measured from: about where the decode crash falls in a run with them (11-13 s)."""


def _routed_to(worker_id: str) -> float:
    """Decode calls routed to ``worker_id`` so far in this process (``litellm_disagg_routed_total``)."""
    from prometheus_client import REGISTRY

    total = 0.0
    for metric in REGISTRY.collect():
        if metric.name == "litellm_disagg_routed":
            total += sum(s.value for s in metric.samples if s.name.endswith("_total")
                         and s.labels.get("worker") == worker_id and s.labels.get("role") == "decode")
    return total


def _held_leases(cluster: SimCluster) -> int:
    return sum(len(w.engine.scheduler.leases) for w in cluster.workers_with(WorkerRole.PREFILL) if w.engine is not None)


async def _close(stream: Any) -> None:
    """Close a LiteLLM stream as the proxy does when its client disconnects (the response to the worker closes)."""
    for name in ("aclose", "close"):
        close = getattr(stream, name, None)
        if close is not None:
            result = close()
            if asyncio.iscoroutine(result):
                await result
            return
    response = getattr(getattr(stream, "completion_stream", None), "aclose", None)
    if response is not None:
        await response()


def _messages(i: int) -> list[dict[str, str]]:
    system = f"You are assistant number {i % 4}. " + "Answer briefly and precisely. " * 20
    return [{"role": "system", "content": system}, {"role": "user", "content": f"Question {i}: what is {i} squared?"}]


async def _expected_texts(cluster: SimCluster, config: SoakConfig) -> dict[int, str]:
    """The text each prompt gives on a single worker, computed there directly (aggregated)."""
    worker = cluster.workers_with(WorkerRole.DECODE)[0]
    out: dict[int, str] = {}
    async with httpx.AsyncClient(timeout=60) as client:
        for i in range(config.prompts):
            body = {"model": cluster.settings.model, "messages": _messages(i), "max_tokens": config.max_tokens}
            r = await client.post(f"{worker.base_url}/chat/completions", json=body)
            r.raise_for_status()
            out[i] = r.json()["choices"][0]["message"]["content"]
    return out


async def run_soak(config: SoakConfig, workdir: Path) -> SoakReport:
    import litellm

    from litellm_disagg.plugin import DisaggPlugin

    registry_dir = workdir / "registry"
    settings = SimSettings().with_speedup(config.speedup)
    rng = random.Random(config.seed)
    cluster = SimCluster(registry=FileRegistry(registry_dir, ttl_s=config.registry_ttl_s), settings=settings,
                         heartbeat_interval_s=0.2, name="soak")
    plugin = DisaggPlugin()
    router = litellm.Router(model_list=[], num_retries=2, timeout=60, retry_after=0)
    report = SoakReport(config=config, outcomes=[Outcome(i) for i in range(config.requests)])
    try:
        await cluster.start(prefill=config.prefill, decode=config.decode)
        report.expected = await _expected_texts(cluster, config)
        disagg = DisaggSettings(
            registry=FileRegistrySettings(path=str(registry_dir), ttl_s=config.registry_ttl_s, poll_interval_s=0.05),
            sync_interval_s=0.1,
        )
        controller = await plugin.attach(router, disagg)
        if not config.kv_release:
            controller.strategy.releases = None
        if not config.liveness:
            controller.cooldown.liveness = None
            controller.strategy.replace_dead_decode = False
        while len(controller.pool.decode_candidates(settings.model)) < config.decode:  # noqa: ASYNC110 (a poll)
            await asyncio.sleep(0.05)

        start = time.monotonic()
        semaphore = asyncio.Semaphore(config.concurrency)
        # Spread the clients that go away over the run: every k-th request, alternating the two kinds.
        step = max(1, config.requests // config.disconnects) if config.disconnects else 0
        leaving = {i: ("after_prefill" if n % 2 == 0 else "mid_stream")
                   for n, i in enumerate(range(step // 2, config.requests, step or 1)) if step and n < config.disconnects}

        async def one(outcome: Outcome) -> None:
            async with semaphore:
                if config.ramp_s and outcome.index < config.concurrency:
                    await asyncio.sleep(config.ramp_s * outcome.index / config.concurrency)
                t0 = time.monotonic()
                leaves = leaving.get(outcome.index)
                try:
                    data: dict[str, Any] = {"model": settings.model, "messages": _messages(outcome.index % config.prompts),
                                            "max_tokens": config.max_tokens, "stream": True}
                    await plugin.async_pre_call_hook(None, None, data, "acompletion")
                    opened = await router.acompletion(**data)
                    if leaves == "after_prefill":
                        # Gone once its prefill is done: the proxy closes the decode's stream at its first write.
                        outcome.abandoned = True
                        await _close(opened)
                        raise ConnectionAbortedError("the client went away after its prefill")
                    # Through the plugin's stream hook, as the proxy streams (request migration lives there).
                    stream = plugin.async_post_call_streaming_iterator_hook(None, opened, data)
                    pieces: list[str] = []
                    async for chunk in stream:
                        delta = chunk.choices[0].delta.content if chunk.choices else None
                        if delta:
                            if outcome.ttft_s is None:
                                outcome.ttft_s = time.monotonic() - t0
                            pieces.append(delta)
                            if leaves == "mid_stream":
                                # The client closes its connection after the first chunk: the stream is closed.
                                outcome.abandoned = True
                                await stream.aclose()
                                await _close(opened)
                                raise ConnectionAbortedError("the client went away mid-stream")
                    outcome.text = "".join(pieces)
                    outcome.ok = True
                except Exception as exc:  # a clean failure: the client sees an exception
                    outcome.error = type(exc).__name__
                    outcome.detail = str(exc)[:300]
                finally:
                    outcome.latency_s = time.monotonic() - t0
                    outcome.finished_at_s = time.monotonic() - start
                    outcome.ends += 1

        async def chaos() -> None:
            def note(what: str) -> None:
                report.events.append((time.monotonic() - start, what))

            steps: list[tuple[str, WorkerRole]] = [
                ("add", WorkerRole.DECODE), ("crash", WorkerRole.PREFILL), ("drain", WorkerRole.DECODE),
                ("add", WorkerRole.PREFILL), ("crash", WorkerRole.DECODE), ("drain", WorkerRole.PREFILL),
            ]
            for action, role in steps:
                await asyncio.sleep(rng.uniform(0.3, 0.8))
                live = [w for w in cluster.workers_with(role) if w.worker_id]
                if action == "add":
                    worker = await cluster.add(role)
                    note(f"joined {worker.worker_id}")
                elif len(live) > 1:
                    victim = rng.choice(live)
                    if action == "crash" and role is WorkerRole.DECODE and not config.decode_crash:
                        note(f"{NO_DECODE_CRASH} ({victim.worker_id} kept)")
                    elif action == "crash":
                        assert victim.engine is not None  # a live worker has its engine
                        scheduler = victim.engine.scheduler
                        # On it: what its engine holds, or what the router has sent it (some still in transit).
                        busy = max(scheduler.num_running + scheduler.num_waiting, controller.accounting.requests(victim.worker_id))
                        routed_before = _routed_to(victim.worker_id)
                        if role is WorkerRole.DECODE:
                            report.cut_by_crashes += busy
                        # Noted when it dies (its connections are reset at once), not when the crash has been
                        # cleaned up: under load that takes seconds, and the pause measured from it looked shorter.
                        crashed_at = time.monotonic() - start
                        await cluster.crash(victim.worker_id)
                        report.events.append((crashed_at, f"crashed {role.value} {victim.worker_id} with {busy} requests on it"))
                        if role is WorkerRole.DECODE:
                            crashed_decode.append((victim.worker_id, routed_before))
                    else:
                        note(f"draining {victim.worker_id}")
                        await cluster.drain(victim.worker_id)
                        note(f"drained {victim.worker_id}")

        crashed_decode: list[tuple[str, float]] = []
        tasks = [asyncio.create_task(one(o)) for o in report.outcomes]
        chaos_task = asyncio.create_task(chaos()) if config.chaos else None
        await asyncio.wait(tasks, timeout=600)
        if chaos_task is not None:
            await chaos_task
        report.wall_s = time.monotonic() - start
        report.events.sort(key=lambda event: event[0])
        report.routed_to_crashed = round(sum(_routed_to(worker_id) - before for worker_id, before in crashed_decode))
        for task in tasks:
            task.cancel()
        # KV held for decodes nobody will make must be freed: by the decode's read, a release, or an abort.
        loop = asyncio.get_running_loop()
        settle_until = loop.time() + 10.0
        while (held := _held_leases(cluster)) and loop.time() < settle_until:
            await asyncio.sleep(0.1)
        report.held_kv_leases = held
    finally:
        await plugin.detach()
        await cluster.close()
    return report

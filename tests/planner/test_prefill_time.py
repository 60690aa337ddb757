"""The prefill-time window outside the simulator: the proxy's route time of remotely prefilled requests plus the TTFT
of locally prefilled ones (``planner/collect.py``), so that a TTFT stretched by the decode side (a pull waiting for
KV blocks, a long decode queue) does not read as prefill pressure in the proxy's or the standalone planner."""

from __future__ import annotations

from pathlib import Path

import httpx
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from litellm_disagg.observability import metrics as m
from litellm_disagg.observability.requests import RequestMetrics
from litellm_disagg.planner.collect import (
    ITL_METRIC,
    ROUTE_METRIC,
    TTFT_METRIC,
    InProcessLatency,
    ProxyPagesLatency,
    SignalCollector,
    proxy_totals,
)
from litellm_disagg.planner.lock import LOCK_FILE, FileLock
from litellm_disagg.planner.loop import PlannerLoop
from litellm_disagg.planner.policy import Condition
from litellm_disagg.planner.window import page_samples
from litellm_disagg.routing.orchestrator import Mode, Outcome
from litellm_disagg.routing.route_plan import RoutePlan
from litellm_disagg.runtime_config import RuntimeConfig, WorkerRole

from ..test_runtime_config import VALID
from .test_loop import Clock, MemoryRegistry, settings

MODEL = "prefill-time-model"


def page(observations: list[tuple[str, str, float, int]], model: str = MODEL) -> str:
    """A proxy's ``/metrics`` page with the TTFT, ITL and route-time histograms: (metric, mode, seconds, count)."""
    registry = CollectorRegistry()
    made = {
        TTFT_METRIC: Histogram(TTFT_METRIC, "", ["model", "mode"], buckets=m.TTFT_BUCKETS, registry=registry),
        ITL_METRIC: Histogram(ITL_METRIC, "", ["model", "mode"], buckets=m.ITL_BUCKETS, registry=registry),
        ROUTE_METRIC: Histogram(ROUTE_METRIC, "", ["model", "mode"], buckets=m.TTFT_BUCKETS, registry=registry),
    }
    for name, mode, seconds, count in observations:
        for _ in range(count):
            made[name].labels(model, mode).observe(seconds)
    return generate_latest(registry).decode()


def test_the_prefill_time_is_remote_route_time_plus_local_ttft():
    text = page([
        (ROUTE_METRIC, "disaggregated", 0.18, 9),   # arrival to the prefill's answer
        (TTFT_METRIC, "disaggregated", 2.8, 9),     # ...then 2.6 s waiting on the decode side
        (ROUTE_METRIC, "local_prefill", 0.002, 3),  # a local prefill's route time is only the selection: not counted
        (TTFT_METRIC, "local_prefill", 0.4, 3),     # its TTFT is its prefill time
        (TTFT_METRIC, "aggregated", 0.6, 1),
        (ROUTE_METRIC, "aggregated", 0.001, 1),
    ])
    totals = proxy_totals(page_samples(text, (TTFT_METRIC, ITL_METRIC, ROUTE_METRIC)))[MODEL]
    assert totals.ttft is not None and totals.prefill is not None
    assert totals.ttft.count == 13 and totals.prefill.count == 13
    assert 2.0 < (totals.ttft.quantile(0.5) or 0) <= 3.0
    assert 0.15 < (totals.prefill.quantile(0.5) or 0) <= 0.2       # the remote ones' route time
    assert 0.3 < (totals.prefill.quantile(0.9) or 0) <= 0.5        # the local ones' TTFT
    assert 0.5 < (totals.prefill.quantile(1.0) or 0) <= 0.75       # the fallback's TTFT


async def test_the_standalone_planner_adds_the_prefill_time_up_over_the_proxies():
    pages = {
        "http://proxy-a/metrics": page([(ROUTE_METRIC, "disaggregated", 0.2, 4), (TTFT_METRIC, "disaggregated", 3.0, 4)]),
        "http://proxy-b/metrics": page([(TTFT_METRIC, "local_prefill", 0.4, 2), (ROUTE_METRIC, "local_prefill", 0.0, 2)]),
    }
    client = httpx.AsyncClient(transport=httpx.MockTransport(lambda r: httpx.Response(200, text=pages[str(r.url)])))
    source = ProxyPagesLatency(list(pages), client=client)
    try:
        totals = (await source.read())[MODEL]
    finally:
        await client.aclose()
    assert totals.prefill is not None and totals.prefill.count == 6
    assert totals.ttft is not None and totals.ttft.count == 6


def worker(worker_id: str, role: str) -> RuntimeConfig:
    return RuntimeConfig.model_validate(VALID | {
        "worker_id": worker_id, "role": role, "model": MODEL, "base_url": "http://127.0.0.1:1/v1",
        "allowed_roles": ["prefill", "decode", "both"]})


class Requests:
    """Disaggregated requests through the proxy's own request metrics (``RequestMetrics``), on a driven clock."""

    def __init__(self, clock: Clock, decode: RuntimeConfig, prefill: RuntimeConfig):
        self.clock, self.decode, self.prefill = clock, decode, prefill
        self.metrics = RequestMetrics(clock=clock)
        self.n = 0

    def serve(self, *, route_s: float, ttft_s: float, count: int = 20) -> None:
        plan = RoutePlan(self.decode, (self.prefill,), None, "remote")
        outcome = Outcome(Mode.DISAGGREGATED, self.decode, self.prefill.worker_id, prefill_seconds=route_s)
        start = self.clock.now
        for _ in range(count):
            self.n += 1
            call = f"prefill-time-{self.n}"
            self.clock.now = start + route_s
            self.metrics.routed(call, plan, outcome, started=start, selection_s=0.0)
            self.clock.now = start + ttft_s
            self.metrics.chunk(call, last=False)
            self.clock.now = start + ttft_s + 0.02
            self.metrics.chunk(call, last=True)
        self.clock.now = start


async def run_loop(tmp_path: Path, *, route_s: float, ttft_s: float):
    registry = MemoryRegistry([worker("pt-p0", "prefill"), worker("pt-d0", "decode"), worker("pt-d1", "decode")])
    clock = Clock()
    requests = Requests(clock, registry.workers["pt-d0"], registry.workers["pt-p0"])
    s = settings()
    loop = PlannerLoop(s, registry, SignalCollector(s, InProcessLatency()), FileLock(tmp_path / LOCK_FILE),
                       clock=clock)
    steps = []
    try:
        for _ in range(4):
            requests.serve(route_s=route_s, ttft_s=ttft_s)
            clock.now += 1
            steps.append(await loop.tick())
    finally:
        await loop.stop()
    return registry, [s.decision(MODEL) for s in steps if s is not None and s.decision(MODEL) is not None]


async def test_in_the_proxy_a_ttft_stretched_on_the_decode_side_is_not_prefill_pressure(tmp_path: Path):
    # The prefills answer in 0.2 s; the first token comes 3 s after arrival (decode-side waits). The TTFT misses
    # the 1 s SLO, the prefill side does not: no decode worker is moved to prefill.
    registry, decisions = await run_loop(tmp_path, route_s=0.2, ttft_s=3.0)
    assert decisions
    last = decisions[-1]
    assert last.pressures.ttft_ratio is not None and last.pressures.ttft_ratio > 2
    assert last.pressures.prefill_time_ratio is not None and last.pressures.prefill_time_ratio < 0.3
    assert all(d.condition is not Condition.PREFILL_BOUND for d in decisions)
    assert registry.requests == []


async def test_in_the_proxy_a_slow_prefill_is_prefill_pressure(tmp_path: Path):
    registry, decisions = await run_loop(tmp_path, route_s=2.5, ttft_s=2.6)
    assert decisions[-1].pressures.prefill_time_ratio is not None and decisions[-1].pressures.prefill_time_ratio > 2
    assert any(d.condition is Condition.PREFILL_BOUND for d in decisions)
    assert registry.requests and registry.requests[0][1] is WorkerRole.PREFILL

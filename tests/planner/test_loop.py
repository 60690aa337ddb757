"""The planner loop (planner/loop.py): lock, collect, decide, request roles, report, hook. Discovery is an in-memory
registry, latencies a source the test drives, workers' pages unreachable (unknown load)."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from litellm_disagg.discovery.roles import RoleNotServable, check_request
from litellm_disagg.planner.collect import ProxyTotals, SignalCollector
from litellm_disagg.planner.hook import DesiredHook, HookCall
from litellm_disagg.planner.lock import LOCK_FILE, FileLock
from litellm_disagg.planner.loop import PlannerLoop
from litellm_disagg.planner.policy import DesiredPools
from litellm_disagg.planner.settings import PlannerSettings
from litellm_disagg.planner.window import HistogramTotals
from litellm_disagg.runtime_config import RuntimeConfig, WorkerRole

from ..test_runtime_config import VALID

MODEL = "loop-model"
SWITCHABLE = ["prefill", "decode", "both"]


def worker(worker_id: str, role: str, *, allowed: list[str] = SWITCHABLE) -> RuntimeConfig:
    # port 1: nothing listens, the scrape fails at once and the worker's load reads as unknown
    return RuntimeConfig.model_validate(VALID | {"worker_id": worker_id, "role": role, "model": MODEL,
                                                 "base_url": "http://127.0.0.1:1/v1", "allowed_roles": allowed})


class MemoryRegistry:
    def __init__(self, workers: list[RuntimeConfig]):
        self.workers = {w.worker_id: w for w in workers}
        self.requests: list[tuple[str, WorkerRole]] = []

    async def snapshot(self) -> list[RuntimeConfig]:
        return list(self.workers.values())

    async def request_role(self, worker_id: str, role: WorkerRole) -> None:
        check_request(self.workers.values(), worker_id, role)
        self.requests.append((worker_id, role))

    def follow(self) -> None:
        """The workers take the roles asked for."""
        for worker_id, role in self.requests:
            self.workers[worker_id] = self.workers[worker_id].with_role(role)


class DrivenLatency:
    """Cumulative TTFT/ITL histograms; ``observe`` adds requests."""

    def __init__(self) -> None:
        self.ttft: dict[float, float] = {}
        self.itl: dict[float, float] = {}

    def observe(self, ttft_s: float, itl_s: float, n: int = 20) -> None:
        for store, value in ((self.ttft, ttft_s), (self.itl, itl_s)):
            store[value] = store.get(value, 0) + n

    @staticmethod
    def _totals(store: dict[float, float]) -> HistogramTotals:
        bounds = sorted(store) + [float("inf")]
        cumulative, out = 0.0, []
        for le in bounds:
            cumulative += store.get(le, 0)
            out.append((le, cumulative))
        return HistogramTotals(tuple(out), cumulative)

    async def read(self) -> Mapping[str, ProxyTotals]:
        return {MODEL: ProxyTotals(self._totals(self.ttft), self._totals(self.itl))}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def settings(**kw: object) -> PlannerSettings:
    base: dict[str, object] = {"ttft_ms": 1000, "itl_ms": 50, "hysteresis_steps": 2, "cooldown_s": 30,
                               "min_samples": 1, "interval_s": 1, "window_s": 10}
    return PlannerSettings.model_validate(base | kw)


def make_loop(tmp_path: Path, registry: MemoryRegistry, latency: DrivenLatency, clock: Clock,
              **kw: object) -> PlannerLoop:
    s = settings(**kw)
    return PlannerLoop(s, registry, SignalCollector(s, latency), FileLock(tmp_path / LOCK_FILE), clock=clock)


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_loop_moves_a_worker_when_ttft_misses_its_slo_and_sees_the_flip_through(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="litellm_disagg.planner")
    registry = MemoryRegistry([worker("p0", "prefill"), worker("d0", "decode"), worker("d1", "decode")])
    latency, clock = DrivenLatency(), Clock()
    loop = make_loop(tmp_path, registry, latency, clock)
    before = sample("litellm_disagg_planner_decisions_total", model=MODEL, action="role_change")
    try:
        steps = []
        for _ in range(3):                 # first: baseline snapshot; then two steps over the SLO (hysteresis 2)
            latency.observe(ttft_s=3.0, itl_s=0.01)
            clock.now += 1
            steps.append(await loop.tick())
        assert steps[0] is None and steps[1] is not None and steps[1].moves == ()
        assert steps[2] is not None and [(m.worker_id, m.to_role) for m in steps[2].moves] == [("d0", "prefill")]
        assert registry.requests == [("d0", WorkerRole.PREFILL)]
        assert sample("litellm_disagg_planner_decisions_total", model=MODEL, action="role_change") == before + 1
        assert sample("litellm_disagg_planner_desired_workers", model=MODEL, role="prefill") == 2
        assert sample("litellm_disagg_planner_leader") == 1
        lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("planner decision ")]
        record = json.loads(lines[-1].removeprefix("planner decision "))
        assert record["moves"] == [["d0", "decode", "prefill"]] and record["condition"] == "prefill_bound"
        assert record["ttft_p_ms"] > 1000 and record["current"] == [1, 2, 0] and record["desired"] == [2, 1, 0]

        # while the worker has not published its new role, it counts as flipping: no other move
        latency.observe(ttft_s=3.0, itl_s=0.01)
        clock.now += 1
        step = await loop.tick()
        assert step is not None and step.moves == ()
        assert loop.pending.resolve(list(registry.workers.values()), clock.now) == {"d0": WorkerRole.PREFILL}
        registry.follow()
        clock.now += 1
        await loop.tick()
        assert loop.pending.resolve(list(registry.workers.values()), clock.now) == {}
        assert any("now serves prefill" in r.getMessage() for r in caplog.records)
    finally:
        await loop.stop()


async def test_a_refused_role_request_is_logged_and_not_pending(tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    registry = MemoryRegistry([worker("p0", "prefill"), worker("d0", "decode"), worker("d1", "decode")])
    latency, clock = DrivenLatency(), Clock()
    loop = make_loop(tmp_path, registry, latency, clock, hysteresis_steps=1)

    async def refuse(worker_id: str, role: WorkerRole) -> None:
        raise RoleNotServable(f"worker {worker_id!r} cannot serve role {role.value!r}")

    registry.request_role = refuse  # type: ignore[method-assign]
    try:
        for _ in range(2):
            latency.observe(ttft_s=3.0, itl_s=0.01)
            clock.now += 1
            step = await loop.tick()
        assert step is not None and len(step.moves) == 1
        assert loop.pending.resolve(list(registry.workers.values()), clock.now) == {}
        assert any("refused" in r.getMessage() for r in caplog.records)
    finally:
        await loop.stop()


async def test_two_planners_one_acts_and_the_other_takes_over(tmp_path: Path) -> None:
    registry = MemoryRegistry([worker("p0", "prefill"), worker("d0", "decode"), worker("d1", "decode")])
    latency, clock = DrivenLatency(), Clock()
    first = make_loop(tmp_path, registry, latency, clock, hysteresis_steps=1)
    second = make_loop(tmp_path, registry, latency, clock, hysteresis_steps=1)
    try:
        latency.observe(ttft_s=3.0, itl_s=0.01)
        assert await first.tick() is None and first.leader     # took the lock; its first step is a baseline
        assert await second.tick() is None and not second.leader
        for _ in range(3):
            latency.observe(ttft_s=3.0, itl_s=0.01)
            clock.now += 1
            await first.tick()
            await second.tick()
        assert registry.requests == [("d0", WorkerRole.PREFILL)]   # one planner, one move (then flip in progress)
        assert second.steps == 0
        await first.stop()                  # the holder goes away
        latency.observe(ttft_s=3.0, itl_s=0.01)
        clock.now += 1
        assert await second.tick() is None and second.leader    # takes over (baseline step)
        latency.observe(ttft_s=3.0, itl_s=0.01)
        clock.now += 1
        assert await second.tick() is not None
    finally:
        await first.stop()
        await second.stop()


async def test_hook_runs_with_the_desired_sizes_once_per_change(tmp_path: Path) -> None:
    out = tmp_path / "hook.jsonl"
    script = ("import json, os, sys; open(sys.argv[1], 'a').write(json.dumps({'argv': sys.argv[2:], "
              "'drain': os.environ.get('LITELLM_DISAGG_DRAIN_WORKER'), "
              "'total': os.environ['LITELLM_DISAGG_DESIRED_TOTAL']}) + '\\n')")
    hook = DesiredHook([sys.executable, "-c", script, str(out)], timeout_s=30)
    call = HookCall(DesiredPools("m; rm -rf /", 1, 2, 0), drain="d1")
    assert await hook.run(call) == 0
    assert await hook.run(call) is None          # unchanged: not run again
    assert await hook.run(HookCall(DesiredPools("m; rm -rf /", 1, 3, 0))) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows == [{"argv": ["m; rm -rf /", "1", "2", "0"], "drain": "d1", "total": "3"},
                    {"argv": ["m; rm -rf /", "1", "3", "0"], "drain": None, "total": "4"}]


async def test_the_loop_runs_the_hook_in_the_background_in_order(tmp_path: Path) -> None:
    out, gate = tmp_path / "hook.txt", tmp_path / "gate"
    script = ("import os, sys, time\n"
              "while not os.path.exists(sys.argv[2]): time.sleep(0.02)\n"
              "open(sys.argv[1], 'a').write(' '.join(sys.argv[3:]) + '\\n')")
    registry = MemoryRegistry([worker("p0", "prefill"), worker("d0", "decode"), worker("d1", "decode")])
    latency, clock = DrivenLatency(), Clock()
    s = settings(hysteresis_steps=1, window_s=1)  # the second move needs no settling time after the first
    loop = PlannerLoop(s, registry, SignalCollector(s, latency), FileLock(tmp_path / LOCK_FILE), clock=clock,
                       hook=DesiredHook([sys.executable, "-c", script, str(out), str(gate)], timeout_s=60))
    try:
        for i in range(3):        # baseline; d0 -> prefill (wants [2, 1, 0]); d1 is the last decode worker: [3, 1, 0]
            latency.observe(ttft_s=3.0, itl_s=0.01)
            clock.now += 1
            await loop.tick()
            if i == 1:
                registry.follow()
        assert not out.exists()   # the steps did not wait for the hook (it waits for the gate)
    finally:
        gate.touch()
        await loop.stop()         # waits for the runs already submitted
    assert out.read_text().splitlines() == [f"{MODEL} 2 1 0", f"{MODEL} 3 1 0"]


async def test_hook_that_hangs_is_killed(tmp_path: Path) -> None:
    hook = DesiredHook([sys.executable, "-c", "import time; time.sleep(60)"], timeout_s=0.5)
    assert await hook.run(HookCall(DesiredPools("m", 1, 1, 0))) is None


def test_report_logs_at_info_only_what_changed(caplog: pytest.LogCaptureFixture) -> None:
    from litellm_disagg.planner import Planner
    from litellm_disagg.planner.report import PlannerReport
    from litellm_disagg.planner.signals import ClusterSignals, LatencyWindow, ModelSignals, WorkerSignals

    caplog.set_level(logging.DEBUG, logger="litellm_disagg.planner")
    planner, report = Planner(settings(hysteresis_steps=1, allow_aggregated=False)), PlannerReport()
    workers = tuple(WorkerSignals(i, "quiet", r) for i, r in (("p0", WorkerRole.PREFILL), ("p1", WorkerRole.PREFILL),
                                                              ("d0", WorkerRole.DECODE)))
    quiet = ClusterSignals((ModelSignals("quiet", workers, LatencyWindow(10, 9), LatencyWindow(1, 9)),))
    levels = []
    for t in range(3):
        decision = planner.step(quiet, t).decisions[0]
        assert decision.drain == "p0"   # named at every step
        report.decided(decision, quiet.models[0])
        levels.append(caplog.records[-1].levelno)
    assert levels == [logging.INFO, logging.DEBUG, logging.DEBUG]
    # a mixing correction that changes (the engine profile checked against the ITL) is worth an INFO line too
    from dataclasses import replace

    corrected = replace(decision, pressures=replace(decision.pressures, mixing_correction=1.4))
    assert report.decided(corrected, quiet.models[0]) and caplog.records[-1].levelno == logging.INFO
    assert '"mixing_correction":1.4' in caplog.records[-1].getMessage()


async def test_two_planners_on_consul_the_holder_dies_the_other_acts(tmp_path: Path) -> None:
    import asyncio

    from litellm_disagg.discovery.consul.endpoint import ConsulEndpoint
    from litellm_disagg.discovery.consul.http import ConsulHttp
    from litellm_disagg.discovery.consul.settings import ConsulRegistrySettings
    from litellm_disagg.planner.lock import ConsulSessionLock

    from ..consul_double import ConsulDouble

    registry = MemoryRegistry([worker("p0", "prefill"), worker("d0", "decode"), worker("d1", "decode")])
    latency, clock = DrivenLatency(), Clock()
    s = settings(hysteresis_steps=1)
    async with ConsulDouble(min_session_ttl_s=0.5) as consul:
        def lock() -> ConsulSessionLock:
            endpoint = ConsulEndpoint.resolve(ConsulRegistrySettings(address=consul.address), environ={})
            # 3 s: the live holder renews between its ticks even on a loaded machine (0.5 s expired there)
            return ConsulSessionLock(ConsulHttp(endpoint, timeout_s=5), ttl_s=3.0, own_http=True)

        first = PlannerLoop(s, registry, SignalCollector(s, latency), lock(), clock=clock)
        second = PlannerLoop(s, registry, SignalCollector(s, latency), lock(), clock=clock)
        try:
            latency.observe(ttft_s=3.0, itl_s=0.01)
            assert await first.tick() is None and first.leader
            assert await second.tick() is None and not second.leader
            latency.observe(ttft_s=3.0, itl_s=0.01)
            clock.now += 1
            step = await first.tick()
            assert step is not None and [m.worker_id for m in step.moves] == ["d0"]
            assert await second.tick() is None
            # the first planner dies: it never renews its session again (no release)
            for _ in range(600):
                latency.observe(ttft_s=3.0, itl_s=0.01)
                clock.now += 1
                await second.tick()
                if second.leader:
                    break
                await asyncio.sleep(0.1)
            assert second.leader
            clock.now += 1
            assert await second.tick() is not None     # acts from its next step on
        finally:
            await second.stop()
            await first.stop()

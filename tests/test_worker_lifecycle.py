"""The worker lifecycle (workers/lifecycle.py) with a recording registry and a scripted engine probe.

The drain's clock is a fake one that the probe advances, so every case is decided by the sequence of probe answers,
never by how fast this machine runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import pytest

from litellm_disagg.discovery.registry import RegistryError
from litellm_disagg.runtime_config import RuntimeConfig, VllmNixlTransfer, WorkerRole
from litellm_disagg.workers.lifecycle import DrainOutcome, DrainPolicy, EngineActivity, WorkerLifecycle

CONFIG = RuntimeConfig(
    worker_id="w1", model="m", role=WorkerRole.DECODE, base_url="http://127.0.0.1:8000/v1",
    transfer=VllmNixlTransfer(host="127.0.0.1", port=5600), kv_capacity_blocks=100, block_size=16,
)


class RecordingRegistry:
    """Records every call as (method, state or worker_id); fails the methods named in ``failing``."""

    def __init__(self, failing: Iterable[str] = ()):
        self.calls: list[tuple[str, str]] = []
        self.failing = set(failing)
        self.heartbeat_seen = asyncio.Event()

    def _record(self, method: str, what: str) -> None:
        self.calls.append((method, what))
        if method in self.failing:
            raise RegistryError(f"{method} refused")

    async def publish(self, config: RuntimeConfig) -> None:
        self._record("publish", config.state.value)

    async def heartbeat(self, worker_id: str) -> None:
        self.heartbeat_seen.set()
        self._record("heartbeat", worker_id)

    async def withdraw(self, worker_id: str) -> None:
        self._record("withdraw", worker_id)

    def without_heartbeats(self) -> list[tuple[str, str]]:
        return [call for call in self.calls if call[0] != "heartbeat"]


class ScriptedEngine:
    """Answers the probe from a script of (idle, finished) pairs, then repeats the last; each probe is 1 s later."""

    def __init__(self, script: list[tuple[bool, int] | None]):
        self.script = script
        self.now = 0.0
        self.probes = 0

    def clock(self) -> float:
        return self.now

    async def probe(self) -> EngineActivity | None:
        answer = self.script[min(self.probes, len(self.script) - 1)]
        self.probes += 1
        self.now += 1.0
        return None if answer is None else EngineActivity(idle=answer[0], finished=answer[1])


def lifecycle(
    registry: RecordingRegistry, engine: ScriptedEngine, *, timeout_s: float = 100.0, settle_s: float = 2.0,
    heartbeat_interval_s: float = 3600.0,
) -> WorkerLifecycle:
    return WorkerLifecycle(
        registry, CONFIG, engine.probe, heartbeat_interval_s=heartbeat_interval_s,
        drain=DrainPolicy(timeout_s=timeout_s, settle_s=settle_s, poll_s=0.0), clock=engine.clock,
    )


async def test_announce_publishes_ready_and_heartbeats_until_leave() -> None:
    registry = RecordingRegistry()
    worker = lifecycle(registry, ScriptedEngine([(True, 0)]), heartbeat_interval_s=0.01)
    await worker.announce()
    assert registry.calls[0] == ("publish", "ready")  # READY whatever state the config was built with
    await asyncio.wait_for(registry.heartbeat_seen.wait(), timeout=30)
    await worker.leave()
    assert not worker.heartbeating
    assert registry.calls[-1] == ("withdraw", "w1")
    assert {method for method, _ in registry.calls[1:-1]} == {"heartbeat"}


async def test_a_heartbeat_long_after_the_previous_one_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    # A process that stalls past the registry's TTL drops out of discovery (seen once in CI); the worker says so.
    for jump, logged in ((0.0, False), (100.0, True)):
        caplog.clear()
        registry, engine = RecordingRegistry(), ScriptedEngine([(True, 0)])

        def clock(engine: ScriptedEngine = engine, jump: float = jump) -> float:
            engine.now += jump  # each reading this much later: as if the event loop stalled between heartbeats
            return engine.now

        worker = WorkerLifecycle(registry, CONFIG, engine.probe, heartbeat_interval_s=0.01, clock=clock)
        await worker.announce()
        await asyncio.wait_for(registry.heartbeat_seen.wait(), timeout=30)
        await worker.leave()
        stalls = [r.getMessage() for r in caplog.records if "this process stalled" in r.getMessage()]
        assert bool(stalls) is logged
        assert all("the write took" in m for m in stalls)  # which stalled: the write, or the event loop before it


async def test_drain_waits_for_idle_then_for_the_settle_window() -> None:
    registry = RecordingRegistry()
    engine = ScriptedEngine([(False, 0), (False, 0), (True, 0)])
    worker = lifecycle(registry, engine, settle_s=2.0)
    await worker.announce()
    assert await worker.drain() is DrainOutcome.SETTLED
    # Busy twice, idle from the 3rd probe (t=3), settled 2 s later at the 5th (t=5).
    assert engine.probes == 5
    assert worker.heartbeating  # the entry stays alive, as DRAINING, until the worker leaves
    await worker.leave()
    assert registry.without_heartbeats() == [("publish", "ready"), ("publish", "draining"), ("withdraw", "w1")]


async def test_a_request_finishing_while_idle_restarts_the_settle_window() -> None:
    engine = ScriptedEngine([(True, 0), (True, 1), (True, 2), (True, 2), (True, 2), (True, 2)])
    worker = lifecycle(RecordingRegistry(), engine, settle_s=2.0)
    await worker.announce()
    assert await worker.drain() is DrainOutcome.SETTLED
    # The count moved at probes 2 and 3; the window opens at probe 4 (t=4) and closes at probe 6 (t=6).
    assert engine.probes == 6
    await worker.leave()


async def test_the_first_probe_opens_the_window_and_no_settle_leaves_at_once() -> None:
    engine = ScriptedEngine([(True, 7)])
    worker = lifecycle(RecordingRegistry(), engine, settle_s=0.0)
    await worker.announce()
    assert await worker.drain() is DrainOutcome.SETTLED
    assert engine.probes == 1
    await worker.leave()


async def test_drain_times_out_on_an_engine_that_stays_busy() -> None:
    registry = RecordingRegistry()
    engine = ScriptedEngine([(False, 0)])
    worker = lifecycle(registry, engine, timeout_s=10.0)
    await worker.announce()
    assert await worker.drain() is DrainOutcome.TIMED_OUT
    assert engine.probes == 10
    await worker.leave()
    assert registry.without_heartbeats()[-1] == ("withdraw", "w1")


async def test_drain_ends_when_the_engine_is_gone() -> None:
    engine = ScriptedEngine([(False, 0), None])
    worker = lifecycle(RecordingRegistry(), engine)
    await worker.announce()
    assert await worker.drain() is DrainOutcome.ENGINE_GONE
    assert engine.probes == 2
    await worker.leave()


async def test_registry_failures_are_logged_not_raised_after_announce(caplog: pytest.LogCaptureFixture) -> None:
    registry = RecordingRegistry(failing={"heartbeat", "withdraw"})
    worker = lifecycle(registry, ScriptedEngine([(True, 0)]), settle_s=0.0, heartbeat_interval_s=0.01)
    await worker.announce()
    await asyncio.wait_for(registry.heartbeat_seen.wait(), timeout=30)
    registry.failing.add("publish")
    assert await worker.drain() is DrainOutcome.SETTLED  # DRAINING could not be published: drains anyway
    await worker.leave()
    assert ("withdraw", "w1") in registry.calls
    text = caplog.text
    assert "heartbeat failed" in text and "could not publish DRAINING" in text and "could not withdraw" in text


async def test_a_failed_announce_raises_and_starts_no_heartbeats() -> None:
    registry = RecordingRegistry(failing={"publish"})
    worker = lifecycle(registry, ScriptedEngine([(True, 0)]), heartbeat_interval_s=0.01)
    with pytest.raises(RegistryError):
        await worker.announce()
    assert not worker.heartbeating


async def test_abandon_stops_heartbeats_and_withdraws_nothing() -> None:
    registry = RecordingRegistry()
    worker = lifecycle(registry, ScriptedEngine([(True, 0)]), heartbeat_interval_s=0.01)
    await worker.announce()
    await worker.abandon()
    assert not worker.heartbeating
    await worker.leave()  # a crashed worker leaves nothing: its entry ages out
    assert all(method != "withdraw" for method, _ in registry.calls)


async def test_leave_withdraws_once() -> None:
    registry = RecordingRegistry()
    worker = lifecycle(registry, ScriptedEngine([(True, 0)]))
    await worker.announce()
    await worker.leave()
    await worker.leave()
    assert registry.calls.count(("withdraw", "w1")) == 1

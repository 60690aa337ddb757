"""The operator commands' wait (``discovery/worker_watch.py``) and its edge: a change that lands after the watch's
last yield, before the timeout, counts as the change (both commands report success on stdout, exit 0)."""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator

from litellm_disagg.discovery.drain_command import drain_worker
from litellm_disagg.discovery.role_command import change_role
from litellm_disagg.discovery.roles import AfterDrain
from litellm_disagg.discovery.worker_watch import watch_worker
from litellm_disagg.runtime_config import RuntimeConfig, WorkerRole, WorkerState

from .test_registry_contract import make_config


class FrozenWatchRegistry:
    """Its watch yields ``watched`` once and then nothing more (a change the watch never delivered);
    ``snapshot()`` answers ``watched`` until the watch has yielded, ``current`` after."""

    def __init__(self, watched: list[RuntimeConfig], current: list[RuntimeConfig]) -> None:
        self.watched = watched
        self.current = current
        self.requests: list[tuple[str, object]] = []
        self.watch_yielded = False

    async def watch(self) -> AsyncIterator[list[RuntimeConfig]]:
        yield self.watched
        self.watch_yielded = True
        await asyncio.Event().wait()

    async def snapshot(self) -> list[RuntimeConfig]:
        return self.current if self.watch_yielded else self.watched

    async def request_drain(self, worker_id: str, *, then: AfterDrain = AfterDrain.EXIT) -> None:
        self.requests.append((worker_id, then))

    async def request_role(self, worker_id: str, role: WorkerRole) -> None:
        self.requests.append((worker_id, role))


def worker(role: WorkerRole = WorkerRole.PREFILL, state: WorkerState = WorkerState.READY) -> RuntimeConfig:
    return make_config("w1", state=state).model_copy(update={"role": role})


async def test_the_watch_stops_at_the_first_entry_that_meets_the_condition_and_reports_every_entry_seen():
    seen: list[RuntimeConfig | None] = []
    registry = FrozenWatchRegistry(watched=[worker()], current=[])
    outcome = await watch_worker(
        registry, "w1", until=lambda entry: entry is not None, timeout_s=5, on_entry=seen.append,  # type: ignore[arg-type]
    )
    assert outcome.reached and outcome.entry is not None and outcome.entry.worker_id == "w1"
    assert [e.worker_id for e in seen if e is not None] == ["w1"]


async def test_after_the_timeout_the_snapshot_decides():
    registry = FrozenWatchRegistry(watched=[worker()], current=[])
    outcome = await watch_worker(registry, "w1", until=lambda entry: entry is None, timeout_s=0.05)  # type: ignore[arg-type]
    assert outcome.reached and outcome.entry is None
    registry = FrozenWatchRegistry(watched=[worker()], current=[worker(state=WorkerState.DRAINING)])
    outcome = await watch_worker(registry, "w1", until=lambda entry: entry is None, timeout_s=0.05)  # type: ignore[arg-type]
    assert not outcome.reached and outcome.entry is not None and outcome.entry.state is WorkerState.DRAINING


async def test_drain_reports_a_worker_that_left_just_before_its_timeout_as_gone_on_stdout():
    registry = FrozenWatchRegistry(watched=[worker(state=WorkerState.DRAINING)], current=[])
    out, err = io.StringIO(), io.StringIO()
    code = await drain_worker(registry, "w1", timeout_s=0.05, out=out, err=err)  # type: ignore[arg-type]
    assert code == 0
    assert "left discovery" in out.getvalue() and "draining (published" in out.getvalue()
    assert err.getvalue() == ""


async def test_drain_that_times_out_says_so_on_stderr_with_the_workers_state():
    draining = [worker(state=WorkerState.DRAINING)]
    registry = FrozenWatchRegistry(watched=draining, current=draining)
    out, err = io.StringIO(), io.StringIO()
    code = await drain_worker(registry, "w1", timeout_s=0.05, out=out, err=err)  # type: ignore[arg-type]
    assert code == 1
    assert "still listed (draining)" in err.getvalue()


async def test_role_counts_a_role_published_just_before_its_timeout():
    registry = FrozenWatchRegistry(watched=[worker()], current=[worker(role=WorkerRole.DECODE)])
    out, err = io.StringIO(), io.StringIO()
    code = await change_role(registry, "w1", WorkerRole.DECODE, timeout_s=0.05, out=out, err=err)  # type: ignore[arg-type]
    assert code == 0, err.getvalue()
    assert "now decode" in out.getvalue() and err.getvalue() == ""
    assert registry.requests == [("w1", WorkerRole.DECODE)]

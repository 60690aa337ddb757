"""Role changes in the worker lifecycle (workers/lifecycle.py) over a real file registry: a request written by a
planner reaches the worker, which republishes its config with the new role and runs its hook; refusals keep the role."""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path

import httpx
import pytest

from litellm_disagg.cli import main
from litellm_disagg.discovery.file.registry import FileRegistry
from litellm_disagg.discovery.roles import AfterDrain, RoleNotServable, RoleRequest
from litellm_disagg.engines import get_engine
from litellm_disagg.engines.base import LaunchSpec
from litellm_disagg.runtime_config import RuntimeConfig, VllmNixlTransfer, WorkerRole, WorkerState
from litellm_disagg.workers.lifecycle import DrainPolicy, EngineActivity, RoleChangeRefused, WorkerLifecycle
from litellm_disagg.workers.wrapper import LifecycleOptions, WorkerWrapper

from .support.net import free_port
from .support.registry_watch import eventually

ALL = (WorkerRole.PREFILL, WorkerRole.DECODE, WorkerRole.BOTH)


def config(worker_id: str = "w1", *, allowed: tuple[WorkerRole, ...] = ALL) -> RuntimeConfig:
    return RuntimeConfig(
        worker_id=worker_id, model="m", role=WorkerRole.PREFILL, allowed_roles=allowed,
        base_url="http://127.0.0.1:8000/v1", transfer=VllmNixlTransfer(host="127.0.0.1", port=5600),
        kv_capacity_blocks=100, block_size=16,
    )


async def idle() -> EngineActivity:
    return EngineActivity(idle=True, finished=0)


class Hook:
    def __init__(self) -> None:
        self.calls: list[tuple[WorkerRole, WorkerRole]] = []

    async def __call__(self, old: WorkerRole, new: WorkerRole) -> None:
        self.calls.append((old, new))


def registry(path: Path) -> FileRegistry:
    return FileRegistry(path, ttl_s=5.0, poll_interval_s=0.02)


def fake_wrapper(tmp_path: Path, launch_role: WorkerRole, *, role: WorkerRole | None = None,
                 allowed_roles: tuple[WorkerRole, ...] = ()) -> tuple[LaunchSpec, WorkerWrapper]:
    """``litellm-disagg worker`` (id ``w1``) over a fake engine with vLLM's HTTP surface, on the file registry."""
    port = free_port()
    spec = LaunchSpec(model="m", served_model_name="fake", role=launch_role, host="127.0.0.1", port=port,
                      transfer_host="127.0.0.1", transfer_port=free_port(), device="cpu")
    lifecycle = LifecycleOptions(worker_id="w1", heartbeat_interval_s=0.2, ready_timeout_s=30, drain_settle_s=0.3,
                                 role=role, allowed_roles=allowed_roles)
    command = [sys.executable, "-m", "tests.support.fake_worker", "--port", str(port), "--name", "fake"]
    return spec, WorkerWrapper(spec, lifecycle, registry(tmp_path), engine=get_engine("vllm"), command=command)


async def published_role(reader: FileRegistry, worker_id: str) -> WorkerRole | None:
    for entry in await reader.snapshot():
        if entry.worker_id == worker_id:
            return entry.role
    return None


async def test_a_request_through_discovery_changes_the_published_role_and_runs_the_hook(tmp_path: Path) -> None:
    worker_side, planner = registry(tmp_path), registry(tmp_path)
    hook = Hook()
    lifecycle = WorkerLifecycle(worker_side, config(), idle, heartbeat_interval_s=0.1, on_role_change=hook)
    await lifecycle.announce()
    try:
        await planner.request_role("w1", WorkerRole.DECODE)
        await eventually(lambda: hook.calls == [(WorkerRole.PREFILL, WorkerRole.DECODE)], timeout_s=5)
        assert await published_role(planner, "w1") is WorkerRole.DECODE
        assert lifecycle.config.role is WorkerRole.DECODE and lifecycle.config.state is WorkerState.READY
        (change,) = lifecycle.role_changes
        assert change.requested_at is not None and change.published_at >= change.requested_at - 1.0

        await planner.request_role("w1", WorkerRole.BOTH)
        await eventually(lambda: len(hook.calls) == 2, timeout_s=5)
        assert await published_role(planner, "w1") is WorkerRole.BOTH
        # Heartbeats keep the new role (they rewrite the last published config).
        await eventually(lambda: lifecycle.heartbeating, timeout_s=1)
        assert await published_role(planner, "w1") is WorkerRole.BOTH
    finally:
        await lifecycle.leave()
    assert await planner.snapshot() == []


async def test_a_role_the_launch_cannot_serve_is_refused_at_both_ends(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    worker_side, planner = registry(tmp_path), registry(tmp_path)
    hook = Hook()
    fixed = config(allowed=())
    lifecycle = WorkerLifecycle(worker_side, fixed, idle, heartbeat_interval_s=0.1, on_role_change=hook)
    await lifecycle.announce()
    caplog.set_level(logging.WARNING, logger="litellm_disagg")
    try:
        with pytest.raises(RoleNotServable):
            await planner.request_role("w1", WorkerRole.DECODE)
        with pytest.raises(RoleChangeRefused):
            await lifecycle.change_role(WorkerRole.DECODE)
        # A request written straight into the store (bypassing request_role's check) is refused by the worker.
        (tmp_path / "w1.role.json").write_bytes(RoleRequest(worker_id="w1", role=WorkerRole.DECODE).encode())
        await eventually(lambda: any("role request refused" in r.getMessage() for r in caplog.records), timeout_s=5)
        assert hook.calls == [] and await published_role(planner, "w1") is WorkerRole.PREFILL
    finally:
        await lifecycle.leave()


async def test_a_draining_worker_keeps_its_role(tmp_path: Path) -> None:
    worker_side, planner = registry(tmp_path), registry(tmp_path)
    hook = Hook()
    lifecycle = WorkerLifecycle(worker_side, config(), idle, heartbeat_interval_s=0.1, on_role_change=hook)
    await lifecycle.announce()
    try:
        await lifecycle.drain(DrainPolicy(timeout_s=1, settle_s=0, poll_s=0.01))
        with pytest.raises(RoleChangeRefused, match="draining"):
            await lifecycle.change_role(WorkerRole.DECODE)
        await planner.request_role("w1", WorkerRole.DECODE)  # still listed (draining), so the request is stored
        await asyncio.sleep(0.2)  # ten polls: a worker still following would have acted
        assert hook.calls == []
        entry = (await planner.snapshot())[0]
        assert entry.role is WorkerRole.PREFILL and entry.state is WorkerState.DRAINING
    finally:
        await lifecycle.leave()


async def test_a_drain_request_calls_the_workers_drain_once_and_ends_role_changes(tmp_path: Path) -> None:
    worker_side, operator = registry(tmp_path), registry(tmp_path)
    hook, asked = Hook(), []
    lifecycle = WorkerLifecycle(worker_side, config(), idle, heartbeat_interval_s=0.1, on_role_change=hook,
                                on_drain_request=asked.append)
    await lifecycle.announce()
    try:
        await operator.request_drain("w1")
        await eventually(lambda: asked == [AfterDrain.EXIT], timeout_s=5)
        assert lifecycle.drain_requested and lifecycle.config.state is WorkerState.READY  # the worker drains itself
        await operator.request_role("w1", WorkerRole.DECODE)
        await asyncio.sleep(0.2)  # ten polls: a worker still following would have acted
        assert hook.calls == [] and asked == [AfterDrain.EXIT]
        assert await published_role(operator, "w1") is WorkerRole.PREFILL
    finally:
        await lifecycle.leave()
    assert not (tmp_path / "w1.role.json").exists()  # withdraw deletes the request: a restart under w1 serves


async def test_a_worker_that_takes_no_drain_request_refuses_it_and_keeps_following_roles(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    worker_side, operator = registry(tmp_path), registry(tmp_path)
    hook = Hook()
    lifecycle = WorkerLifecycle(worker_side, config(), idle, heartbeat_interval_s=0.1, on_role_change=hook)
    await lifecycle.announce()
    caplog.set_level(logging.WARNING, logger="litellm_disagg")
    try:
        await operator.request_drain("w1")
        await eventually(lambda: any("drain request refused" in r.getMessage() for r in caplog.records), timeout_s=5)
        assert not lifecycle.drain_requested
        await operator.request_role("w1", WorkerRole.DECODE)
        await eventually(lambda: hook.calls == [(WorkerRole.PREFILL, WorkerRole.DECODE)], timeout_s=5)
    finally:
        await lifecycle.leave()


async def test_change_role_to_the_same_role_does_nothing(tmp_path: Path) -> None:
    lifecycle = WorkerLifecycle(registry(tmp_path), config(), idle, heartbeat_interval_s=0.1)
    await lifecycle.announce()
    try:
        assert await lifecycle.change_role(WorkerRole.PREFILL) is None
        assert lifecycle.role_changes == []
    finally:
        await lifecycle.leave()


async def test_the_vllm_wrapper_publishes_its_start_role_and_follows_requests(tmp_path: Path) -> None:
    """``litellm-disagg worker --switchable``: the engine launched ``both`` (kv_both), the worker published in the
    role it starts in with every role allowed, then moved by a request (a fake engine with vLLM's HTTP surface)."""
    spec, wrapper = fake_wrapper(tmp_path, WorkerRole.BOTH, role=WorkerRole.PREFILL, allowed_roles=ALL)
    assert '"kv_role": "kv_both"' in " ".join(get_engine("vllm").adapter.launch(spec).argv)
    planner = registry(tmp_path)
    run = asyncio.create_task(wrapper.run())
    try:
        # ``registration`` exists just before its first publish: wait for the entry, not for the object.
        await eventually(lambda: wrapper.registration is not None and wrapper.registration.heartbeating, timeout_s=30)
        assert await published_role(planner, "w1") is WorkerRole.PREFILL
        assert (await planner.snapshot())[0].allowed_roles == ALL
        await planner.request_role("w1", WorkerRole.DECODE)
        await eventually(lambda: wrapper.registration is not None
                         and wrapper.registration.config.role is WorkerRole.DECODE, timeout_s=10)
        assert await published_role(planner, "w1") is WorkerRole.DECODE
    finally:
        wrapper.request_stop()
        assert await asyncio.wait_for(run, 30) == 0
    assert await planner.snapshot() == [] and not (tmp_path / "w1.role.json").exists()


async def test_the_vllm_wrapper_drains_leaves_and_exits_zero_on_a_drain_request(tmp_path: Path) -> None:
    """``litellm-disagg drain``: the wrapper takes the way out SIGTERM takes (a fake engine with vLLM's HTTP
    surface): DRAINING, settled, withdrawn, the engine stopped, exit status 0."""
    _, wrapper = fake_wrapper(tmp_path, WorkerRole.DECODE)
    operator = registry(tmp_path)
    run = asyncio.create_task(wrapper.run())
    try:
        await eventually(lambda: wrapper.registration is not None and wrapper.registration.heartbeating, timeout_s=30)
        await operator.request_drain("w1")
        assert await asyncio.wait_for(run, 60) == 0
    finally:
        if not run.done():
            wrapper.request_stop()
            await asyncio.wait_for(run, 30)
    assert await operator.snapshot() == [] and not (tmp_path / "w1.role.json").exists()


async def test_the_vllm_wrapper_parks_on_a_drain_request_with_park_and_exits_zero_on_sigterm(tmp_path: Path) -> None:
    """``litellm-disagg drain --park``: the same drain and withdraw, then the engine stopped (its port closed, so a
    readiness probe fails) while the wrapper stays up, out of discovery; SIGTERM then ends it with 0 at once."""
    spec, wrapper = fake_wrapper(tmp_path, WorkerRole.PREFILL)
    operator = registry(tmp_path)
    run = asyncio.create_task(wrapper.run())
    try:
        await eventually(lambda: wrapper.registration is not None and wrapper.registration.heartbeating, timeout_s=30)
        await operator.request_drain("w1", then=AfterDrain.PARK)
        await eventually(lambda: wrapper._proc is not None and wrapper._proc.returncode is not None, timeout_s=60)
        assert await operator.snapshot() == [] and not (tmp_path / "w1.role.json").exists()
        async with httpx.AsyncClient() as client:
            with pytest.raises(httpx.ConnectError):
                await client.get(f"http://127.0.0.1:{spec.port}/health")
        await asyncio.sleep(0.5)  # parked: still running, and not back in discovery
        assert not run.done() and await operator.snapshot() == []
        wrapper.request_stop()  # SIGTERM's handler
        assert await asyncio.wait_for(run, 10) == 0
    finally:
        if not run.done():
            wrapper.request_stop()
            await asyncio.wait_for(run, 30)


def test_switchable_is_refused_for_engines_that_cannot_switch(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["worker", "--role", "prefill", "--switchable", "--engine", "sglang", "--model", "m"]) == 2
    assert "--switchable: only vLLM" in capsys.readouterr().err

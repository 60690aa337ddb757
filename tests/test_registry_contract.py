"""The Registry contract (discovery/registry.py), checked against every backend by one parametrized suite.

Each backend comes with a harness that builds registries sharing one store (a directory for ``file``, the Consul
test double for ``consul``) and that can write broken entries straight into that store, bypassing the backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Protocol

import httpx
import pytest

from litellm_disagg.discovery.consul.registry import ConsulRegistry
from litellm_disagg.discovery.consul.settings import ConsulRegistrySettings
from litellm_disagg.discovery.file.registry import FileRegistry
from litellm_disagg.discovery.registry import Registry, RegistryError
from litellm_disagg.discovery.roles import AfterDrain, RoleNotServable, RoleRequest, UnknownWorker
from litellm_disagg.runtime_config import RuntimeConfig, VllmNixlTransfer, WorkerRole, WorkerState

from .consul_double import ConsulDouble
from .support.registry_watch import WatchCollector, eventually

TTL_S = 10.0
"""The entries' TTL: long, so a slow step on a loaded machine never ages an entry out in a test about something else
(these tests publish once and do not heartbeat)."""
SHORT_TTL_S = 1.5
"""The TTL of the test about expiry itself (heartbeats every 0.15 s keep an entry alive; silence ends it)."""
INVALID_KINDS = ["garbage", "wrong_types", "unknown_role", "missing_fields", "duplicate_id", "oversized"]


def make_config(
    worker_id: str, *, state: WorkerState = WorkerState.READY, model: str = "tiny-model",
    allowed_roles: tuple[WorkerRole, ...] = (),
) -> RuntimeConfig:
    return RuntimeConfig(
        worker_id=worker_id,
        model=model,
        role=WorkerRole.PREFILL,
        allowed_roles=allowed_roles,
        base_url="http://127.0.0.1:8100/v1",
        transfer=VllmNixlTransfer(host="127.0.0.1", port=5600),
        kv_capacity_blocks=1000,
        block_size=16,
        state=state,
    )


def broken_fields(kind: str, valid: RuntimeConfig) -> dict[str, Any]:
    """A config dump broken in one way (``garbage`` is backend-specific and handled by each harness)."""
    fields = valid.model_dump(mode="json") | {"worker_id": f"bad-{kind.replace('_', '-')}"}
    if kind == "wrong_types":
        fields["kv_capacity_blocks"] = "lots"
    elif kind == "unknown_role":
        fields["role"] = "oracle"
    elif kind == "missing_fields":
        fields = {"worker_id": fields["worker_id"], "model": fields["model"]}
    elif kind == "duplicate_id":
        fields["worker_id"] = valid.worker_id  # stored under another id/name than its own worker_id
    elif kind == "oversized":
        fields["model"] = "m" * 500  # RuntimeConfig allows 256 (and Consul Meta would still take it)
    return fields


class Harness(Protocol):
    name: str

    def registry(self, ttl_s: float = TTL_S) -> Registry: ...

    async def inject_invalid(self, kind: str, valid: RuntimeConfig) -> None: ...

    async def write_role_request(self, worker_id: str, raw: bytes) -> None: ...

    async def aclose(self) -> None: ...


class FileHarness:
    name = "file"

    def __init__(self, directory: Path):
        self.directory = directory
        self._registries: list[FileRegistry] = []

    def registry(self, ttl_s: float = TTL_S) -> Registry:
        registry = FileRegistry(self.directory, ttl_s=ttl_s, poll_interval_s=0.05)
        self._registries.append(registry)
        return registry

    async def inject_invalid(self, kind: str, valid: RuntimeConfig) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        name = f"bad-{kind.replace('_', '-')}.worker.json"
        if kind == "garbage":
            (self.directory / name).write_text("{not json")
            return
        record = {"heartbeat_at": time.time() + 60, "config": broken_fields(kind, valid)}
        (self.directory / name).write_text(json.dumps(record))

    async def write_role_request(self, worker_id: str, raw: bytes) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / f"{worker_id}.role.json").write_bytes(raw)

    async def aclose(self) -> None:
        for registry in self._registries:
            await registry.close()


class ConsulHarness:
    name = "consul"

    def __init__(self, double: ConsulDouble):
        self.double = double
        self.settings = ConsulRegistrySettings(
            address=double.address, check_ttl_s=TTL_S, heartbeat_interval_s=TTL_S / 4, wait_s=2.0,
            min_query_interval_s=0.01, retry_min_s=0.05, retry_max_s=0.2, request_timeout_s=2.0,
        )
        self._registries: list[ConsulRegistry] = []

    def registry(self, ttl_s: float = TTL_S) -> Registry:
        settings = self.settings.model_copy(update={"check_ttl_s": ttl_s, "heartbeat_interval_s": ttl_s / 4})
        registry = ConsulRegistry(settings, environ={})
        self._registries.append(registry)
        return registry

    async def inject_invalid(self, kind: str, valid: RuntimeConfig) -> None:
        """Register a broken worker through the double's HTTP API, as a foreign or buggy client would."""
        service_id = f"bad-{kind.replace('_', '-')}"
        if kind == "garbage":  # Meta points at a KV document that is not JSON
            document = b"{not json"
            key = f"litellm-disagg/workers/{service_id}/{hashlib.sha256(document).hexdigest()[:16]}"
            meta = {"ld_format": "kv-1", "ld_kv_key": key}
        else:
            document, key = b"", ""
            meta = {k: v if isinstance(v, str) else json.dumps(v) for k, v in broken_fields(kind, valid).items()}
            meta["ld_format"] = "meta-1"
        async with httpx.AsyncClient(base_url=self.double.url, trust_env=False) as client:
            if key:
                (await client.put(f"/v1/kv/{key}", content=document)).raise_for_status()
            response = await client.put("/v1/agent/service/register", json={
                "ID": service_id, "Name": "litellm-disagg-tiny-model", "Tags": ["litellm-disagg", "prefill", "ready"],
                "Address": "127.0.0.1", "Port": 8100, "Meta": meta,
                "Check": {"TTL": "60s", "Status": "passing"},
            })
            response.raise_for_status()

    async def write_role_request(self, worker_id: str, raw: bytes) -> None:
        async with httpx.AsyncClient(base_url=self.double.url, trust_env=False) as client:
            (await client.put(f"/v1/kv/litellm-disagg/roles/{worker_id}", content=raw)).raise_for_status()

    async def aclose(self) -> None:
        for registry in self._registries:
            await registry.close()
        await self.double.close()


@pytest.fixture(params=["file", "consul"])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Harness]:
    harness: Harness
    if request.param == "file":
        harness = FileHarness(tmp_path / "registry")
    else:
        double = ConsulDouble()
        await double.start()
        harness = ConsulHarness(double)
    try:
        yield harness
    finally:
        await harness.aclose()


# -- the contract ------------------------------------------------------------------------------------------------------


async def test_publish_then_snapshot_sees_it(backend: Harness) -> None:
    writer, reader = backend.registry(), backend.registry()
    config = make_config("w-1")
    await writer.publish(config)
    assert await reader.snapshot() == [config]


async def test_publish_with_new_state_replaces(backend: Harness) -> None:
    writer, reader = backend.registry(), backend.registry()
    starting = make_config("w-1", state=WorkerState.STARTING)
    await writer.publish(starting)
    await writer.publish(starting.with_state(WorkerState.READY))
    assert await reader.snapshot() == [starting.with_state(WorkerState.READY)]


async def test_snapshot_is_sorted_by_worker_id(backend: Harness) -> None:
    writer, reader = backend.registry(), backend.registry()
    for worker_id in ("w-c", "w-a", "w-b"):
        await writer.publish(make_config(worker_id, model=f"model-{worker_id}"))
    assert [c.worker_id for c in await reader.snapshot()] == ["w-a", "w-b", "w-c"]


async def test_withdraw_removes(backend: Harness) -> None:
    writer, reader = backend.registry(), backend.registry()
    await writer.publish(make_config("w-1"))
    await writer.publish(make_config("w-2"))
    await writer.withdraw("w-1")
    assert [c.worker_id for c in await reader.snapshot()] == ["w-2"]


async def test_withdraw_unknown_is_fine(backend: Harness) -> None:
    registry = backend.registry()
    await registry.withdraw("never-published")
    assert await registry.snapshot() == []


async def test_heartbeat_of_unpublished_worker_is_an_error(backend: Harness) -> None:
    with pytest.raises(RegistryError):
        await backend.registry().heartbeat("never-published")


async def test_heartbeat_keeps_alive_and_silence_expires(backend: Harness) -> None:
    writer, reader = backend.registry(SHORT_TTL_S), backend.registry(SHORT_TTL_S)
    config = make_config("w-1")
    await writer.publish(config)
    for _ in range(int(2.5 * SHORT_TTL_S / 0.15)):  # well past one TTL
        await asyncio.sleep(0.15)
        await writer.heartbeat("w-1")
        assert await reader.snapshot() == [config]

    async def gone() -> bool:
        return await reader.snapshot() == []

    await eventually(gone, timeout_s=SHORT_TTL_S + 5.0)


async def test_watch_yields_initial_snapshot_then_changes(backend: Harness) -> None:
    writer, reader = backend.registry(), backend.registry()
    first, second = make_config("w-1"), make_config("w-2", state=WorkerState.STARTING)
    await writer.publish(first)
    watch = WatchCollector(reader)
    try:
        assert await watch.next() == [first]
        await writer.publish(second)
        assert await watch.until(lambda configs: len(configs) == 2) == [first, second]
        await writer.publish(second.with_state(WorkerState.READY))
        assert await watch.until(lambda configs: configs[-1].routable) == [first, second.with_state(WorkerState.READY)]
        await writer.withdraw("w-1")
        assert await watch.until(lambda configs: len(configs) == 1) == [second.with_state(WorkerState.READY)]
    finally:
        await watch.stop()


async def test_watch_starts_empty(backend: Harness) -> None:
    watch = WatchCollector(backend.registry())
    try:
        assert await watch.next() == []
    finally:
        await watch.stop()


@pytest.mark.parametrize("kind", INVALID_KINDS)
async def test_invalid_entries_are_skipped_and_logged_once(
    backend: Harness, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    writer, reader = backend.registry(), backend.registry()
    valid = make_config("w-ok")
    await writer.publish(valid)
    await backend.inject_invalid(kind, valid)
    caplog.set_level(logging.WARNING, logger="litellm_disagg")

    assert await reader.snapshot() == [valid]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings, "an invalid entry must be logged"
    assert await reader.snapshot() == [valid]
    watch = WatchCollector(reader)
    try:
        assert await watch.next() == [valid]
    finally:
        await watch.stop()
    assert [r for r in caplog.records if r.levelno == logging.WARNING] == warnings, "logged once, not per poll"


async def test_close_ends_watch(backend: Harness) -> None:
    registry = backend.registry()
    watch = WatchCollector(registry)
    await watch.next()
    await registry.close()
    await asyncio.wait_for(watch.task, 2.0)
    assert watch.task.done() and not watch.task.cancelled()


async def test_watch_after_close_ends_at_once(backend: Harness) -> None:
    registry = backend.registry()
    await registry.close()
    watch = WatchCollector(registry)
    await asyncio.wait_for(watch.task, 2.0)


# -- role requests (discovery/roles.py) ------------------------------------------------------------------------------

SWITCHABLE = (WorkerRole.PREFILL, WorkerRole.DECODE, WorkerRole.BOTH)


class RoleCollector:
    """Collects what ``role_requests(worker_id)`` yields, in a task."""

    def __init__(self, registry: Registry, worker_id: str):
        self.seen: list[RoleRequest | None] = []
        self.task = asyncio.create_task(self._run(registry, worker_id))

    async def _run(self, registry: Registry, worker_id: str) -> None:
        async for request in registry.role_requests(worker_id):
            self.seen.append(request)

    async def until(self, predicate: Any, timeout_s: float = 5.0) -> RoleRequest | None:
        async def ok() -> bool:
            return bool(self.seen) and predicate(self.seen[-1])

        await eventually(ok, timeout_s=timeout_s)
        return self.seen[-1]

    async def stop(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


async def test_role_request_reaches_the_worker(backend: Harness) -> None:
    worker, planner = backend.registry(), backend.registry()
    switchable = make_config("w-1", allowed_roles=SWITCHABLE)
    await worker.publish(switchable)
    assert await planner.snapshot() == [switchable]  # allowed_roles survive the store (Consul: Meta)
    requests = RoleCollector(worker, "w-1")
    try:
        assert await requests.until(lambda r: True) is None  # nothing requested yet: yields None at once
        await planner.request_role("w-1", WorkerRole.DECODE)
        got = await requests.until(lambda r: r is not None)
        assert got is not None and got.worker_id == "w-1" and got.role is WorkerRole.DECODE
        await planner.request_role("w-1", WorkerRole.BOTH)
        assert (await requests.until(lambda r: r is not None and r.role is WorkerRole.BOTH)) is not None
    finally:
        await requests.stop()


async def test_role_request_for_an_unknown_worker_is_refused(backend: Harness) -> None:
    planner = backend.registry()
    await backend.registry().publish(make_config("w-1", allowed_roles=SWITCHABLE))
    with pytest.raises(UnknownWorker, match="no-such-worker"):
        await planner.request_role("no-such-worker", WorkerRole.DECODE)


async def test_role_request_the_launch_cannot_serve_is_refused(backend: Harness) -> None:
    worker, planner = backend.registry(), backend.registry()
    await worker.publish(make_config("w-fixed"))  # launched for prefill only
    with pytest.raises(RoleNotServable, match="--switchable"):
        await planner.request_role("w-fixed", WorkerRole.DECODE)
    await planner.request_role("w-fixed", WorkerRole.PREFILL)  # its own role is always servable


async def test_drain_request_reaches_the_worker_with_its_own_role(backend: Harness) -> None:
    worker, operator = backend.registry(), backend.registry()
    await worker.publish(make_config("w-fixed"))  # any worker drains, switchable or not
    requests = RoleCollector(worker, "w-fixed")
    try:
        assert await requests.until(lambda r: True) is None
        await operator.request_drain("w-fixed")
        got = await requests.until(lambda r: r is not None)
        # the published role, so that a worker that predates ``drain`` reads a request for the role it has
        assert got is not None and got.drain and got.role is WorkerRole.PREFILL and got.worker_id == "w-fixed"
        assert got.after_drain is AfterDrain.EXIT
        await operator.request_drain("w-fixed", then=AfterDrain.PARK)  # drain --park: the same request, parking
        got = await requests.until(lambda r: r is not None and r.after_drain is AfterDrain.PARK)
        assert got is not None and got.drain and got.role is WorkerRole.PREFILL
    finally:
        await requests.stop()
    with pytest.raises(UnknownWorker, match="no-such-worker"):
        await operator.request_drain("no-such-worker")


async def test_withdraw_deletes_the_role_request(backend: Harness) -> None:
    worker, planner = backend.registry(), backend.registry()
    await worker.publish(make_config("w-1", allowed_roles=SWITCHABLE))
    await planner.request_role("w-1", WorkerRole.DECODE)
    await worker.withdraw("w-1")
    requests = RoleCollector(worker, "w-1")
    try:
        assert await requests.until(lambda r: True) is None
    finally:
        await requests.stop()


@pytest.mark.parametrize("raw", [b"{not json", b'{"worker_id": "w-other", "role": "decode", "requested_at": 1.0}',
                                 b'{"worker_id": "w-1", "role": "oracle", "requested_at": 1.0}', b"x" * 5000])
async def test_invalid_role_request_reads_as_none_and_is_logged(
    backend: Harness, raw: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    worker = backend.registry()
    await worker.publish(make_config("w-1", allowed_roles=SWITCHABLE))
    caplog.set_level(logging.WARNING, logger="litellm_disagg")
    await backend.write_role_request("w-1", raw)
    requests = RoleCollector(worker, "w-1")
    try:
        assert await requests.until(lambda r: True) is None
        await eventually(lambda: any("role request" in r.getMessage() for r in caplog.records), timeout_s=5.0)
    finally:
        await requests.stop()


async def test_close_ends_role_requests(backend: Harness) -> None:
    registry = backend.registry()
    requests = RoleCollector(registry, "w-1")
    await requests.until(lambda r: True)
    await registry.close()
    await asyncio.wait_for(requests.task, 5.0)
    assert requests.task.done() and not requests.task.cancelled()


async def test_backends_implement_the_protocol(tmp_path: Path) -> None:
    consul = ConsulRegistry(ConsulRegistrySettings(), environ={})
    assert isinstance(FileRegistry(tmp_path), Registry)
    assert isinstance(consul, Registry)
    await consul.close()

"""The registry interface: where workers publish their RuntimeConfig and routers find them.

Contract, shared by every backend (and checked by one contract test suite run against each):

- ``publish(config)`` registers or replaces the entry for ``config.worker_id``; it is live until ``withdraw`` or until
  the backend's liveness ends (a missed heartbeat TTL, a failing health check).
- ``heartbeat(worker_id)`` keeps a published entry alive. Workers call it periodically.
- ``withdraw(worker_id)`` removes the entry; withdrawing an unknown id is not an error.
- ``snapshot()`` returns the live, valid entries. An entry that does not validate is skipped and logged once, never
  raised: one broken worker must not take discovery down.
- ``watch()`` yields a snapshot at once and then after every change, until the registry is closed.
- ``request_role(worker_id, role)`` asks a live worker to change pool (``discovery/roles.py``): it stores the request
  and returns; it raises ``UnknownWorker`` when no live entry has that id and ``RoleNotServable`` when the entry's
  launch cannot serve the role. The worker, not this call, changes the published role.
- ``request_drain(worker_id, then=...)`` asks a live worker to drain and leave, as on SIGTERM, then exit or park
  (``roles.AfterDrain``): the same stored document with ``drain`` set and the worker's published role;
  ``UnknownWorker`` as above. The worker drains, not this call.
- ``role_requests(worker_id)`` (the worker's side) yields the worker's current ``RoleRequest`` (or ``None``) at once
  and then after every change, until the registry is closed; an invalid stored request reads as ``None`` (logged
  once). ``withdraw`` also deletes the worker's request.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from litellm_disagg.runtime_config import RuntimeConfig, WorkerRole

if TYPE_CHECKING:
    from litellm_disagg.discovery.roles import AfterDrain, RoleRequest


class RegistryError(Exception):
    """Discovery itself failed (unreachable backend, permission denied); distinct from a bad entry."""


@runtime_checkable
class Registry(Protocol):
    async def publish(self, config: RuntimeConfig) -> None: ...

    async def heartbeat(self, worker_id: str) -> None: ...

    async def withdraw(self, worker_id: str) -> None: ...

    async def snapshot(self) -> list[RuntimeConfig]: ...

    def watch(self) -> AsyncIterator[list[RuntimeConfig]]: ...

    async def request_role(self, worker_id: str, role: WorkerRole) -> None: ...

    async def request_drain(self, worker_id: str, *, then: AfterDrain = ...) -> None: ...

    def role_requests(self, worker_id: str) -> AsyncIterator[RoleRequest | None]: ...

    async def close(self) -> None: ...

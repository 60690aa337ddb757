"""Role requests: how a planner or an operator asks a running worker to change pool (``docs/role-change.md``).

A role request is one small document per worker in the registry's store, next to (not inside) the worker's entry:
the planner or ``litellm-disagg role`` writes it with ``Registry.request_role``, the worker follows it with
``Registry.role_requests`` and answers by publishing its ``RuntimeConfig`` with the new role. ``litellm-disagg
drain`` writes the same document with ``drain`` set (``Registry.request_drain``): the worker drains and leaves, as on
SIGTERM, and its withdraw deletes the request (a worker started again under that id does not drain at once); with
``after_drain: park`` (``litellm-disagg drain --park``) it then stops its engine and waits for SIGTERM instead of
exiting, so whatever restarts exited workers (a Kubernetes Deployment) does not start it again. Routers read only the
published role: a request is a wish the worker may refuse (its launch cannot serve the role, it is draining), the
published role is what the worker now serves.

Who may write a request is who may write discovery (``docs/security.md``): the same trust boundary as entries. The
writer checks the request against the live entries (unknown worker, role the launch cannot serve: refused with
``UnknownWorker`` / ``RoleNotServable``), and the worker checks again, since the store may hold anything.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from enum import StrEnum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from litellm_disagg.discovery.registry import RegistryError
from litellm_disagg.json_fields import JsonFloat, json_enum
from litellm_disagg.runtime_config import RuntimeConfig, WorkerId, WorkerRole

MAX_REQUEST_BYTES = 4096
"""A role request is under 200 bytes; anything this large is not one."""


class UnknownWorker(RegistryError):
    """A role request for a worker discovery does not list (never announced, withdrawn, or aged out)."""


class RoleNotServable(RegistryError):
    """A role request the worker's launch cannot serve (it was not started ``--switchable``)."""


class AfterDrain(StrEnum):
    """What a worker does once a drain request's drain is over and it has left discovery."""

    EXIT = "exit"
    """Stop the engine and exit 0, as on SIGTERM (``litellm-disagg up`` and systemd's ``Restart=on-failure`` leave it
    stopped)."""
    PARK = "park"
    """Stop the engine (its accelerator memory freed, its HTTP port closed, so a readiness probe fails) and keep the
    process alive until SIGTERM, then exit 0 at once. For a Kubernetes Deployment, which would start an exited pod
    again: scaled down by one, its ReplicaSet deletes a not-ready pod before any ready one."""


class RoleRequest(BaseModel):
    """One worker's requested role, as stored. Strict: a store anyone can write is read as untrusted."""

    model_config = ConfigDict(frozen=True, extra="ignore", strict=True)

    worker_id: WorkerId
    role: Annotated[WorkerRole, json_enum(WorkerRole)]
    requested_at: JsonFloat = Field(default_factory=time.time)
    """Unix time of the request (the writer's clock): for logs and for measuring the flip, never for ordering."""
    drain: bool = False
    """Drain and leave, as on SIGTERM (``litellm-disagg drain``; ``role`` is then the worker's own, so a worker from
    before this field reads a request for the role it has, and does nothing)."""
    after_drain: Annotated[AfterDrain, json_enum(AfterDrain)] = AfterDrain.EXIT
    """With ``drain``: exit, or park until SIGTERM (a worker from before this field exits)."""

    def encode(self) -> bytes:
        return self.model_dump_json().encode()


def decode_request(raw: bytes, worker_id: str) -> RoleRequest:
    """A stored request -> ``RoleRequest``; raises ``ValueError`` (incl. pydantic's) for anything else, including a
    request stored under another worker's name."""
    if len(raw) > MAX_REQUEST_BYTES:
        raise ValueError(f"more than {MAX_REQUEST_BYTES} bytes")
    request = RoleRequest.model_validate_json(raw)
    if request.worker_id != worker_id:
        raise ValueError(f"stored for {worker_id!r} but names {request.worker_id!r}")
    return request


def drain_request(live: Iterable[RuntimeConfig], worker_id: str, then: AfterDrain = AfterDrain.EXIT) -> RoleRequest:
    """The request that asks a live worker to drain and leave (its published role kept), then exit or park; raises
    ``UnknownWorker``."""
    for config in live:
        if config.worker_id == worker_id:
            return RoleRequest(worker_id=worker_id, role=config.role, drain=True, after_drain=AfterDrain(then))
    raise UnknownWorker(f"no live worker {worker_id!r} in discovery")


def check_request(live: Iterable[RuntimeConfig], worker_id: str, role: WorkerRole) -> RuntimeConfig:
    """The live entry the request is for; raises ``UnknownWorker`` or ``RoleNotServable`` with the reason."""
    role = WorkerRole(role)
    for config in live:
        if config.worker_id == worker_id:
            if not config.can_serve_role(role):
                servable = ", ".join(r.value for r in dict.fromkeys((config.role, *config.allowed_roles)))
                raise RoleNotServable(
                    f"worker {worker_id!r} cannot serve role {role.value!r}: its launch serves {servable} "
                    "(start it with --switchable to change roles at runtime)"
                )
            return config
    raise UnknownWorker(f"no live worker {worker_id!r} in discovery")

"""``litellm-disagg role WORKER prefill|decode|both``: move a running worker to another pool by hand.

It writes the role request through the registry (``Registry.request_role``, the same call the planner makes), prints
what it asked, then follows discovery until the worker publishes the new role or ``--timeout`` passes. Exit codes:
0 the worker publishes the role (or already did), 1 timed out (the request stays: a worker that comes back follows
it), 2 refused (unknown worker, a role its launch cannot serve, discovery unreachable).
"""

from __future__ import annotations

import time
from typing import TextIO

from litellm_disagg.discovery.registry import Registry, RegistryError
from litellm_disagg.discovery.roles import RoleNotServable, UnknownWorker
from litellm_disagg.discovery.worker_watch import find_worker, watch_worker
from litellm_disagg.runtime_config import WorkerRole


async def change_role(
    registry: Registry, worker_id: str, role: WorkerRole, *, timeout_s: float, out: TextIO, err: TextIO
) -> int:
    try:
        before = find_worker(await registry.snapshot(), worker_id)
        await registry.request_role(worker_id, role)
    except (UnknownWorker, RoleNotServable) as exc:
        print(f"litellm-disagg role: refused: {exc}", file=err)
        return 2
    except RegistryError as exc:
        print(f"litellm-disagg role: discovery failed: {exc}", file=err)
        return 2
    started = time.monotonic()
    old = before.role.value if before is not None else "?"
    if before is not None and before.role is role:
        print(f"{worker_id}: already {role.value} (request recorded)", file=out)
        return 0
    print(f"{worker_id}: {old} -> {role.value} requested; waiting for the worker to publish it", file=out, flush=True)
    try:
        outcome = await watch_worker(
            registry, worker_id, until=lambda entry: entry is not None and entry.role is role, timeout_s=timeout_s
        )
    except RegistryError as exc:
        print(f"litellm-disagg role: discovery failed while waiting: {exc}", file=err)
        return 1
    now = outcome.entry
    if outcome.reached and now is not None:
        print(f"{worker_id}: now {role.value} ({now.state.value}), published "
              f"{time.monotonic() - started:.2f} s after the request", file=out)
        return 0
    state = f"still publishes {now.role.value} ({now.state.value})" if now is not None else "is no longer listed"
    print(f"litellm-disagg role: {worker_id} {state} after {timeout_s:g} s; the request stays in discovery "
          "(see the worker's log for a refusal)", file=err)
    return 1

"""``litellm-disagg drain WORKER``: drain a running worker and take it out of discovery, from wherever discovery is
reachable (no signal to its process, no shell on its machine).

It writes a drain request through the registry (``Registry.request_drain``: the role-request document with ``drain``
set), prints what it asked, then follows discovery: the worker publishes ``draining`` (routers send it nothing new),
finishes what it holds (running and queued requests, prefills whose KV a decode worker has yet to pull; the
worker's ``--drain-timeout`` and ``--drain-settle``), withdraws and exits, exactly as on SIGTERM. Exit codes: 0 the
worker left discovery, 1 it had not left within ``--timeout`` (the request stays; the worker goes on draining),
2 refused (unknown worker, discovery unreachable).

What runs the worker decides what happens next: ``litellm-disagg up`` and a systemd unit with ``Restart=on-failure``
leave a drained worker stopped (it exits 0); a Kubernetes Deployment would start its pod again, so there use
``--park``: the worker stops its engine and stays up, not ready, until SIGTERM, and the Deployment's next scale-down
removes it first (a ReplicaSet deletes not-ready pods before ready ones; docs/planner.md, "In Kubernetes").
``litellm-disagg drain-hook`` is the same request for the worker the planner names in its hook's environment.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TextIO

from litellm_disagg.discovery.registry import Registry, RegistryError
from litellm_disagg.discovery.roles import AfterDrain, UnknownWorker
from litellm_disagg.discovery.worker_watch import watch_worker
from litellm_disagg.runtime_config import RuntimeConfig, WorkerState


async def drain_worker(
    registry: Registry, worker_id: str, *, timeout_s: float, out: TextIO, err: TextIO,
    then: AfterDrain = AfterDrain.EXIT,
) -> int:
    if not await _request(registry, worker_id, then, command="drain", err=err):
        return 2
    started = time.monotonic()
    parks = " (it parks after)" if then is AfterDrain.PARK else ""
    print(f"{worker_id}: drain requested{parks}; waiting for it to finish its work and leave discovery", file=out,
          flush=True)
    draining_seen = False

    def progress(entry: RuntimeConfig | None) -> None:
        nonlocal draining_seen
        if entry is not None and entry.state is WorkerState.DRAINING and not draining_seen:
            draining_seen = True
            print(f"{worker_id}: draining (published {time.monotonic() - started:.2f} s after the request)",
                  file=out, flush=True)

    try:
        outcome = await watch_worker(
            registry, worker_id, until=lambda entry: entry is None, timeout_s=timeout_s, on_entry=progress
        )
    except RegistryError as exc:
        print(f"litellm-disagg drain: discovery failed while waiting: {exc}", file=err)
        return 1
    if outcome.reached:
        print(f"{worker_id}: left discovery {time.monotonic() - started:.2f} s after the request", file=out)
        return 0
    state = outcome.entry.state.value if outcome.entry is not None else "?"
    print(f"litellm-disagg drain: {worker_id} still listed ({state}) after {timeout_s:g} s; the request stays in "
          "discovery (see the worker's log: a worker that takes no drain request logs a refusal)", file=err)
    return 1


DRAIN_WORKER_ENV = "LITELLM_DISAGG_DRAIN_WORKER"
"""Set by the planner in its hook's environment when the pools shrink (``planner/hook.py``)."""


async def drain_named_worker(
    registry: Registry, environ: Mapping[str, str], *, then: AfterDrain, out: TextIO, err: TextIO
) -> int:
    """``litellm-disagg drain-hook``, the planner's ``hook_command``: request the drain of the worker the planner
    names in ``LITELLM_DISAGG_DRAIN_WORKER`` and return at once (the drain takes longer than a hook may run; the
    request stays in discovery and the worker carries it out). Nothing named: nothing to do, 0. Exit codes: 0 asked
    (or nothing to ask), 2 refused (the worker already left discovery, discovery unreachable)."""
    worker_id = environ.get(DRAIN_WORKER_ENV, "").strip()
    if not worker_id:
        print("litellm-disagg drain-hook: the planner names no worker to remove; nothing to drain", file=out)
        return 0
    if not await _request(registry, worker_id, then, command="drain-hook", err=err):
        return 2
    parks = ", then park until SIGTERM" if then is AfterDrain.PARK else ", then exit"
    print(f"{worker_id}: drain requested{parks} (the planner's choice)", file=out)
    return 0


async def _request(registry: Registry, worker_id: str, then: AfterDrain, *, command: str, err: TextIO) -> bool:
    """Write the drain request; False (said on ``err``) when refused or discovery failed."""
    try:
        await registry.request_drain(worker_id, then=then)
    except UnknownWorker as exc:
        print(f"litellm-disagg {command}: refused: {exc}", file=err)
        return False
    except RegistryError as exc:
        print(f"litellm-disagg {command}: discovery failed: {exc}", file=err)
        return False
    return True

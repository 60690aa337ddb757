"""``litellm-disagg drain WORKER``: drain a running worker and take it out of discovery, from wherever discovery is
reachable (no signal to its process, no shell on its machine).

It writes a drain request through the registry (``Registry.request_drain``: the role-request document with ``drain``
set), prints what it asked, then follows discovery: the worker publishes ``draining`` (routers send it nothing new),
finishes what it holds (running and queued requests, prefills whose KV a decode worker has yet to pull; the
worker's ``--drain-timeout`` and ``--drain-settle``), withdraws and exits, exactly as on SIGTERM. Exit codes: 0 the
worker left discovery, 1 it had not left within ``--timeout`` (the request stays; the worker goes on draining),
2 refused (unknown worker, discovery unreachable).

What runs the worker decides what happens next: ``litellm-disagg up`` and a systemd unit with ``Restart=on-failure``
leave a drained worker stopped (it exits 0); a Kubernetes Deployment starts its pod again. There, scale the
Deployment down instead (the pod gets SIGTERM and drains the same way; docs/planner.md, "Beyond one machine").
"""

from __future__ import annotations

import asyncio
import time
from typing import TextIO

from litellm_disagg.discovery.registry import Registry, RegistryError
from litellm_disagg.discovery.role_command import find_worker
from litellm_disagg.discovery.roles import UnknownWorker
from litellm_disagg.runtime_config import WorkerState


async def drain_worker(registry: Registry, worker_id: str, *, timeout_s: float, out: TextIO, err: TextIO) -> int:
    try:
        await registry.request_drain(worker_id)
    except UnknownWorker as exc:
        print(f"litellm-disagg drain: refused: {exc}", file=err)
        return 2
    except RegistryError as exc:
        print(f"litellm-disagg drain: discovery failed: {exc}", file=err)
        return 2
    started = time.monotonic()
    print(f"{worker_id}: drain requested; waiting for it to finish its work and leave discovery", file=out, flush=True)
    draining_seen = False
    try:
        async with asyncio.timeout(timeout_s):
            async for configs in registry.watch():
                current = find_worker(configs, worker_id)
                if current is None:
                    print(f"{worker_id}: left discovery {time.monotonic() - started:.2f} s after the request",
                          file=out)
                    return 0
                if current.state is WorkerState.DRAINING and not draining_seen:
                    draining_seen = True
                    print(f"{worker_id}: draining (published {time.monotonic() - started:.2f} s after the request)",
                          file=out, flush=True)
    except TimeoutError:
        pass
    except RegistryError as exc:
        print(f"litellm-disagg drain: discovery failed while waiting: {exc}", file=err)
        return 1
    now = find_worker(await registry.snapshot(), worker_id)
    state = f"still listed ({now.state.value})" if now is not None else "no longer listed"
    print(f"litellm-disagg drain: {worker_id} {state} after {timeout_s:g} s; the request stays in discovery "
          "(see the worker's log: a worker that takes no drain request logs a refusal)", file=err)
    return 1 if now is not None else 0

"""Filters: the first stage of the pipeline; each narrows the candidates of one pool, in order.

    routable   ready workers only (not starting, not draining)
    role       workers that can serve the pool's role (prefill or decode; ``both`` serves either)
    excluded   not these worker ids (a worker never prefills for itself; workers already tried)
    same_transfer  prefill workers whose engine and transfer protocol are the decode worker's (vLLM pull or push)
    cooldown   prefer workers that have not just failed a call; never refuse the last ones
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import TypeVar

from litellm_disagg.routing.cooldown import FailureCooldown
from litellm_disagg.runtime_config import RuntimeConfig, WorkerRole

W = TypeVar("W", bound=RuntimeConfig)

Filter = Callable[[Sequence[RuntimeConfig]], list[RuntimeConfig]]


def routable(candidates: Sequence[W]) -> list[W]:
    return [w for w in candidates if w.routable]


def role(pool_role: WorkerRole) -> Filter:
    """Workers that can serve ``pool_role`` (PREFILL or DECODE)."""
    if pool_role is WorkerRole.PREFILL:
        return lambda candidates: [w for w in candidates if w.role.can_prefill]
    if pool_role is WorkerRole.DECODE:
        return lambda candidates: [w for w in candidates if w.role.can_decode]
    return list


def excluded(worker_ids: Collection[str]) -> Filter:
    skip = frozenset(worker_ids)
    return lambda candidates: [w for w in candidates if w.worker_id not in skip]


def same_transfer(decode: RuntimeConfig) -> Filter:
    """Workers that can move KV to ``decode``: the same engine and the same transfer kind."""
    engine, kind = decode.engine, decode.transfer.kind
    return lambda candidates: [w for w in candidates if w.engine == engine and w.transfer.kind == kind]


def cooldown(cooling: FailureCooldown) -> Filter:
    return cooling.prefer_healthy


def apply(filters: Sequence[Filter], candidates: Sequence[RuntimeConfig]) -> list[RuntimeConfig]:
    out = list(candidates)
    for narrow in filters:
        out = narrow(out)
    return out

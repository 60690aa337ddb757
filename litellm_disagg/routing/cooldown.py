"""FailureCooldown: workers that just failed a call sit out new work for a while (the pipeline's cooldown filter)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, TypeVar

from litellm_disagg.runtime_config import RuntimeConfig

if TYPE_CHECKING:
    from litellm_disagg.routing.liveness import Liveness

T = TypeVar("T", bound=RuntimeConfig)


class FailureCooldown:
    """Workers that just failed a call (connection refused or reset, 5xx) sit out new work for ``cooldown_s``.

    Between a crash and discovery noticing it (a heartbeat TTL or a health-check interval), this keeps a dead worker
    from attracting traffic: with fewest-in-flight picking it would otherwise look like the idlest worker of all.
    A worker that is the only candidate is still used.

    With ``liveness`` (the controller sets it), each failure also probes the worker's port, and a worker that refuses
    connections is passed over until discovery drops it, however long that takes (``routing/liveness.py``): the
    cooldown alone ran out before discovery's TTL did.
    """

    def __init__(self, *, cooldown_s: float = 5.0):
        self.cooldown_s = cooldown_s
        self._until: dict[str, float] = {}
        self.liveness: Liveness | None = None

    def failed(self, worker_id: str) -> None:
        self._until[worker_id] = time.monotonic() + self.cooldown_s
        if self.liveness is not None:
            self.liveness.suspect(worker_id)

    def cooling(self, worker_id: str) -> bool:
        until = self._until.get(worker_id)
        if until is None:
            return False
        if until <= time.monotonic():
            del self._until[worker_id]
            return False
        return True

    def held(self, worker: RuntimeConfig) -> bool:
        """Whether ``worker`` refused connections and is held out until discovery drops it."""
        return self.liveness is not None and self.liveness.held(worker)

    def prefer_healthy(self, candidates: list[T]) -> list[T]:
        """Workers neither held nor cooling; else those not held; else all (never refuse the last ones)."""
        reachable = [c for c in candidates if not self.held(c)]
        healthy = [c for c in reachable if not self.cooling(c.worker_id)]
        return healthy or reachable or candidates

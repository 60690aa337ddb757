"""FailureCooldown: workers that just failed a call sit out new work for a while (the pipeline's cooldown filter)."""

from __future__ import annotations

import time
from typing import TypeVar

from litellm_disagg.runtime_config import RuntimeConfig

T = TypeVar("T", bound=RuntimeConfig)


class FailureCooldown:
    """Workers that just failed a call (connection refused or reset, 5xx) sit out new work for ``cooldown_s``.

    Between a crash and discovery noticing it (a heartbeat TTL or a health-check interval), this keeps a dead worker
    from attracting traffic: with fewest-in-flight picking it would otherwise look like the idlest worker of all.
    A worker that is the only candidate is still used.
    """

    def __init__(self, *, cooldown_s: float = 5.0):
        self.cooldown_s = cooldown_s
        self._until: dict[str, float] = {}

    def failed(self, worker_id: str) -> None:
        self._until[worker_id] = time.monotonic() + self.cooldown_s

    def cooling(self, worker_id: str) -> bool:
        until = self._until.get(worker_id)
        if until is None:
            return False
        if until <= time.monotonic():
            del self._until[worker_id]
            return False
        return True

    def prefer_healthy(self, candidates: list[T]) -> list[T]:
        healthy = [c for c in candidates if not self.cooling(c.worker_id)]
        return healthy or candidates

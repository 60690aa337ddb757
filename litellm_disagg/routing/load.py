"""In-flight load as the router itself tracks it: what it has sent to each worker and not yet seen finish.

Entries are keyed by a request key and expire after ``max_age_s`` so that a lost completion event can never leave a
worker looking busy forever.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import TypeVar

from litellm_disagg.runtime_config import RuntimeConfig

T = TypeVar("T", bound=RuntimeConfig)


@dataclass
class _Entry:
    worker_id: str
    started_at: float


class InflightTracker:
    def __init__(self, *, max_age_s: float = 900.0):
        self.max_age_s = max_age_s
        self._entries: dict[str, _Entry] = {}
        self._counts: Counter[str] = Counter()

    def start(self, key: str, worker_id: str) -> None:
        self.finish(key)
        self._entries[key] = _Entry(worker_id, time.monotonic())
        self._counts[worker_id] += 1

    def finish(self, key: str, worker_id: str | None = None) -> str | None:
        """End an entry (only if it is on ``worker_id``, when given: a late event of an earlier attempt must not end
        its retry's entry); returns the worker it was on, or None."""
        entry = self._entries.get(key)
        if entry is None or (worker_id is not None and entry.worker_id != worker_id):
            return None
        del self._entries[key]
        self._counts[entry.worker_id] -= 1
        if self._counts[entry.worker_id] <= 0:
            del self._counts[entry.worker_id]
        return entry.worker_id

    def count(self, worker_id: str) -> int:
        self._expire()
        return self._counts.get(worker_id, 0)

    def _expire(self) -> None:
        # Entries are kept in start order (a restarted key moves to the end): only the oldest can have expired.
        deadline = time.monotonic() - self.max_age_s
        while self._entries:
            key, entry = next(iter(self._entries.items()))
            if entry.started_at >= deadline:
                return
            self.finish(key)


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

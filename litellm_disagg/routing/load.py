"""In-flight load as the router itself tracks it: what it has sent to each worker and not yet seen finish.

Entries are keyed by a request key and expire after ``max_age_s`` so that a lost completion event can never leave a
worker looking busy forever.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass


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

    def finish(self, key: str) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._counts[entry.worker_id] -= 1
            if self._counts[entry.worker_id] <= 0:
                del self._counts[entry.worker_id]

    def count(self, worker_id: str) -> int:
        self._expire()
        return self._counts.get(worker_id, 0)

    def _expire(self) -> None:
        if not self._entries:
            return
        deadline = time.monotonic() - self.max_age_s
        # Entries are inserted in time order; stop at the first young one.
        for key, entry in list(self._entries.items()):
            if entry.started_at >= deadline:
                break
            self.finish(key)

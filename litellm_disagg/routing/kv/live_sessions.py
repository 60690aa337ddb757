"""Live sessions: per worker, the prefixes (conversations, shared documents) it served recently that may come back.

Each request routed to a worker leaves its prompt's last full block hash there (its *tail*). A later prompt that
contains a tracked tail continues that session: the old tail is dropped (from whichever worker held it) and the new
prompt's tail is recorded on the worker it goes to. A tail not continued within ``window_s`` is forgotten. The count
per worker is what the ``live_sessions`` scorer reads: how many sessions a worker may be asked to continue.

O(1) amortized per request for the bookkeeping plus one dict lookup per block of the routed prompt; bounded by
``max_tracked`` (the oldest tails go first).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence

from litellm_disagg.routing.pipeline.profile import SessionSettings


class LiveSessions:
    def __init__(self, settings: SessionSettings, *, clock: Callable[[], float] = time.monotonic):
        self.window_s = settings.window_s
        self.max_tracked = settings.max_tracked
        self._clock = clock
        self._tails: OrderedDict[int, tuple[str, float]] = OrderedDict()
        """tail hash -> (worker id, last seen), oldest first."""
        self._per_worker: dict[str, int] = {}

    def routed(self, worker_id: str, hashes: Sequence[int]) -> None:
        """A prompt with these chained block hashes was sent to ``worker_id``."""
        if not hashes:
            return
        now = self._clock()
        tails = self._tails
        if tails:
            for h in hashes:
                if h in tails:
                    self._drop(h)
        tail = hashes[-1]
        tails[tail] = (worker_id, now)
        self._per_worker[worker_id] = self._per_worker.get(worker_id, 0) + 1
        self._expire(now)
        while len(tails) > self.max_tracked:
            self._drop(next(iter(tails)))

    def counts(self) -> Mapping[str, int]:
        """Live sessions per worker (workers with none are absent)."""
        self._expire(self._clock())
        return dict(self._per_worker)

    def forget(self, worker_id: str) -> None:
        """The worker left: its sessions are gone with its cache."""
        for h in [h for h, (wid, _) in self._tails.items() if wid == worker_id]:
            del self._tails[h]
        self._per_worker.pop(worker_id, None)

    def _drop(self, tail: int) -> None:
        wid, _ = self._tails.pop(tail)
        left = self._per_worker[wid] - 1
        if left:
            self._per_worker[wid] = left
        else:
            del self._per_worker[wid]

    def _expire(self, now: float) -> None:
        tails, horizon = self._tails, now - self.window_s
        while tails:
            oldest = next(iter(tails))
            if tails[oldest][1] > horizon:
                break
            self._drop(oldest)

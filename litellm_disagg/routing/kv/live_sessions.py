"""Live sessions: per worker, the prefixes (conversations, shared documents) it served recently that may come back.

Each request routed to a worker leaves its prompt's last full block hash there (its *tail*). A later prompt that
contains a tracked tail continues that session: the old tail is dropped (from whichever worker held it) and the new
prompt's tail is recorded on the worker it goes to. A tail not continued within ``window_s`` is forgotten. The count
per worker is what the ``live_sessions`` scorer reads: how many sessions a worker may be asked to continue.

O(1) amortized per request for the bookkeeping plus one dict lookup per block of the routed prompt; bounded by
``max_tracked`` (the oldest tails go first).

**Next turns expected soon** (``next_turns``; the ``live_sessions`` scorer's input with ``sessions.expect:
next_turns``): a count cannot tell a worker whose conversations are all generating (their next turns are seconds
away) from one whose conversations have just been answered (their next turns arrive in the user's think time): the
second reads idle, and a new conversation's cold prompt placed there delays those next turns by a whole prefill
(issue 13 item 4: later turns behind a cold prompt 28-38 of 120 against an oracle's 21-23). So a tail also records
its call (``routed(..., call_id=...)``) and when that call ended (``ended``); a continuation of an ended tail
records the gap from the end to the next turn (the think time, measured: the last ``GAPS_KEPT`` gaps). A tail
ended ``a`` seconds ago comes back within the next ``h`` seconds with the measured gaps' conditional share
``#(a < gap <= a + h) / #(gap > a)``; ``next_turns(h)`` sums that per worker over the ended tails younger than the
longest gap kept (an older one had every measured gap to come back in). Calls still running count nothing (their
next turn comes after their answer and a think time). Without measured gaps (traffic with no next turns, such as
single questions over shared documents), nothing is expected anywhere: the scorer is neutral.
"""

from __future__ import annotations

import bisect
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from litellm_disagg.routing.pipeline.profile import SessionSettings

GAPS_KEPT = 256
"""Measured gaps from a call's end to its conversation's next turn, newest kept (``next_turns``)."""


@dataclass(slots=True)
class _Tail:
    worker_id: str
    seen_at: float
    call_id: str | None = None
    ended_at: float | None = None


class LiveSessions:
    def __init__(self, settings: SessionSettings, *, clock: Callable[[], float] = time.monotonic):
        self.window_s = settings.window_s
        self.max_tracked = settings.max_tracked
        self._clock = clock
        self._tails: OrderedDict[int, _Tail] = OrderedDict()
        """tail hash -> its worker, when last seen, its call and when that ended; oldest first."""
        self._per_worker: dict[str, int] = {}
        self._calls: dict[str, int] = {}
        """call id -> the tail it left (until the call ends or the tail goes)."""
        self._ended: deque[tuple[int, float]] = deque()
        """(tail, ended at) in the order the calls ended: entries whose tail has since gone or changed are skipped."""
        self._gaps: deque[float] = deque(maxlen=GAPS_KEPT)
        self._sorted_gaps: list[float] | None = None

    def routed(self, worker_id: str, hashes: Sequence[int], *, call_id: str | None = None) -> None:
        """A prompt with these chained block hashes was sent to ``worker_id`` (under ``call_id``, when known)."""
        if not hashes:
            return
        now = self._clock()
        tails = self._tails
        if tails:
            for h in hashes:
                if h in tails:
                    ended = tails[h].ended_at
                    if ended is not None and now >= ended:
                        self._gaps.append(now - ended)
                        self._sorted_gaps = None
                    self._drop(h)
        tail = hashes[-1]
        tails[tail] = _Tail(worker_id, now, call_id)
        if call_id is not None:
            self._calls[call_id] = tail
        self._per_worker[worker_id] = self._per_worker.get(worker_id, 0) + 1
        self._expire(now)
        while len(tails) > self.max_tracked:
            self._drop(next(iter(tails)))

    def ended(self, call_id: str) -> None:
        """The call ``call_id`` ended (its answer is complete): its conversation's next turn may come."""
        tail = self._calls.pop(call_id, None)
        if tail is None:
            return
        record = self._tails.get(tail)
        if record is None or record.call_id != call_id:
            return
        now = self._clock()
        record.ended_at = now
        ended = self._ended
        ended.append((tail, now))
        while len(ended) > self.max_tracked:
            ended.popleft()

    def counts(self) -> Mapping[str, int]:
        """Live sessions per worker (workers with none are absent)."""
        self._expire(self._clock())
        return dict(self._per_worker)

    def next_turns(self, horizon_s: float) -> dict[str, float]:
        """Per worker, the next turns expected within ``horizon_s`` from its sessions whose last call ended (the
        module's docstring); workers with none expected are absent."""
        gaps = self._sorted_gaps
        if gaps is None:
            gaps = self._sorted_gaps = sorted(self._gaps)
        if not gaps:
            return {}
        now = self._clock()
        longest, n = gaps[-1], len(gaps)
        tails, out = self._tails, {}
        for tail, ended_at in reversed(self._ended):  # newest first
            age = now - ended_at
            if age >= longest:
                break
            record = tails.get(tail)
            if record is None or record.ended_at != ended_at:
                continue
            later = n - bisect.bisect_right(gaps, age)  # gaps longer than the age: it may still come back
            within = bisect.bisect_right(gaps, age + horizon_s) - (n - later)
            if within > 0:
                out[record.worker_id] = out.get(record.worker_id, 0.0) + within / later
        return out

    def forget(self, worker_id: str) -> None:
        """The worker left: its sessions are gone with its cache."""
        for h in [h for h, t in self._tails.items() if t.worker_id == worker_id]:
            self._drop(h)
        self._per_worker.pop(worker_id, None)

    def _drop(self, tail: int) -> None:
        record = self._tails.pop(tail)
        if record.call_id is not None and self._calls.get(record.call_id) == tail:
            del self._calls[record.call_id]
        left = self._per_worker[record.worker_id] - 1
        if left:
            self._per_worker[record.worker_id] = left
        else:
            del self._per_worker[record.worker_id]

    def _expire(self, now: float) -> None:
        tails, horizon = self._tails, now - self.window_s
        while tails:
            oldest = next(iter(tails))
            if tails[oldest].seen_at > horizon:
                break
            self._drop(oldest)
        ended = self._ended
        while ended and ended[0][1] <= horizon:
            ended.popleft()


class NextTurns(Mapping[str, float]):
    """``LiveSessions.next_turns(horizon_s)``, computed on first use: a routing context carries it for every
    decision, and only a request no worker has cached reads it."""

    def __init__(self, sessions: LiveSessions, horizon_s: float):
        self._sessions, self._horizon_s = sessions, horizon_s
        self._values: dict[str, float] | None = None

    def _computed(self) -> dict[str, float]:
        if self._values is None:
            self._values = self._sessions.next_turns(self._horizon_s)
        return self._values

    def __getitem__(self, worker_id: str) -> float:
        return self._computed()[worker_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._computed())

    def __len__(self) -> int:
        return len(self._computed())

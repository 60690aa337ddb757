"""Accounting: the one owner of what this router has in flight on each worker.

Every in-flight entry is started, advanced and ended here, under a typed ``FlightKey`` (the phase and LiteLLM's call
id or our request id), never under a string built by the caller. Per worker it keeps three figures that the load
snapshot (``pipeline.context.collect_loads``) reads for every decision:

- requests in flight (decodes and prefills this router sent and has not seen finish);
- prompt tokens still to be prefilled there (a remote prefill's uncached tokens; a decode that prefills locally);
- prompt tokens whose KV is still to arrive there by transfer (a decode whose prompt is prefilled remotely, until
  its first token: the remote prefill, the pull and the step that samples it);
- KV blocks of the requests decoding there.

Who calls what::

    strategy      start(decode)  when the decode worker is chosen; finish(decode) if planning fails
    orchestrator  start(prefill) / finish(prefill) around each prefill call (a concurrent protocol's background
                  prefill too, under a key of its own per attempt, so a retry's flight is never ended by an earlier one)
    controller    prefill_done(decode) on a stream's first chunk; finish(decode) on its last chunk and on LiteLLM's
                  success/failure events (the first to arrive ends it; the others find nothing)
    KVRouter      prefill_done(decode) when the decode worker's KV events show the prompt's last full block
                  (``routing/kv/prefill_seen.py``; precise mode): a non-streamed call has no first chunk

Entries expire after ``max_age_s``, so a lost completion event can never pin a worker as busy.

With several proxy replicas, ``routing/shared_inflight.py`` publishes this replica's totals (``own_totals``) and
hands back the other replicas' (``set_others``): the reads (``lookups``, ``prefill_tokens``, ...) then count both,
so a decision sees what every replica has sent; ``own_lookups`` stays this replica's alone (its metrics).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from operator import attrgetter
from typing import Protocol

from litellm_disagg.routing.replica_slot import ReplicaSlot


class Phase(StrEnum):
    PREFILL = "prefill"
    DECODE = "decode"


@dataclass(frozen=True, slots=True)
class FlightKey:
    """One in-flight call: a decode (keyed by LiteLLM's call id) or a prefill (keyed by our request id)."""

    phase: Phase
    id: str

    @classmethod
    def decode(cls, call_id: str) -> FlightKey:
        return cls(Phase.DECODE, call_id)

    @classmethod
    def prefill(cls, request_id: str) -> FlightKey:
        return cls(Phase.PREFILL, request_id)


@dataclass(frozen=True, slots=True)
class WorkerFlights:
    """One worker's in-flight totals, as one replica counts them (the figures ``Accounting`` keeps per worker)."""

    requests: int = 0
    prefill_tokens: int = 0
    decode_blocks: int = 0
    pull_tokens: int = 0


@dataclass(slots=True)
class _Entry:
    worker_id: str
    prefill_tokens: int
    decode_blocks: int
    started_at: float
    pull_tokens: int = 0


class PrefillWatcher(Protocol):
    """Told when a call's prompt tokens to compute start and stop counting (``kv/prefill_progress.py``)."""

    def sent(self, key: FlightKey, worker_id: str, tokens: int, at: float) -> None: ...

    def over(self, key: FlightKey, at: float) -> None: ...

    def dropped(self, key: FlightKey) -> None: ...


class Accounting:
    def __init__(self, *, max_age_s: float = 900.0, clock: Callable[[], float] = time.monotonic):
        self.max_age_s = max_age_s
        self._clock = clock
        self._entries: dict[FlightKey, _Entry] = {}
        self._requests: Counter[str] = Counter()
        self._prefill: Counter[str] = Counter()
        self._decode: Counter[str] = Counter()
        self._pull: Counter[str] = Counter()
        self._others: dict[str, WorkerFlights] = {}
        """The other proxy replicas' totals per worker (``set_others``), added to every read but ``own_lookups``."""
        self.version = 0
        """Counts changes to the per-worker figures (a cached load snapshot is valid while it stays the same)."""
        self.replica_slot: ReplicaSlot | None = None
        """This replica's slot among the live proxy replicas (set by the in-flight exchange; None: alone, or not
        known): every decision's scoring context carries it, and the picker splits ties by it."""
        self.prefill_watcher: PrefillWatcher | None = None
        """Told of every call's prompt tokens to compute: sent (``start``), over (``prefill_done``), or dropped
        (``finish`` before ``prefill_done``): KV-aware routing's ``PrefillProgress`` estimates from them how far each
        worker has got."""
        self.on_prefill_queued: Callable[[], None] | None = None
        """Called after a ``start`` that queues prompt tokens to compute on a worker: the in-flight exchange between
        proxy replicas publishes it at once (``ExchangeLoop.nudge``), so another replica about to place a prompt
        sees it a round trip later instead of up to two intervals later."""

    # -- changes -------------------------------------------------------------------------------------------------------

    def start(
        self, key: FlightKey, worker_id: str, *, prefill_tokens: int = 0, decode_blocks: int = 0, pull_tokens: int = 0
    ) -> None:
        """Count a call sent to ``worker_id`` (replacing any entry under ``key``). ``pull_tokens``: prompt tokens
        whose KV reaches ``worker_id`` by transfer (a decode prefilled remotely), until ``prefill_done``."""
        self.finish(key)
        now = self._clock()
        self._entries[key] = _Entry(worker_id, prefill_tokens, decode_blocks, now, pull_tokens)
        self.version += 1
        self._requests[worker_id] += 1
        if prefill_tokens:
            self._prefill[worker_id] += prefill_tokens
        if decode_blocks:
            self._decode[worker_id] += decode_blocks
        if pull_tokens:
            self._pull[worker_id] += pull_tokens
        if prefill_tokens and self.prefill_watcher is not None:
            self.prefill_watcher.sent(key, worker_id, prefill_tokens, now)
        if prefill_tokens and self.on_prefill_queued is not None:
            self.on_prefill_queued()

    def prefill_done(self, key: FlightKey) -> None:
        """The call's prompt is computed or its KV arrived (its first token came back): its prefill and pull tokens
        stop counting."""
        entry = self._entries.get(key)
        if entry is None or not (entry.prefill_tokens or entry.pull_tokens):
            return
        if entry.prefill_tokens and self.prefill_watcher is not None:
            self.prefill_watcher.over(key, self._clock())
        _sub(self._prefill, entry.worker_id, entry.prefill_tokens)
        _sub(self._pull, entry.worker_id, entry.pull_tokens)
        entry.prefill_tokens = entry.pull_tokens = 0
        self.version += 1

    def finish(self, key: FlightKey, worker_id: str | None = None) -> str | None:
        """End an entry (only if it is on ``worker_id``, when given: a late event of an earlier attempt must not end
        its retry's entry); returns the worker it was on, or None when there was none."""
        entry = self._entries.get(key)
        if entry is None or (worker_id is not None and entry.worker_id != worker_id):
            return None
        del self._entries[key]
        self.version += 1
        if entry.prefill_tokens and self.prefill_watcher is not None:
            self.prefill_watcher.dropped(key)
        _sub(self._requests, entry.worker_id, 1)
        _sub(self._prefill, entry.worker_id, entry.prefill_tokens)
        _sub(self._decode, entry.worker_id, entry.decode_blocks)
        _sub(self._pull, entry.worker_id, entry.pull_tokens)
        return entry.worker_id

    def expire(self) -> None:
        """Drop entries older than ``max_age_s``. Insertion order is start order (a restarted key moves to the end):
        only the oldest can have expired."""
        entries = self._entries
        if not entries:
            return
        deadline = self._clock() - self.max_age_s
        while entries:
            key, entry = next(iter(entries.items()))
            if entry.started_at >= deadline:
                return
            self.finish(key)

    def set_others(self, others: dict[str, WorkerFlights]) -> None:
        """The other replicas' totals per worker, summed (replacing the last ones; ``{}``: none, or not known)."""
        if others != self._others:
            self._others = others
            self.version += 1

    # -- reads ---------------------------------------------------------------------------------------------------------

    def requests(self, worker_id: str) -> int:
        self.expire()
        other = self._others.get(worker_id)
        return self._requests.get(worker_id, 0) + (other.requests if other else 0)

    def prefill_tokens(self, worker_id: str) -> int:
        self.expire()
        other = self._others.get(worker_id)
        return self._prefill.get(worker_id, 0) + (other.prefill_tokens if other else 0)

    def decode_blocks(self, worker_id: str) -> int:
        self.expire()
        other = self._others.get(worker_id)
        return self._decode.get(worker_id, 0) + (other.decode_blocks if other else 0)

    def pull_tokens(self, worker_id: str) -> int:
        self.expire()
        other = self._others.get(worker_id)
        return self._pull.get(worker_id, 0) + (other.pull_tokens if other else 0)

    def own_totals(self) -> dict[str, WorkerFlights]:
        """This replica's own totals per worker with anything in flight (what ``shared_inflight`` publishes)."""
        self.expire()
        workers = self._requests.keys() | self._prefill.keys() | self._decode.keys() | self._pull.keys()
        return {
            wid: WorkerFlights(self._requests.get(wid, 0), self._prefill.get(wid, 0), self._decode.get(wid, 0),
                               self._pull.get(wid, 0))
            for wid in workers
        }

    def worker_of(self, key: FlightKey) -> str | None:
        entry = self._entries.get(key)
        return None if entry is None else entry.worker_id

    def lookups(self) -> tuple[Callable[[str, int], int], Callable[[str, int], int], Callable[[str, int], int]]:
        """Expire once, then ``get(worker_id, 0)`` lookups of (requests, prefill tokens, decode blocks), for many
        workers at one instant (one decision's load snapshot), the other replicas' totals included."""
        own = self.own_lookups()
        if not self._others:
            return own
        others = self._others
        return (_plus(own[0], others, "requests"), _plus(own[1], others, "prefill_tokens"),
                _plus(own[2], others, "decode_blocks"))

    def own_lookups(self) -> tuple[Callable[[str, int], int], Callable[[str, int], int], Callable[[str, int], int]]:
        """As ``lookups``, this replica's own figures only (its per-worker metrics: Prometheus sums the replicas)."""
        self.expire()
        return self._requests.get, self._prefill.get, self._decode.get

    def pull_lookup(self) -> Callable[[str, int], int]:
        """``get(worker_id, 0)`` of pull tokens, as ``lookups()`` (call it after ``lookups()``, which expires)."""
        if not self._others:
            return self._pull.get
        return _plus(self._pull.get, self._others, "pull_tokens")

    def __len__(self) -> int:
        return len(self._entries)


def _plus(own: Callable[[str, int], int], others: dict[str, WorkerFlights], figure: str) -> Callable[[str, int], int]:
    get = others.get
    read = attrgetter(figure)

    def lookup(worker_id: str, default: int) -> int:
        other = get(worker_id)
        return own(worker_id, default) + (read(other) if other is not None else 0)

    return lookup


def _sub(counter: Counter[str], worker_id: str, amount: int) -> None:
    if amount:
        left = counter[worker_id] - amount
        if left > 0:
            counter[worker_id] = left
        else:
            del counter[worker_id]

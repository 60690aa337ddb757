"""What each routed request's decode worker did, timed from the proxy, fed back into the remote-or-local cost model.

The prefill line (``DisaggDecider.prefill``) is fitted from remote prefills only: with every request local, the local
option's price stayed a prior (measured on real vLLM: 85 ms predicted against 1.5-1.8 s measured), and the
decode-stall charge (``decode_time_weight``) was a prior too. Here both paths and the stall are observed where the
proxy sees them::

    KVRouter.observe   dispatched(call_id, local, tokens, queued_tokens, worker_id,   the plan is final: sent now
                                  prefill_worker_id)
    controller         chunk(call_id)                                                  every streamed chunk
    controller         ended(call_id)                                                  the call ended

- **First token**, from the moment the request is handed to its decode worker to its first streamed chunk
  (``DisaggDecider.observe_first_token``): for a local request, its whole prefill there (queue, compute, first
  step); for a remote one, what follows the remote prefill (the pull and the first step). A non-streamed request is
  not observed. **A first call is not observed**: a request sent to a decode worker that has not yet answered a
  first token through this watch, or (remote) over a prefill-decode pair that has not, pays one-off costs: the
  proxy's first call to a deployment (LiteLLM builds its HTTP client: 0.25-0.3 s measured on 4 simulated decode
  workers started at once) and the pair's first NIXL transfer (its handshake: up to seconds on vLLM). Observed, they
  made the line of the path that happened to go first look 10x slower than it is, and with every later request on the
  other path nothing corrected it until ``estimate_ttl_s`` (seen: 4 warm-up requests, all remote, put the remote tail
  at 0.28 s against 20-60 ms on the workers; then 0% remote). Such calls still count as prefilling and time gaps.
- **Prefill over in events** (``prefill_over``, from ``prefill_seen.py``): a local request whose worker's KV events
  show its prompt's last block stops marking the worker as prefilling then, not at its first chunk (a non-streamed
  request: not at its end).
- **Inter-token gaps** of the streams that follow (``DisaggDecider.observe_decode_gap``), each marked by whether its
  worker was prefilling a prompt locally at any time within the gap (a local request dispatched there and not yet
  at its first token). ``stall_fit.py`` turns them into ``decode_time_weight``.

Pure bookkeeping: no I/O, a clock; entries are bounded by age and count.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol


class DecodeObserver(Protocol):
    def observe_first_token(self, *, local: bool, tokens: int, seconds: float, queued_tokens: int = 0) -> None: ...

    def observe_decode_gap(self, seconds: float, *, during_prefill: bool) -> None: ...


@dataclass(frozen=True, slots=True)
class Dispatched:
    """A request sent to its decode worker, awaiting its first token."""

    local: bool
    """Prefilled on the decode worker (else remotely, its KV pulled)."""
    tokens: int
    """Local: prompt tokens the decode worker lacked; remote: tokens it pulls."""
    queued_tokens: int
    """Local: prompt tokens queued for prefill on the decode worker when it was chosen."""
    worker_id: str | None
    at: float
    prefill_over: bool = False
    """Its prefill was seen over in the worker's KV events before any chunk (``prefill_over``)."""
    cold: bool = False
    """Sent before its worker (or, remote, its prefill-decode pair) answered any first token: not observed."""
    pair: tuple[str, str] | None = None
    """Remote: (prefill worker, decode worker)."""


@dataclass(slots=True)
class _Stream:
    worker_id: str
    last_at: float


class DecodeWatch:
    def __init__(
        self,
        observer: DecodeObserver,
        *,
        max_age_s: float = 900.0,
        max_entries: int = 65_536,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._observer = observer
        self.max_age_s = max_age_s
        self.max_entries = max_entries
        self._clock = clock
        self._pending: dict[str, Dispatched] = {}
        self._streams: dict[str, _Stream] = {}
        self._prefilling: dict[str, int] = {}
        """Local prefills under way per worker (dispatched, no first token yet)."""
        self._prefill_ended: dict[str, float] = {}
        """When each worker's last local prefill ended (its first token, or its call's end)."""
        self._answered: set[str | tuple[str, str]] = set()
        """Decode workers, and (prefill, decode) pairs, that have answered a first token: their calls are warm."""
        self.cold_calls = 0
        """First calls whose first token was not observed (``Dispatched.cold``)."""

    def dispatched(
        self, call_id: str, *, local: bool, tokens: int, queued_tokens: int = 0, worker_id: str | None = None,
        prefill_worker_id: str | None = None,
    ) -> None:
        """``call_id`` goes to its decode worker now (a retry replaces its earlier attempt); a remote one's KV comes
        from ``prefill_worker_id``."""
        now = self._clock()
        self._drop(call_id, now)
        if len(self._pending) >= self.max_entries or len(self._streams) >= self.max_entries:
            self._expire(now)
            for entries in (self._pending, self._streams):
                while len(entries) >= self.max_entries:  # oldest first (insertion order)
                    self._drop(next(iter(entries)), now)
        pair = None if local or worker_id is None or prefill_worker_id is None else (prefill_worker_id, worker_id)
        cold = worker_id is not None and not (worker_id in self._answered and (pair is None or pair in self._answered))
        self._pending[call_id] = Dispatched(local, max(0, tokens), max(0, queued_tokens), worker_id, now,
                                            cold=cold, pair=pair)
        if local and worker_id is not None:
            self._prefilling[worker_id] = self._prefilling.get(worker_id, 0) + 1

    def chunk(self, call_id: str) -> None:
        """A streamed chunk of ``call_id`` arrived: the first one times the first token, later ones a gap."""
        now = self._clock()
        stream = self._streams.get(call_id)
        if stream is not None:
            gap = now - stream.last_at
            worker = stream.worker_id
            during = self._prefilling.get(worker, 0) > 0 or self._prefill_ended.get(worker, -1.0) > stream.last_at
            stream.last_at = now
            self._observer.observe_decode_gap(gap, during_prefill=during)
            return
        entry = self._pending.pop(call_id, None)
        if entry is None:
            return
        self._prefill_done(entry, now)
        seconds = now - entry.at
        if seconds > self.max_age_s:
            return
        if entry.worker_id is not None:
            self._streams[call_id] = _Stream(entry.worker_id, now)
            self._warm(entry.worker_id, entry.pair)
        if entry.cold:
            self.cold_calls += 1
            return
        self._observer.observe_first_token(
            local=entry.local, tokens=entry.tokens, seconds=seconds, queued_tokens=entry.queued_tokens
        )

    def prefill_over(self, call_id: str) -> None:
        """The call's prefill was seen over in its worker's KV events (``prefill_seen.py``), before any chunk: a local
        one stops marking its worker as prefilling (a non-streamed call, which has no chunk, until its end). Its
        first chunk, if it streams, is still timed."""
        entry = self._pending.get(call_id)
        if entry is None or entry.prefill_over:
            return
        self._prefill_done(entry, self._clock())
        self._pending[call_id] = replace(entry, prefill_over=True)

    def ended(self, call_id: str) -> None:
        """The call ended: nothing more to observe (a non-streamed one had nothing)."""
        self._drop(call_id, self._clock())

    def __len__(self) -> int:
        return len(self._pending) + len(self._streams)

    def prefilling(self, worker_id: str) -> int:
        return self._prefilling.get(worker_id, 0)

    def _prefill_done(self, entry: Dispatched, now: float) -> None:
        worker = entry.worker_id
        if not entry.local or worker is None or entry.prefill_over:
            return
        left = self._prefilling.get(worker, 0) - 1
        if left > 0:
            self._prefilling[worker] = left
        else:
            self._prefilling.pop(worker, None)
        self._prefill_ended[worker] = now

    def _drop(self, call_id: str, now: float) -> None:
        entry = self._pending.pop(call_id, None)
        if entry is not None:
            self._prefill_done(entry, now)
        self._streams.pop(call_id, None)

    def _warm(self, worker_id: str, pair: tuple[str, str] | None) -> None:
        if len(self._answered) >= self.max_entries:  # workers come and go: forget them all, rarely
            self._answered.clear()
        self._answered.add(worker_id)
        if pair is not None:
            self._answered.add(pair)

    def _expire(self, now: float) -> None:
        for call_id in [c for c, e in self._pending.items() if now - e.at > self.max_age_s]:
            self._drop(call_id, now)
        for call_id in [c for c, s in self._streams.items() if now - s.last_at > self.max_age_s]:
            del self._streams[call_id]

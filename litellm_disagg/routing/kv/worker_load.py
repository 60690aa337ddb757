"""Per-worker load as the scorers see it: the router's own in-flight figures plus the worker's scraped metrics.

- ``TokenLoadTracker`` is the router's own count, in tokens and blocks, of what it sent and has not seen finish:
  prompt tokens a worker still has to prefill, KV blocks of requests decoding on it. Entries expire after
  ``max_age_s`` so that a lost completion can never pin a worker (as ``routing.load.InflightTracker`` does for
  request counts).
- ``WorkerLoad`` is one immutable snapshot per worker, built by ``collect_loads`` for one routing decision (a named
  tuple: 64 of them per decision must cost microseconds).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from litellm_disagg.routing.kv.load_scraper import NOT_SCRAPED, ScrapedLoad
from litellm_disagg.routing.load import InflightTracker
from litellm_disagg.runtime_config import RuntimeConfig


class WorkerLoad(NamedTuple):
    worker_id: str
    kv_capacity_blocks: int
    inflight_requests: int = 0
    """Requests this router has in flight there (``InflightTracker``)."""
    inflight_prefill_tokens: int = 0
    """Prompt tokens this router sent there that are still being prefilled."""
    inflight_decode_blocks: int = 0
    """KV blocks of the requests this router has decoding there."""
    scraped: ScrapedLoad = NOT_SCRAPED

    # The properties below spell ``max(a, b)`` as ``b if b > a else a``: the same value (``max`` keeps the first of
    # equal values and never prefers a NaN second argument) without a builtin call; dozens run per decision.

    @property
    def active_requests(self) -> float:
        """Requests running or queued there: the larger of the router's count and the engine's (which also sees
        other routers' requests, but lags by up to a scrape interval)."""
        scraped = self.scraped
        ours = float(self.inflight_requests)
        if scraped.stale:
            return ours
        engine = scraped.running + scraped.waiting
        return engine if engine > ours else ours

    @property
    def used_blocks(self) -> float:
        """KV blocks in use: the larger of the router's in-flight decode blocks and the engine's reported usage."""
        scraped = self.scraped
        engine = 0.0 if scraped.stale else scraped.kv_usage * self.kv_capacity_blocks
        ours = float(self.inflight_decode_blocks)
        return engine if engine > ours else ours

    @property
    def free_kv_fraction(self) -> float:
        capacity = self.kv_capacity_blocks
        if capacity <= 0:
            return 0.0
        free = 1.0 - self.used_blocks / capacity
        return free if free > 0.0 else 0.0


@dataclass
class _Entry:
    worker_id: str
    prefill_tokens: int
    decode_blocks: int
    started_at: float


class TokenLoadTracker:
    def __init__(self, *, max_age_s: float = 900.0, clock: Callable[[], float] = time.monotonic):
        self.max_age_s = max_age_s
        self._clock = clock
        self._entries: dict[str, _Entry] = {}
        self._prefill: Counter[str] = Counter()
        self._decode: Counter[str] = Counter()

    def start(self, key: str, worker_id: str, *, prefill_tokens: int = 0, decode_blocks: int = 0) -> None:
        """Count a request sent to ``worker_id`` (replacing any entry under ``key``)."""
        self.finish(key)
        self._entries[key] = _Entry(worker_id, prefill_tokens, decode_blocks, self._clock())
        self._prefill[worker_id] += prefill_tokens
        self._decode[worker_id] += decode_blocks

    def prefill_done(self, key: str) -> None:
        """The request's prompt is computed (its first token came back): its prefill tokens stop counting."""
        entry = self._entries.get(key)
        if entry is not None and entry.prefill_tokens:
            self._sub(self._prefill, entry.worker_id, entry.prefill_tokens)
            entry.prefill_tokens = 0

    def finish(self, key: str) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._sub(self._prefill, entry.worker_id, entry.prefill_tokens)
            self._sub(self._decode, entry.worker_id, entry.decode_blocks)

    def prefill_tokens(self, worker_id: str) -> int:
        self.expire()
        return self._prefill.get(worker_id, 0)

    def decode_blocks(self, worker_id: str) -> int:
        self.expire()
        return self._decode.get(worker_id, 0)

    def counts(self, worker_id: str) -> tuple[int, int]:
        """``(prefill tokens, decode blocks)`` without expiring first (call ``expire()`` once per decision)."""
        return self._prefill.get(worker_id, 0), self._decode.get(worker_id, 0)

    def lookups(self) -> tuple[Callable[[str, int], int], Callable[[str, int], int]]:
        """``counts`` as two lookups (``get(worker_id, 0)``) of the prefill tokens and the decode blocks, for many
        workers at one instant (no expiry either)."""
        return self._prefill.get, self._decode.get

    @staticmethod
    def _sub(counter: Counter[str], worker_id: str, amount: int) -> None:
        if amount:
            counter[worker_id] -= amount
            if counter[worker_id] <= 0:
                del counter[worker_id]

    def expire(self) -> None:
        """Drop entries older than ``max_age_s`` (a lost completion must not pin a worker)."""
        entries = self._entries
        if not entries:
            return
        deadline = self._clock() - self.max_age_s
        while entries:  # insertion order is start order: only the oldest can have expired
            key, entry = next(iter(entries.items()))
            if entry.started_at >= deadline:
                return
            self.finish(key)


def collect_loads(
    candidates: Iterable[RuntimeConfig],
    *,
    inflight: InflightTracker | None = None,
    tokens: TokenLoadTracker | None = None,
    scraped: Mapping[str, ScrapedLoad] | Callable[[str], ScrapedLoad] | None = None,
) -> dict[str, WorkerLoad]:
    """One snapshot per candidate, from whichever sources are given (``scraped``: a mapping, or a lookup such as
    ``LoadScraper.lookup()``)."""
    if scraped is None:
        lookup: Callable[[str], ScrapedLoad] = lambda _: NOT_SCRAPED  # noqa: E731
    elif isinstance(scraped, Mapping):
        lookup = lambda wid: scraped.get(wid, NOT_SCRAPED)  # noqa: E731
    else:
        lookup = scraped
    if tokens is not None:
        tokens.expire()
        prefill_of, decode_of = tokens.lookups()
    else:
        prefill_of = decode_of = _zero
    # ``tuple.__new__`` builds the same named tuple as ``WorkerLoad(...)`` without the Python-level ``__new__`` that
    # namedtuple generates (64 snapshots per decision).
    make = tuple.__new__
    out: dict[str, WorkerLoad] = {}
    if inflight is None:
        for worker in candidates:
            wid = worker.worker_id
            out[wid] = make(
                WorkerLoad, (wid, worker.kv_capacity_blocks, 0, prefill_of(wid, 0), decode_of(wid, 0), lookup(wid))
            )
    else:
        count = inflight.count
        for worker in candidates:
            wid = worker.worker_id
            out[wid] = make(
                WorkerLoad,
                (wid, worker.kv_capacity_blocks, count(wid), prefill_of(wid, 0), decode_of(wid, 0), lookup(wid)),
            )
    return out


def _zero(_worker_id: str, default: int) -> int:
    return default

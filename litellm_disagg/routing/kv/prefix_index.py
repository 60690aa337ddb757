"""PrefixIndex: which worker holds which prefix blocks, queried by a prompt's chained block hashes.

Two layers, one query:

- **held** blocks, per worker, in an LRU bounded by the worker's KV capacity (ordered by store, refreshed when the
  router sends a request that uses them, so close to the engine's own eviction order). A worker is either *precise*
  (fed by its KV events: ``stored``/``removed``/``cleared``, entries live until the engine says otherwise) or
  *approximate* (fed by the router's own decisions through ``record_routed``; entries expire ``ttl_s`` after their
  last use);
- **predicted** blocks: ``record_routed`` on a precise worker notes the request's blocks for a short while, until the
  worker's ``BlockStored`` arrives (which replaces the prediction) or ``predicted_ttl_s`` passes (the request failed).
  Without it, sibling requests sent together would all miss the prefix the first of them is computing.

Contracts:

- ``overlap(hashes)`` is side-effect free: ``{worker_id: number of leading blocks held or predicted}`` (held only with
  ``predicted=False``), for workers holding at least the first block. It stops at the first block a worker lacks (a
  prefix cache can only use a contiguous prefix). Cost: one dict lookup per block until no worker matches (an 8k-token prompt is 512 blocks at
  block size 16: tens of microseconds).
- Time-based expiry (approximate entries, predictions) and the release of a departed or cleared worker's entries
  happen in ``maintain()``, which the owner calls periodically; between two calls, an expired entry may still count.
- ``cleared`` and ``remove_worker`` take effect at once whatever the worker's size: its slot is retired (masked out of
  every query) and its entries are released by later ``maintain()`` calls, a bounded number at a time, so no call
  blocks the event loop for long.

Representation: each worker gets a slot (a bit); ``hash -> bitmask of slots`` for both layers, so a query does one
table lookup and one AND per block whatever the number of workers. With the compiled core (``native.py``) the held
layer's table is a ``MaskTable`` (C integers, open addressing: one cache miss per probe instead of a dict entry, a key
object and a mask object; no Python int per mask) while the masks fit 64 bits; past 64 slots (live or retired) it
turns into a dict, which the pure-Python paths use throughout and which stays the reference the compiled index is
tested against. Every other big table is a plain dict of ints and floats, which CPython's cyclic garbage collector
does not track: a million entries add nothing to a collection's pause (an ``OrderedDict`` LRU would add about 60 ms
to every full collection). Each worker's LRU is a dict in insertion order
(a touch re-inserts at the end); when it outgrows its capacity, the oldest ``capacity / 16`` entries go at once, so
scanning past the holes that deletions leave at the dict's front costs O(1) per insertion on average.

The compiled KV-event path reaches a precise worker's entries through ``precise_sink`` (a ``_kvcore.PreciseSink``:
``stored`` / ``removed`` without a Python call per message), which stays valid until the slots change.
"""

from __future__ import annotations

import functools
import itertools
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from litellm_disagg.routing.kv.block_hash import BlockHash
from litellm_disagg.routing.kv.native import core as _native

_NATIVE_SLOTS = 64
"""The compiled core's masks are 64-bit: it runs while every slot index (live or retired) is below this."""

_NO_EXPIRY = math.inf
"""The expiry stored for precise entries (one shared float object, so they cost no extra memory)."""


class _Slot:
    __slots__ = ("capacity", "held", "predicted", "ttl_s", "worker_id")

    def __init__(self, worker_id: str, capacity: int, ttl_s: float | None):
        self.worker_id = worker_id
        self.capacity = capacity
        self.ttl_s = ttl_s
        self.held: dict[BlockHash, float] = {}
        """Block hash -> expiry (``_NO_EXPIRY`` for precise workers), least recently stored first."""
        self.predicted: dict[BlockHash, float] = {}
        """Block hash -> expiry of its prediction."""


@dataclass(frozen=True)
class IndexStats:
    workers: int
    held_blocks: int
    """Sum over workers of the blocks each holds (a block held by three workers counts three times)."""
    distinct_blocks: int
    predicted_blocks: int
    pending_release: int
    """Entries of retired slots (departed or cleared workers) not yet released by ``maintain()``."""


class PrefixIndex:
    def __init__(self, *, predicted_ttl_s: float = 30.0, clock: Callable[[], float] = time.monotonic):
        if predicted_ttl_s <= 0:
            raise ValueError("predicted_ttl_s must be positive")
        self.predicted_ttl_s = predicted_ttl_s
        self._clock = clock
        self._slots: list[_Slot | None] = []
        self._slot_of: dict[str, int] = {}
        self._alive = 0
        self._free: list[int] = []
        self._retired: deque[int] = deque()
        self._core: ModuleType | None = _native
        """The compiled core while its loops run (it is built, and every slot index is below 64), else None."""
        self._held: Any = _native.MaskTable() if _native is not None else {}
        """Block hash -> slot mask: a ``MaskTable`` with the compiled core (dict methods, C integers), else a dict."""
        self._predicted: dict[BlockHash, int] = {}
        self._prediction_queue: deque[tuple[float, _Slot, int, tuple[BlockHash, ...]]] = deque()
        self._sinks: list[Any] = []
        """The ``PreciseSink``s handed out since the slots last changed (``_invalidate_sinks`` marks them stale)."""

    # -- workers ------------------------------------------------------------------------------------------------------

    def add_worker(self, worker_id: str, *, capacity_blocks: int, ttl_s: float | None = None) -> None:
        """Start indexing ``worker_id`` (idempotent). ``ttl_s`` None: precise (event-fed); else approximate.

        Called again for a known worker, it updates the capacity (evicting the oldest entries past it) and the TTL.
        """
        if capacity_blocks < 1:
            raise ValueError(f"capacity_blocks must be positive, got {capacity_blocks}")
        if ttl_s is not None and ttl_s <= 0:
            raise ValueError("ttl_s must be positive or None")
        self._invalidate_sinks()
        index = self._slot_of.get(worker_id)
        if index is not None:
            slot = self._slot(index)
            slot.capacity, slot.ttl_s = capacity_blocks, ttl_s
            self._trim(slot, 1 << index)
            return
        self._slot_of[worker_id] = self._new_slot(_Slot(worker_id, capacity_blocks, ttl_s))

    def remove_worker(self, worker_id: str) -> None:
        """Forget a worker that left (no-op if unknown). Its entries stop counting at once."""
        index = self._slot_of.pop(worker_id, None)
        if index is not None:
            self._retire(index)

    def workers(self) -> list[str]:
        return list(self._slot_of)

    def is_precise(self, worker_id: str) -> bool:
        index = self._slot_of.get(worker_id)
        return index is not None and self._slot(index).ttl_s is None

    # -- updates ------------------------------------------------------------------------------------------------------

    def stored(self, worker_id: str, hashes: Iterable[BlockHash]) -> None:
        """The worker now holds these blocks (a ``BlockStored`` event, or a routed request in approximate mode).
        Unknown workers are ignored."""
        index = self._slot_of.get(worker_id)
        if index is None:
            return
        slot = self._slot(index)
        bit = 1 << index
        held = self._held
        held_get = held.get
        lru = slot.held
        if slot.predicted:
            hashes = list(hashes)
            self._confirm_predictions(slot, bit, hashes)
        core = self._core
        if slot.ttl_s is None and core is not None:
            core.store_precise(held, lru, hashes, bit, _NO_EXPIRY)  # the loop below, compiled
        elif slot.ttl_s is None:  # precise: the stored expiry never changes, a known block only moves to the end
            for h in hashes:
                mask = held_get(h, 0)
                if mask & bit:
                    del lru[h]  # re-inserted at the end: most recently stored
                else:
                    held[h] = mask | bit
                lru[h] = _NO_EXPIRY
        else:
            expiry = self._clock() + slot.ttl_s
            for h in hashes:
                mask = held_get(h, 0)
                if mask & bit:
                    del lru[h]
                else:
                    held[h] = mask | bit
                lru[h] = expiry
        if len(lru) > slot.capacity:
            self._trim(slot, bit)

    def removed(self, worker_id: str, hashes: Iterable[BlockHash]) -> None:
        """The worker evicted these blocks. Unknown workers and blocks are ignored."""
        index = self._slot_of.get(worker_id)
        if index is None:
            return
        core = self._core
        if core is not None:
            core.remove(self._held, self._slot(index).held, hashes, 1 << index)  # the loop below, compiled
            return
        pop = self._slot(index).held.pop
        held = self._held
        keep = ~(1 << index)
        for h in hashes:
            if pop(h, None) is not None:
                mask = held[h] & keep
                if mask:
                    held[h] = mask
                else:
                    del held[h]

    def cleared(self, worker_id: str) -> None:
        """The worker dropped its whole cache (``AllBlocksCleared``, an engine restart, lost events)."""
        index = self._slot_of.get(worker_id)
        if index is None:
            return
        old = self._slot(index)
        self._retire(index)
        self._slot_of[worker_id] = self._new_slot(_Slot(worker_id, old.capacity, old.ttl_s))

    def record_routed(self, worker_id: str, hashes: Sequence[BlockHash]) -> None:
        """The router sent a request with these blocks to the worker: an approximate worker now holds them; a precise
        worker gets a prediction until its ``BlockStored`` arrives."""
        index = self._slot_of.get(worker_id)
        if index is None or not hashes:
            return
        slot = self._slot(index)
        if slot.ttl_s is not None:
            self.stored(worker_id, hashes)
            return
        bit = 1 << index
        lru = slot.held
        touch = getattr(self._core, "touch_routed", None)  # None: pure Python, or a build older than this kernel
        fresh: list[BlockHash]
        if touch is not None:
            fresh = touch(self._held, lru, hashes, bit)  # the loop below, compiled
        else:
            held_get = self._held.get
            fresh = []
            for h in hashes:
                if held_get(h, 0) & bit:  # the engine is about to use it: keep the LRU close to the engine's own order
                    lru[h] = lru.pop(h)
                else:
                    fresh.append(h)
        if not fresh or len(slot.predicted) + len(fresh) > slot.capacity:
            return
        expiry = self._clock() + self.predicted_ttl_s
        predicted = self._predicted
        for h in fresh:
            slot.predicted[h] = expiry
            predicted[h] = predicted.get(h, 0) | bit
        self._prediction_queue.append((expiry, slot, bit, tuple(fresh)))

    def precise_sink(self, worker_id: str) -> Any:
        """``stored`` / ``removed`` for the worker without a Python call: a ``_kvcore.PreciseSink`` (see there), valid
        until the index's slots change (its ``valid`` then turns False: ask again). None without the compiled core.

        It applies events itself (``fast``) for a precise worker while the index is on the compiled core; otherwise
        its methods return False and the caller calls ``stored`` / ``removed``."""
        make = getattr(_native, "PreciseSink", None)  # None: pure Python, or a build older than the sink
        if make is None:
            return None
        index = self._slot_of.get(worker_id)
        slot = None if index is None else self._slot(index)
        if slot is None or slot.ttl_s is not None or self._core is not _native:
            sink = make()  # applies nothing: the caller takes the Python methods until the slots change
        else:
            bit = 1 << index
            trim = functools.partial(self._trim, slot, bit)
            sink = make(self._held, slot.held, slot.predicted, self._predicted, bit, slot.capacity, _NO_EXPIRY, trim)
        self._sinks.append(sink)
        return sink

    # -- queries ------------------------------------------------------------------------------------------------------

    def overlap(self, hashes: Sequence[BlockHash], *, predicted: bool = True) -> dict[str, int]:
        """``{worker_id: leading blocks of hashes held or predicted}`` for every worker holding the first block;
        ``predicted=False``: held blocks only."""
        if not hashes or not self._alive:
            return {}
        held = self._held
        predicted_ = self._predicted if predicted else {}
        if predicted_:
            current = (held.get(hashes[0], 0) | predicted_.get(hashes[0], 0)) & self._alive
        else:
            current = held.get(hashes[0], 0) & self._alive
        if not current:
            return {}
        out: dict[str, int] = {}
        core = self._core
        if core is not None and isinstance(hashes, list):
            # The walk below, compiled: (slots that stop, blocks they hold), in the order the walk credits them.
            for bits, count in core.overlap_walk(held, predicted_, hashes, current):
                self._credit(out, bits, count)
            return out
        position = 1
        if predicted_:
            for position in range(1, len(hashes)):
                h = hashes[position]
                mask = (held.get(h, 0) | predicted_.get(h, 0)) & current
                if mask != current:
                    self._credit(out, current & ~mask, position)
                    current = mask
                    if not current:
                        return out
            position = len(hashes)
        else:
            for position in range(1, len(hashes)):
                mask = held.get(hashes[position], 0) & current
                if mask != current:
                    self._credit(out, current & ~mask, position)
                    current = mask
                    if not current:
                        return out
            position = len(hashes)
        self._credit(out, current, position)
        return out

    @property
    def has_predictions(self) -> bool:
        """Whether any worker has a predicted block (``overlap`` then may differ from its held-only form)."""
        return bool(self._predicted)

    def holds(self, worker_id: str, h: BlockHash) -> bool:
        """Whether the worker holds the block (predictions excluded)."""
        index = self._slot_of.get(worker_id)
        return index is not None and bool(self._held.get(h, 0) & (1 << index))

    def blocks(self, worker_id: str) -> int:
        """Blocks the worker holds (predictions excluded)."""
        index = self._slot_of.get(worker_id)
        return 0 if index is None else len(self._slot(index).held)

    def stats(self) -> IndexStats:
        live = [self._slot(i) for i in self._slot_of.values()]
        return IndexStats(
            workers=len(live),
            held_blocks=sum(len(s.held) for s in live),
            distinct_blocks=len(self._held),
            predicted_blocks=sum(len(s.predicted) for s in live),
            pending_release=sum(len(self._slot(i).held) + len(self._slot(i).predicted) for i in self._retired),
        )

    # -- maintenance --------------------------------------------------------------------------------------------------

    def maintain(self, *, max_items: int = 50_000) -> int:
        """Expire predictions and approximate entries, release retired slots' entries; at most about ``max_items``
        entries per call. Returns how many entries it released."""
        now = self._clock()
        done = self._expire_predictions(now, max_items)
        done += self._expire_held(now, max_items - done)
        done += self._release_retired(max_items - done)
        return done

    # -- internals ----------------------------------------------------------------------------------------------------

    def _slot(self, index: int) -> _Slot:
        slot = self._slots[index]
        assert slot is not None
        return slot

    def _invalidate_sinks(self) -> None:
        for sink in self._sinks:
            sink.valid = False
        self._sinks.clear()

    def _new_slot(self, slot: _Slot) -> int:
        self._invalidate_sinks()
        if self._free:
            index = self._free.pop()
            self._slots[index] = slot
        else:
            index = len(self._slots)
            self._slots.append(slot)
            if index >= _NATIVE_SLOTS and self._core is not None:
                # A 65th slot: masks outgrow the compiled core's 64 bits; the index goes on in Python, over a dict.
                self._core = None
                self._held = dict(self._held.items())
        self._alive |= 1 << index
        return index

    def _retire(self, index: int) -> None:
        self._invalidate_sinks()
        self._alive &= ~(1 << index)
        self._retired.append(index)

    def _credit(self, out: dict[str, int], bits: int, count: int) -> None:
        slots = self._slots
        while bits:
            low = bits & -bits
            slot = slots[low.bit_length() - 1]
            if slot is not None:
                out[slot.worker_id] = count
            bits ^= low

    def _confirm_predictions(self, slot: _Slot, bit: int, hashes: Iterable[BlockHash]) -> None:
        """Stored blocks replace their predictions."""
        predicted = slot.predicted
        for h in hashes:
            if predicted.pop(h, None) is not None:
                self._clear_predicted_bit(h, bit)

    def _clear_held_bit(self, h: BlockHash, bit: int) -> None:
        mask = self._held.get(h, 0) & ~bit
        if mask:
            self._held[h] = mask
        else:
            self._held.pop(h, None)

    def _clear_predicted_bit(self, h: BlockHash, bit: int) -> None:
        mask = self._predicted.get(h, 0) & ~bit
        if mask:
            self._predicted[h] = mask
        else:
            self._predicted.pop(h, None)

    def _trim(self, slot: _Slot, bit: int) -> None:
        """Past capacity: drop the oldest entries, down to 15/16 of capacity (one scan for many evictions)."""
        lru = slot.held
        excess = len(lru) - slot.capacity
        if excess <= 0:
            return
        excess += slot.capacity // 16
        oldest = list(itertools.islice(lru, excess))
        for h in oldest:
            del lru[h]
            self._clear_held_bit(h, bit)

    def _expire_predictions(self, now: float, budget: int) -> int:
        queue = self._prediction_queue
        done = 0
        while queue and queue[0][0] <= now and done < budget:
            expiry, slot, bit, hashes = queue.popleft()
            predicted = slot.predicted
            for h in hashes:
                if predicted.get(h) == expiry:  # not renewed or confirmed since
                    del predicted[h]
                    self._clear_predicted_bit(h, bit)
            done += len(hashes)
        return done

    def _expire_held(self, now: float, budget: int) -> int:
        """Approximate workers' expired entries, oldest first, in one scan per worker."""
        done = 0
        for index in self._slot_of.values():
            slot = self._slot(index)
            if slot.ttl_s is None or done >= budget:
                continue
            lru = slot.held
            bit = 1 << index
            expired = list(
                itertools.islice(itertools.takewhile(lambda item: item[1] <= now, lru.items()), budget - done)
            )
            for h, _ in expired:
                del lru[h]
                self._clear_held_bit(h, bit)
            done += len(expired)
        return done

    def _release_retired(self, budget: int) -> int:
        done = 0
        while self._retired and done < budget:
            index = self._retired[0]
            slot = self._slot(index)
            bit = 1 << index
            while slot.held and done < budget:
                h, _ = slot.held.popitem()
                self._clear_held_bit(h, bit)
                done += 1
            while slot.predicted and done < budget:
                h, _ = slot.predicted.popitem()
                self._clear_predicted_bit(h, bit)
                done += 1
            if slot.held or slot.predicted:
                break
            self._retired.popleft()
            self._slots[index] = None
            self._free.append(index)
        return done

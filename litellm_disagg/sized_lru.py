"""SizedLRU: a thread-safe LRU bounded by the sum of its values' sizes (tokens, not entries)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

MAX_DEFERRED = 256
"""Deferred evicted values kept at most (``defer_drops``): past that they are freed in ``put`` itself."""

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class SizedLRU(Generic[K, V]):
    """``max_size`` bounds the sum of ``size(value)`` over the entries; the least recently used go first, and a value
    larger than the bound is not kept. ``lock`` guards ``entries`` for callers that read several entries at once
    (``get`` and ``put`` take it themselves)."""

    def __init__(self, max_size: int, size: Callable[[V], int], *, defer_drops: bool = False):
        """``defer_drops``: evicted values are kept in ``dropped`` until ``release_dropped`` (at most
        ``MAX_DEFERRED`` of them), so that freeing a large one (an 8k-token tuple: ~50 us of decrefs) happens where
        the caller chooses, off a latency-critical ``put``."""
        if max_size < 1:
            raise ValueError("max_size must be positive")
        self.max_size = max_size
        self.size = size
        self.defer_drops = defer_drops
        self.dropped: list[V] = []
        """Evicted values not freed yet (``defer_drops``)."""
        self.entries: OrderedDict[K, V] = OrderedDict()
        self.lock = threading.Lock()
        self.total = 0
        """The sum of the entries' sizes."""
        self.evicted = 0
        """Entries dropped to stay within the bound."""

    def __len__(self) -> int:
        return len(self.entries)

    def get(self, key: K) -> V | None:
        """The value (None if absent); a hit becomes the most recently used."""
        with self.lock:
            found = self.entries.get(key)
            if found is not None:
                self.entries.move_to_end(key)
            return found

    def put(self, key: K, value: V) -> bool:
        """Keeps ``value`` under ``key`` as the most recently used (replacing any), then evicts down to the bound.
        False when the value alone is larger than the bound (nothing changed)."""
        size = self.size(value)
        if size > self.max_size:
            return False
        with self.lock:
            old = self.entries.pop(key, None)
            if old is not None:
                self.total -= self.size(old)
            self.entries[key] = value
            self.total += size
            while self.total > self.max_size:
                _, dropped = self.entries.popitem(last=False)
                self.total -= self.size(dropped)
                self.evicted += 1
                if self.defer_drops:
                    self.dropped.append(dropped)
            if len(self.dropped) > MAX_DEFERRED:
                self.dropped.clear()
        return True

    def release_dropped(self) -> int:
        """Frees the deferred evicted values (``defer_drops``); returns how many."""
        with self.lock:
            dropped, self.dropped = self.dropped, []
        return len(dropped)  # freed here, outside the lock, when ``dropped`` goes

    def clear(self) -> None:
        with self.lock:
            self.entries.clear()
            self.total = 0

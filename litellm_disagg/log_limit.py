"""LogLimit: at most one log line per key each ``interval_s``; the lines held back in between are counted, and the
next line that goes out says how many.

For conditions that hold per request (every request of a model falls back to aggregated serving while its prefill
pool is empty; a client sends transfer metadata with every call): one line per request would flood the log at the
request rate, while the metrics count every occurrence. Keys are bounded (``max_keys``, the oldest go first), so a
client choosing keys cannot grow memory.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable


class LogLimit:
    def __init__(self, interval_s: float = 30.0, *, max_keys: int = 1024,
                 clock: Callable[[], float] = time.monotonic):
        if interval_s < 0 or max_keys < 1:
            raise ValueError("interval_s must be >= 0 and max_keys >= 1")
        self.interval_s = interval_s
        self.max_keys = max_keys
        self._clock = clock
        self._lock = threading.Lock()
        self._keys: OrderedDict[Hashable, tuple[float, int]] = OrderedDict()
        """key -> (when its last line went out, lines held back since)."""

    def take(self, key: Hashable) -> int | None:
        """None: hold this line back (counted). Else log it now: the number of lines held back since the last one."""
        now = self._clock()
        with self._lock:
            last = self._keys.get(key)
            if last is not None and now - last[0] < self.interval_s:
                self._keys[key] = (last[0], last[1] + 1)
                return None
            held = 0 if last is None else last[1]
            self._keys[key] = (now, 0)
            self._keys.move_to_end(key)
            while len(self._keys) > self.max_keys:
                self._keys.popitem(last=False)
            return held


def held_note(held: int) -> str:
    """`` (N more like it not logged since the last line)`` or nothing."""
    return f" ({held} more like it not logged since the last line)" if held else ""

"""Pickers: choose one worker among the candidates of a pool.

A picker has no I/O and holds no per-request state beyond a rotation counter; the load it reads is the router's
``InflightTracker``. KV-aware scoring plugs in as another picker.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Protocol

from litellm_disagg.routing.load import InflightTracker
from litellm_disagg.runtime_config import RuntimeConfig


class Picker(Protocol):
    def pick(self, candidates: Sequence[RuntimeConfig], load: InflightTracker) -> RuntimeConfig | None: ...


class RoundRobinPicker:
    def __init__(self) -> None:
        self._turn = itertools.count()

    def pick(self, candidates: Sequence[RuntimeConfig], load: InflightTracker) -> RuntimeConfig | None:
        if not candidates:
            return None
        return candidates[next(self._turn) % len(candidates)]


class LeastInflightPicker:
    """Fewest requests in flight; ties rotate so equal workers share the work."""

    def __init__(self) -> None:
        self._turn = itertools.count()

    def pick(self, candidates: Sequence[RuntimeConfig], load: InflightTracker) -> RuntimeConfig | None:
        if not candidates:
            return None
        fewest = min(load.count(w.worker_id) for w in candidates)
        tied = [w for w in candidates if load.count(w.worker_id) == fewest]
        return tied[next(self._turn) % len(tied)]


def make_picker(name: str) -> Picker:
    pickers: dict[str, type[RoundRobinPicker] | type[LeastInflightPicker]] = {
        "round_robin": RoundRobinPicker,
        "least_inflight": LeastInflightPicker,
    }
    try:
        return pickers[name]()
    except KeyError:
        raise ValueError(f"unknown picker {name!r}; choose one of {sorted(pickers)}") from None

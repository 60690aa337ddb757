"""Plain counters an engine keeps; ``metrics.py`` exposes them under vLLM's metric names."""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass, field

XFER_TIME_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass
class Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.buckets)

    def observe(self, value: float) -> None:
        i = bisect.bisect_left(self.buckets, value)
        if i < len(self.counts):
            self.counts[i] += 1
        self.total += value
        self.count += 1

    def cumulative(self) -> list[tuple[str, int]]:
        out: list[tuple[str, int]] = []
        running = 0
        for bound, n in zip(self.buckets, self.counts, strict=True):
            running += n
            out.append((repr(bound), running))
        out.append(("+Inf", self.count))
        return out


@dataclass
class EngineStats:
    prefix_cache_queries: int = 0
    """Tokens looked up in the prefix cache (vLLM counts tokens, not requests)."""
    prefix_cache_hits: int = 0
    prompt_tokens_local_compute: int = 0
    prompt_tokens_local_cache_hit: int = 0
    prompt_tokens_external_kv_transfer: int = 0
    generation_tokens: int = 0
    request_success: Counter[str] = field(default_factory=Counter)
    """Finished requests by finish reason (stop, length, abort)."""
    num_preemptions: int = 0
    nixl_transfers: int = 0
    nixl_failed_transfers: int = 0
    nixl_bytes_transferred: int = 0
    nixl_xfer_time: Histogram = field(default_factory=lambda: Histogram(XFER_TIME_BUCKETS))
    """Simulated seconds per successful transfer."""
    kv_leases_expired: int = 0
    steps: int = 0
    simulated_busy_s: float = 0.0
    """Simulated time spent in steps (the engine's busy time on the modelled GPU)."""

    @property
    def finished(self) -> int:
        return sum(self.request_success.values())

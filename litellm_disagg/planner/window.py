"""Latency windows from cumulative Prometheus histograms and counters: what happened in the last ``window_s``.

The proxy already records every streamed request's TTFT and inter-token latency in its histograms
(``observability/requests.py``); the planner does not keep a second copy of each request. It snapshots the
cumulative buckets at every step and reads the window as the difference between the newest snapshot and the one
``window_s`` before (a counter that went down, a restarted proxy, starts the window over). The percentile is read
from the difference by linear interpolation inside the bucket it falls in, so its resolution is the buckets'
(``observability/metrics.py``: TTFT 0.3/0.5/0.75/1/1.5/2/3 s..., ITL 10/15/20/30/40/50/75/100 ms...).

The same snapshots come from this process's registry (the planner in the proxy: ``registry_samples``) or from a
proxy's ``/metrics`` page (the standalone planner: ``page_samples``), both read by ``histogram_totals``, so both
read the same numbers.

Counters (tokens) are read the same way (``counter_totals``) and windowed by ``CounterWindow``: per source (a worker,
a proxy), the increase since its previous reading, with a counter that went down read as restarted from zero (as
Prometheus' ``rate()`` does), added up into one running total whose increase over the window is the rate.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from litellm_disagg.engines import prom_text
from litellm_disagg.planner.signals import LatencyWindow


class SampleLike(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def labels(self) -> Mapping[str, str]: ...

    @property
    def value(self) -> float: ...


@dataclass(frozen=True)
class HistogramTotals:
    """One histogram's cumulative state: ``buckets`` as (upper bound, cumulative count), ascending, ``+Inf`` last."""

    buckets: tuple[tuple[float, float], ...]
    count: float

    def minus(self, base: HistogramTotals) -> HistogramTotals | None:
        """The observations since ``base``; None when a count went down (a reset: the caller starts over)."""
        if self.count < base.count:
            return None
        base_counts = dict(base.buckets)
        out = []
        for le, cumulative in self.buckets:
            diff = cumulative - base_counts.get(le, 0.0)
            if diff < 0:
                return None
            out.append((le, diff))
        return HistogramTotals(tuple(out), self.count - base.count)

    def quantile(self, q: float) -> float | None:
        """The ``q`` quantile (seconds), interpolated inside its bucket; None without observations."""
        if self.count <= 0 or not self.buckets:
            return None
        rank = q * self.count
        lower, below = 0.0, 0.0
        for le, cumulative in self.buckets:
            if cumulative >= rank and cumulative > below:
                if math.isinf(le):
                    return lower  # beyond the last finite bound: the bound is all we know
                return lower + (le - lower) * (rank - below) / (cumulative - below)
            if not math.isinf(le):
                lower = le
            below = cumulative
        return lower


LabelFilter = tuple[str, Collection[str]]
"""(label, values): only the samples whose ``label`` is one of ``values`` (e.g. ``("mode", {"disaggregated"})``)."""


def histogram_totals(samples: Iterable[SampleLike], name: str, *, by: str = "model",
                     where: LabelFilter | None = None) -> dict[str, HistogramTotals]:
    """``name``'s histogram per value of label ``by`` (other labels, e.g. ``mode``, added up; with ``where``, only
    the samples it admits), from samples of a page or of a registry (``name_bucket`` with ``le``, ``name_count``)."""
    buckets: dict[str, dict[float, float]] = {}
    counts: dict[str, float] = {}
    bucket_name, count_name = name + "_bucket", name + "_count"
    for sample in samples:
        key = sample.labels.get(by)
        if key is None or math.isnan(sample.value):
            continue
        if where is not None and sample.labels.get(where[0]) not in where[1]:
            continue
        if sample.name == bucket_name:
            try:
                le = float(sample.labels.get("le", "nan"))
            except ValueError:
                continue
            if math.isnan(le):
                continue
            per = buckets.setdefault(key, {})
            per[le] = per.get(le, 0.0) + sample.value
        elif sample.name == count_name:
            counts[key] = counts.get(key, 0.0) + sample.value
    return {key: HistogramTotals(tuple(sorted(per.items())), counts.get(key, max(per.values(), default=0.0)))
            for key, per in buckets.items()}


def page_samples(text: str, names: Iterable[str], counters: Iterable[str] = ()) -> list[prom_text.Sample]:
    """The samples of the histograms ``names`` and of the counters ``counters`` (without ``_total``) on a Prometheus
    text page, in one pass (for ``histogram_totals`` and ``counter_totals``)."""
    wanted = prom_text.Wanted([*(n + suffix for n in names for suffix in ("_bucket", "_count")),
                               *(n + "_total" for n in counters)])
    return list(prom_text.samples(text, wanted))


def counter_totals(samples: Iterable[SampleLike], name: str, *, by: str = "model",
                   where: LabelFilter | None = None) -> dict[str, float]:
    """Counter ``name`` (its ``_total`` samples; ``name`` without the suffix) added up per value of label ``by``
    (with ``where``, only the samples it admits), from samples of a page or of a registry."""
    totals: dict[str, float] = {}
    total_name = name + "_total"
    for sample in samples:
        key = sample.labels.get(by)
        if sample.name != total_name or key is None or not math.isfinite(sample.value):
            continue
        if where is not None and sample.labels.get(where[0]) not in where[1]:
            continue
        totals[key] = totals.get(key, 0.0) + sample.value
    return totals


def registry_samples(metric: object) -> list[SampleLike]:
    """A ``prometheus_client`` metric of this process: its samples now (its ``collect()``; for ``histogram_totals``)."""
    collect = getattr(metric, "collect", None)
    if collect is None:
        return []
    return [s for family in collect() for s in family.samples]


def add_totals(a: HistogramTotals | None, b: HistogramTotals | None) -> HistogramTotals | None:
    """Two cumulative histograms added up, bucket by bucket (histograms with the same bounds: e.g. one metric's
    label sets, or two metrics sharing their buckets); None when both are."""
    if a is None:
        return b
    if b is None:
        return a
    counts = dict(a.buckets)
    for le, c in b.buckets:
        counts[le] = counts.get(le, 0.0) + c
    return HistogramTotals(tuple(sorted(counts.items())), a.count + b.count)


class HistogramWindow:
    """Snapshots of one cumulative histogram over time; ``window(q)`` is what the last ``window_s`` observed.

    With ``max_s`` over ``window_s`` the snapshots of the last ``max_s`` are kept, and a window that holds fewer than
    ``min_samples`` observations reaches back for them, one snapshot at a time, up to ``max_s`` and never before
    ``not_before`` (the layout serving the model changed then: what came before measured another one). A TTFT
    histogram gets one observation per request: at 0.14 requests/s a 10 s window holds one or two, so without the
    reach a percentile of ``min_samples`` requests needs a window the operator sized to the request rate."""

    def __init__(self, window_s: float, max_s: float | None = None):
        self.window_s = window_s
        self.max_s = max(window_s, max_s if max_s is not None else window_s)
        self._snapshots: deque[tuple[float, HistogramTotals]] = deque()

    def add(self, now: float, totals: HistogramTotals) -> None:
        if self._snapshots and totals.minus(self._snapshots[-1][1]) is None:
            self._snapshots.clear()  # a reset: what came before is no baseline
        self._snapshots.append((now, totals))
        # keep the newest snapshot at or before the reach's start as the oldest baseline
        while len(self._snapshots) >= 2 and self._snapshots[1][0] <= now - self.max_s:
            self._snapshots.popleft()

    def window(self, quantile: float, *, min_samples: int = 1, not_before: float | None = None) -> LatencyWindow:
        """The window's ``quantile`` in milliseconds over the last ``window_s`` (from the newest snapshot at or
        before its start, or the oldest kept), reaching back while it holds fewer than ``min_samples`` observations
        (see the class); with a single snapshot, nothing is known yet. ``span_s``: the seconds it covers."""
        if len(self._snapshots) < 2:
            return LatencyWindow()
        end, newest = self._snapshots[-1]
        base = 0
        for i, (at, _) in enumerate(self._snapshots):
            if at <= end - self.window_s:
                base = i
            else:
                break
        diff = newest.minus(self._snapshots[base][1])
        while (diff is not None and diff.count < min_samples and base > 0
               and (not_before is None or self._snapshots[base - 1][0] >= not_before)):
            base -= 1
            diff = newest.minus(self._snapshots[base][1])
        if diff is None or diff.count <= 0:
            return LatencyWindow()
        seconds = diff.quantile(quantile)
        return LatencyWindow(None if seconds is None else seconds * 1000.0, int(round(diff.count)),
                             end - self._snapshots[base][0])


class MeanWindow:
    """Events of (count, seconds) over time (e.g. KV transfers from the load scraper); ``window(now)`` is their
    mean over the last ``window_s`` in milliseconds."""

    def __init__(self, window_s: float):
        self.window_s = window_s
        self._events: deque[tuple[float, float, float]] = deque()

    def add(self, now: float, count: float, seconds: float) -> None:
        if count > 0 and seconds >= 0 and math.isfinite(seconds):
            self._events.append((now, count, seconds))

    def window(self, now: float) -> LatencyWindow:
        while self._events and self._events[0][0] < now - self.window_s:
            self._events.popleft()
        count = sum(e[1] for e in self._events)
        if count <= 0:
            return LatencyWindow()
        return LatencyWindow(1000.0 * sum(e[2] for e in self._events) / count, int(round(count)))


class CounterWindow:
    """Cumulative counters of several sources (e.g. each worker's generated tokens) over time; ``rate(now)`` is their
    increase per second over the last ``window_s``, all sources together.

    Each source is handled on its own, as Prometheus' ``rate()`` does: its first reading is only a baseline (a worker
    that joins with a large counter adds nothing), a reading below the previous one is a restart (the counter counted
    again from zero: the reading is the increase), and a source missing from a reading keeps its baseline (a failed
    scrape: the next reading counts the increase over both intervals). ``retain`` forgets departed sources."""

    def __init__(self, window_s: float):
        self.window_s = window_s
        self._last: dict[str, float] = {}
        self._total = 0.0
        self._snapshots: deque[tuple[float, float]] = deque()

    def add(self, now: float, counters: Mapping[str, float]) -> None:
        """The sources read at ``now`` (cumulative values); nothing is recorded when none was read."""
        read = False
        for source, value in counters.items():
            if not math.isfinite(value) or value < 0:
                continue
            before = self._last.get(source)
            if before is not None:
                self._total += value - before if value >= before else value
            self._last[source] = value
            read = True
        if not read:
            return
        self._snapshots.append((now, self._total))
        while len(self._snapshots) >= 2 and self._snapshots[1][0] <= now - self.window_s:
            self._snapshots.popleft()

    def retain(self, sources: Collection[str]) -> None:
        """Forget the sources not in ``sources`` (a worker that left: one that comes back starts a new baseline)."""
        for gone in set(self._last) - set(sources):
            del self._last[gone]

    def rate(self, now: float) -> float | None:
        """Increase per second between the snapshot at the window's start (or the oldest kept) and the newest;
        None with fewer than two snapshots or when the newest is older than the window (nothing read lately)."""
        if len(self._snapshots) < 2:
            return None
        (start, base), (end, total) = self._snapshots[0], self._snapshots[-1]
        if end <= start or end < now - self.window_s:
            return None
        return (total - base) / (end - start)

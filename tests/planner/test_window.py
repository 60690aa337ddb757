"""Latency windows from cumulative histograms (planner/window.py)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from litellm_disagg.planner.window import (
    HistogramTotals,
    HistogramWindow,
    MeanWindow,
    histogram_totals,
    page_samples,
    registry_samples,
)


def _histogram() -> tuple[CollectorRegistry, Histogram]:
    registry = CollectorRegistry()
    return registry, Histogram("lat_seconds", "d", ["model", "mode"], buckets=(0.1, 0.5, 1.0), registry=registry)


def test_page_and_registry_read_the_same_totals_modes_added_up() -> None:
    registry, h = _histogram()
    for v in [0.05] * 5 + [0.3] * 4:
        h.labels("m", "disaggregated").observe(v)
    h.labels("m", "aggregated").observe(0.9)
    h.labels("other", "aggregated").observe(2.0)
    from_registry = histogram_totals(registry_samples(h), "lat_seconds")
    from_page = histogram_totals(page_samples(generate_latest(registry).decode(), ["lat_seconds"]), "lat_seconds")
    assert from_registry == from_page
    m = from_registry["m"]
    assert m.count == 10 and m.buckets == ((0.1, 5.0), (0.5, 9.0), (1.0, 10.0), (float("inf"), 10.0))
    assert m.quantile(0.9) == pytest.approx(0.5)
    assert m.quantile(0.5) == pytest.approx(0.1)
    assert from_registry["other"].quantile(0.9) == 1.0   # beyond the last finite bound: that bound


def test_histogram_window_sees_only_the_window_and_survives_a_reset() -> None:
    def totals(fast: float, slow: float) -> HistogramTotals:
        return HistogramTotals(((0.1, fast), (1.0, fast + slow), (float("inf"), fast + slow)), fast + slow)

    window = HistogramWindow(window_s=10)
    window.add(0, totals(0, 0))
    assert window.window(0.9).p_ms is None
    window.add(5, totals(100, 0))             # 100 fast requests
    assert window.window(0.9).samples == 100 and window.window(0.9).p_ms == pytest.approx(90.0)
    window.add(12, totals(100, 50))           # baseline: the newest snapshot at or before t=2 (t=0)
    assert window.window(0.9).samples == 150
    window.add(20, totals(100, 50))           # baseline t=5: only the 50 slow ones are in the window
    w = window.window(0.9)
    assert w.samples == 50 and w.p_ms == pytest.approx(910.0)  # 0.1 + 0.9 * 45/50 s
    window.add(30, totals(100, 50))
    assert window.window(0.9).p_ms is None    # an empty window: no evidence
    window.add(31, totals(1, 0))              # the proxy restarted: counts went down
    assert window.window(0.9).p_ms is None
    window.add(32, totals(2, 10))
    assert window.window(0.9).samples == 11


def test_mean_window() -> None:
    window = MeanWindow(window_s=10)
    assert window.window(0).p_ms is None
    window.add(0, 2, 0.2)
    window.add(5, 1, 0.4)
    assert window.window(5).p_ms == pytest.approx(200.0) and window.window(5).samples == 3
    assert window.window(12).p_ms == pytest.approx(400.0)
    window.add(13, 0, 1.0)                    # no transfers: ignored
    assert window.window(30).p_ms is None

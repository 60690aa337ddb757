"""Whether the load was steady over a window (litellm_disagg/planner/steadiness.py). Pure."""

from __future__ import annotations

import math

import pytest

from litellm_disagg.planner.steadiness import RateHistory


def test_a_steady_rate_swings_by_one() -> None:
    history = RateHistory()
    for t in range(0, 12, 2):
        history.observe(float(t), 90_000.0, 10.0)
    assert history.swing(10.0, 10.0) == pytest.approx(1.0)


def test_a_burst_in_the_span_shows_as_the_largest_over_the_smallest_reading() -> None:
    history = RateHistory()
    for t, rate in ((0, 45_000.0), (2, 45_000.0), (4, 135_000.0), (6, 135_000.0), (8, 60_000.0)):
        history.observe(float(t), rate, 10.0)
    assert history.swing(8.0, 10.0) == pytest.approx(3.0)
    # a reading a whole span old covers a window wholly before this one: out
    assert history.swing(10.0, 10.0) == pytest.approx(135_000 / 45_000)
    assert history.swing(14.0, 10.0) == pytest.approx(135_000 / 60_000)


def test_too_few_readings_or_no_load_say_nothing_and_an_idle_window_beside_a_loaded_one_is_inf() -> None:
    history = RateHistory()
    assert history.swing(0.0, 10.0) is None
    history.observe(0.0, 1000.0, 10.0)
    assert history.swing(0.0, 10.0) is None  # one reading
    history.observe(2.0, None, 10.0)  # not measured: nothing recorded
    assert history.swing(2.0, 10.0) is None
    history.observe(4.0, 0.0, 10.0)
    assert history.swing(4.0, 10.0) == math.inf
    idle = RateHistory()
    idle.observe(0.0, 0.0, 10.0)
    idle.observe(2.0, 0.0, 10.0)
    assert idle.swing(2.0, 10.0) is None


def test_old_readings_are_dropped() -> None:
    history = RateHistory()
    for t in range(0, 100, 2):
        history.observe(float(t), 1.0, 20.0)
    assert len(history.readings) <= 11
    history.observe(200.0, float("nan"), 20.0)
    assert not history.readings

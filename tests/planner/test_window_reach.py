"""A latency window that holds too few requests reaches back for ``min_samples`` of them (``window_max_s``), never
before the model's serving layout last changed (``planner/window.py``: ``HistogramWindow``; ``planner/collect.py``).

On real CPU workers (``bench/planner_crossing.py``) 0.14 requests/s put one or two first tokens in the shipped 10 s
window, under ``min_samples`` (5): the prefill side read as unmeasured at every step, and a planner could only see it
with a window the operator had sized to the request rate."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import httpx
import pytest

from litellm_disagg.planner.collect import ProxyTotals, SignalCollector
from litellm_disagg.planner.policy import pressures
from litellm_disagg.planner.settings import PlannerSettings
from litellm_disagg.planner.signals import LatencyWindow
from litellm_disagg.planner.window import HistogramTotals, HistogramWindow
from litellm_disagg.routing.kv.load_scraper import LoadScraper
from litellm_disagg.runtime_config import RuntimeConfig

from ..test_runtime_config import VALID

BOUNDS = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, float("inf"))
MODEL = "reach-model"


def totals(values_s: Iterable[float]) -> HistogramTotals:
    """The cumulative histogram of ``values_s`` (seconds) over ``BOUNDS``."""
    values = list(values_s)
    return HistogramTotals(tuple((le, float(sum(v <= le for v in values))) for le in BOUNDS), float(len(values)))


def one_per_step(window: HistogramWindow, steps: int, every_s: float = 10.0, value_s: float = 3.0) -> float:
    """One request of ``value_s`` observed between each two of ``steps`` snapshots ``every_s`` apart; the last
    snapshot's time."""
    seen: list[float] = []
    for i in range(steps):
        if i:
            seen.append(value_s)
        window.add(i * every_s, totals(seen))
    return (steps - 1) * every_s


def test_without_a_reach_a_window_holds_only_its_last_window_s() -> None:
    window = HistogramWindow(10.0)
    one_per_step(window, 7)
    got = window.window(0.9, min_samples=5)
    assert got.samples == 1 and got.span_s == pytest.approx(10.0)
    assert got.ratio(1000.0, 5) is None                                  # no evidence: fewer than min_samples


def test_a_window_short_of_min_samples_reaches_back_for_them_up_to_window_max_s() -> None:
    window = HistogramWindow(10.0, 60.0)
    one_per_step(window, 7)                                              # snapshots at 0..60 s, a request in each gap
    got = window.window(0.9, min_samples=5)
    assert got.samples == 5 and got.span_s == pytest.approx(50.0)        # reached back 50 s, no further than needed
    assert got.p_ms is not None and 2000.0 < got.p_ms <= 5000.0          # the requests' 3 s bucket
    assert window.window(0.9, min_samples=1).span_s == pytest.approx(10.0)  # enough in the window: no reach
    # never past window_max_s: 60 s hold 6 requests, the 7th is older
    one_per_step(window, 10)
    assert window.window(0.9, min_samples=8).samples == 6
    assert window.window(0.9, min_samples=8).span_s == pytest.approx(60.0)


def test_the_reach_stops_where_the_layout_changed() -> None:
    window = HistogramWindow(10.0, 60.0)
    end = one_per_step(window, 7)
    got = window.window(0.9, min_samples=5, not_before=end - 20.0)
    assert got.samples == 2 and got.span_s == pytest.approx(20.0)
    # the last window_s itself is never cut: it is what the planner read before the reach existed
    assert window.window(0.9, min_samples=5, not_before=end).samples == 1


def worker(worker_id: str, role: str) -> RuntimeConfig:
    return RuntimeConfig.model_validate(VALID | {
        "worker_id": worker_id, "role": role, "model": MODEL, "base_url": f"http://{worker_id}:8000/v1",
        "allowed_roles": ["prefill", "decode", "both"]})


class OneFirstTokenPerStep:
    """A proxy whose TTFT histogram gains one 3 s first token between two reads."""

    def __init__(self) -> None:
        self.seen: list[float] = []

    async def read(self) -> Mapping[str, ProxyTotals]:
        result = {MODEL: ProxyTotals(ttft=totals(self.seen))}
        self.seen.append(3.0)
        return result


def collector(**kw: object) -> SignalCollector:
    base: dict[str, object] = {"ttft_ms": 2000, "itl_ms": 50, "min_samples": 3, "window_s": 10, "interval_s": 10}
    settings = PlannerSettings.model_validate(base | kw)
    # the workers' pages are missing: their load reads unknown, which this test does not look at
    pages = httpx.AsyncClient(transport=httpx.MockTransport(lambda request: httpx.Response(404)))
    return SignalCollector(settings, OneFirstTokenPerStep(), scraper=LoadScraper(client=pages, clock=lambda: 0.0))


async def test_the_collector_reaches_back_for_min_samples_first_tokens_and_not_across_a_role_change() -> None:
    split = [worker("p0", "prefill"), worker("d0", "decode")]
    c = collector(window_max_s=60)
    plain = collector()
    try:
        for t in (0.0, 10.0, 20.0, 30.0):
            model = (await c.collect(t, split, {})).model(MODEL)
            flat = (await plain.collect(t, split, {})).model(MODEL)
        assert model is not None and flat is not None
        assert (model.ttft.samples, model.ttft.span_s) == (3, 30.0)
        assert flat.ttft.samples == 1                                    # the same first tokens, no reach
        s = c.settings
        measured = pressures(model, s)
        assert measured.ttft_ratio == pytest.approx(model.ttft.p_ms / 2000) and measured.ttft_ratio > 1.0
        assert not measured.prefill_unmeasured and measured.prefill_window_s == 30.0
        assert measured.as_fields()["prefill_window_s"] == 30.0
        unmeasured = pressures(flat, plain.settings)
        assert unmeasured.ttft_ratio is None and unmeasured.prefill_window_s is None
        # d0 changes role at 40 s: the first tokens before then were served by another layout
        both = [worker("p0", "prefill"), worker("d0", "both")]
        for t in (40.0, 50.0):
            model = (await c.collect(t, both, {})).model(MODEL)
        assert model is not None and model.ttft.samples == 1 and model.ttft.span_s == 10.0
        model = (await c.collect(60.0, both, {})).model(MODEL)
        assert model is not None and (model.ttft.samples, model.ttft.span_s) == (2, 20.0)
        model = (await c.collect(70.0, both, {})).model(MODEL)
        assert model is not None and (model.ttft.samples, model.ttft.span_s) == (3, 30.0)
    finally:
        await c.aclose()
        await plain.aclose()


def test_window_max_s_is_off_unless_set() -> None:
    assert PlannerSettings().window_max_s is None
    assert LatencyWindow(100.0, 3).span_s is None

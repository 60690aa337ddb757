"""bench.serving.cold_placement: cold prompts that arrived while every worker computed one, and whether each went to
the worker whose cold prompts ended first."""

from __future__ import annotations

import pytest

from bench.serving.cold_placement import ColdPlacement, cold_placement
from litellm_disagg.sim.request_log import RequestTrace


def cold(worker: str, arrived: float, first_token: float, *, tokens: int = 4000, cached: int = 0,
         role: str = "both") -> RequestTrace:
    return RequestTrace(worker_id=worker, role=role, request_id=f"r-{worker}-{arrived}", client_id=f"c-{arrived}",
                        user=None, prompt_tokens=tokens, arrived=arrived, running_at_arrival=0, waiting_at_arrival=0,
                        prefill_tokens_ahead=0, cached_tokens=cached, scheduled=arrived, first_token=first_token)


def test_a_cold_prompt_behind_the_worker_that_ends_first_is_the_best_and_another_is_not():
    traces = [
        cold("a", 0.0, 1.0), cold("b", 0.3, 1.3),  # both workers busy with a cold prompt from 0.3 s
        cold("a", 0.5, 2.0),  # arrives at 0.5: a ends at 1.0, b at 1.3: on a, the best
        cold("b", 0.6, 2.3),  # at 0.6: a now ends at 2.0 (its queued cold prompt), b at 1.3: on b, the best
        cold("a", 0.7, 3.0),  # at 0.7: a ends at 2.0, b at 2.3: on a, the best
        cold("b", 0.8, 3.3),  # at 0.8: a ends at 3.0, b at 2.3: on b, the best
    ]
    assert cold_placement(traces) == ColdPlacement(4, 4, 0.0)
    worse = traces[:3] + [cold("a", 0.6, 2.5)]  # at 0.6 a ends at 2.0, b at 1.3: 0.7 s beyond b
    placed = cold_placement(worse)
    assert (placed.contested, placed.best) == (2, 1) and placed.extra_s == pytest.approx(0.7)
    assert "on the worker that finished first: 1" in placed.line()


def test_an_idle_worker_leaves_nothing_contested_and_warm_prompts_do_not_count():
    traces = [cold("a", 0.0, 1.0), cold("b", 5.0, 6.0), cold("a", 0.5, 1.5)]  # b idle at 0.5
    assert cold_placement(traces) == ColdPlacement()
    assert "none" in ColdPlacement().line()
    warm = [cold("a", 0.0, 1.0), cold("b", 0.1, 1.1), cold("a", 0.5, 1.2, cached=3500)]  # 500 to compute: not cold
    assert cold_placement(warm).contested == 0


def test_pools_are_compared_apart_and_a_pulled_prompt_is_not_computed():
    pulled = cold("d1", 0.2, 1.3, role="decode")
    pulled = RequestTrace(**{**pulled.__dict__, "external_tokens": 4000})  # its KV arrived: computed nothing
    traces = [cold("p1", 0.0, 1.0, role="prefill"), cold("p2", 0.1, 1.1, role="prefill"), pulled,
              cold("p2", 0.5, 2.0, role="prefill")]  # at 0.5: p1 ends at 1.0, p2 at 1.1: 0.1 s beyond p1
    placed = cold_placement(traces)
    assert placed.contested == 1 and placed.best == 0 and placed.extra_s == pytest.approx(0.1)
    # a local prefill on the decode pool: d1 is busy with nothing it computes, so nothing is contested there
    assert cold_placement([*traces, cold("d1", 0.6, 1.7, role="decode")]).contested == 1

"""bench.serving.breakdown: a request's TTFT split into the proxy's, the queue's and the prefill's parts from the
client's timings and the simulated workers' traces."""

from __future__ import annotations

import pytest

from bench.serving import breakdown
from bench.serving.loadgen import RequestResult
from litellm_disagg.sim.request_log import RequestTrace


def result(user: str, sent_at: float, ttft_s: float | None, error: str | None = None) -> RequestResult:
    return RequestResult(user.split("#")[0], 0, "k", 0.0, ttft_s, 1.0, 0.02, 5, error, user=user, sent_at=sent_at)


def trace(user: str | None, *, role: str = "both", client_id: str = "c", arrived: float, scheduled: float,
          first_token: float, finished: float | None = None, **extra: object) -> RequestTrace:
    return RequestTrace(worker_id=f"w-{role}", role=role, request_id=f"chatcmpl-{client_id}-1", client_id=client_id,
                        user=user, prompt_tokens=5000, arrived=arrived, running_at_arrival=2, waiting_at_arrival=1,
                        prefill_tokens_ahead=4000, scheduled=scheduled, first_token=first_token,
                        finished=finished if finished is not None else first_token + 0.5, **extra)


def test_an_aggregated_request_is_proxy_in_queue_prefill_proxy_out():
    [b] = breakdown.join([result("s#0", 10.0, 0.400)],
                         [trace("s#0", arrived=10.010, scheduled=10.110, first_token=10.390)])
    assert b.worker == "w-both" and b.prefill_worker is None and b.prefill_tokens_ahead == 4000
    assert b.parts_ms == pytest.approx({"proxy_in": 10, "queue": 100, "prefill": 280, "proxy_out": 10})
    assert breakdown.worker_side_ms(b) == pytest.approx(380)


def test_a_disaggregated_request_joins_its_prefill_by_client_id():
    traces = [
        trace(None, role="prefill", client_id="x", arrived=1.005, scheduled=1.010, first_token=1.200, finished=1.200),
        trace("s#1", role="decode", client_id="x", arrived=1.210, pull_started=1.211, pull_ended=1.221,
              scheduled=1.221, first_token=1.245, external_tokens=4990),
        trace(None, role="prefill", client_id="other", arrived=0.0, scheduled=0.0, first_token=0.1),
    ]
    [b] = breakdown.join([result("s#1", 1.0, 0.250)], traces)
    assert b.prefill_worker == "w-prefill" and b.worker == "w-decode"
    assert b.parts_ms == pytest.approx({"proxy_in": 5, "queue": 5, "prefill": 190, "handoff": 10, "admit": 1,
                                        "transfer": 10, "decode_first": 24, "proxy_out": 5})
    assert sum(b.parts_ms.values()) == pytest.approx(b.ttft_ms)
    assert breakdown.worker_side_ms(b) == pytest.approx(250 - 5 - 10 - 5)


def test_failed_or_untraced_requests_are_left_out_and_the_slowest_come_first():
    results = [result(f"s{i}#0", 0.0, 0.1 * (i + 1)) for i in range(5)] + [result("bad#0", 0.0, None, "500")]
    traces = [trace(f"s{i}#0", arrived=0.01, scheduled=0.02, first_token=0.1 * (i + 1) - 0.01) for i in range(4)]
    rows = breakdown.join(results, traces)
    assert [b.user for b in rows] == ["s0#0", "s1#0", "s2#0", "s3#0"]
    assert [b.user for b in breakdown.slowest(rows, fraction=0.02, at_least=2)] == ["s3#0", "s2#0"]
    assert breakdown.medians(rows)["queue"] == pytest.approx(10)
    assert "slowest 3 of 4" in breakdown.table("kv_aware", rows)


def test_mostly_cached_requests_behind_a_long_prefill_are_counted():
    def row(cached: int, ahead: int) -> breakdown.Breakdown:
        return breakdown.Breakdown("u#1", 100.0, "w", None, 4000, cached, 1, 0, ahead, 0, {"proxy_in": 1.0,
                                   "queue": 50.0, "prefill": 48.0, "proxy_out": 1.0})
    rows = [row(3900, 4077), row(3900, 100), row(2000, 1024), row(0, 4077), row(1999, 4077)]
    assert breakdown.behind_long_prefill(rows) == (3, 2)  # the cold one and the mostly uncached one are not counted
    assert "mostly cached requests behind a long prefill (1024+ tokens ahead): 2 of 3" in breakdown.table("kv", rows)

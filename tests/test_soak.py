"""Hundreds of concurrent streaming requests while simulated workers join, drain and crash (both roles):
every request ends exactly once, completed with the right text or failed with an error the client sees; clients that
go away (right after their prefill, mid-stream) leave no prefill KV held behind them."""

from bench.soak.harness import SoakConfig, run_soak


async def test_soak_nothing_lost_nothing_twice(tmp_path):
    report = await run_soak(SoakConfig(requests=300, concurrency=150, speedup=20, disconnects=20), tmp_path)
    print(report.summary())
    assert report.lost == 0 and report.ended_twice == 0, report.summary()
    assert report.wrong_text == 0, report.summary()  # a retry never glues two answers together
    # A client that would have left may have failed first (a crash): at most 20 leave.
    assert report.completed + report.failed + report.abandoned == 300 and 0 < report.abandoned <= 20
    # KV nobody reads was released, not left to the lease. (0-2 were held before the prefill client's pool stopped
    # closing connections handed to a request: encode/httpcore#1110, litellm_disagg/http_client.py.)
    assert report.held_kv_leases == 0, report.summary()
    # Only the requests on a decode worker when it crashed may fail; everything else is retried or failed over.
    assert report.failed <= report.cut_by_crashes, report.summary()
    assert any("crashed" in what for _, what in report.events) and any("drained" in what for _, what in report.events)


def test_the_pause_after_a_crash_is_the_longest_gap_between_completions() -> None:
    from bench.soak.harness import Outcome, SoakReport

    def done(at: float) -> Outcome:
        return Outcome(index=0, ends=1, ok=True, finished_at_s=at)

    report = SoakReport(config=SoakConfig(), outcomes=[done(t) for t in (1.0, 10.5, 11.0, 18.0, 19.0)] + [Outcome(1, 1)])
    report.events = [(2.0, "crashed prefill p1"), (10.0, "crashed decode d3 with 4 requests on it")]
    assert report.completion_pause_after("crashed decode") == 7.0          # 11.0 -> 18.0
    assert report.completion_pause_after("crashed prefill") == 8.5         # from the crash at 2.0 to 10.5
    assert report.completion_pause_after("crashed decode", window_s=5) == 4.0  # 11.0 -> the window's end, 15.0
    assert report.completion_pause_after("drained") is None

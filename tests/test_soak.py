"""Hundreds of concurrent streaming requests while simulated workers join, drain and crash (both roles):
every request ends exactly once, completed with the right text or failed with an error the client sees."""

from bench.soak.harness import SoakConfig, run_soak


async def test_soak_nothing_lost_nothing_twice(tmp_path):
    report = await run_soak(SoakConfig(requests=300, concurrency=150, speedup=20), tmp_path)
    print(report.summary())
    assert report.lost == 0 and report.ended_twice == 0, report.summary()
    assert report.wrong_text == 0, report.summary()  # a retry never glues two answers together
    assert report.completed + report.failed == 300
    # Only the requests on a decode worker when it crashed may fail; everything else is retried or failed over.
    assert report.failed <= report.cut_by_crashes, report.summary()
    assert any("crashed" in what for _, what in report.events) and any("drained" in what for _, what in report.events)

"""PrefillProgress: each worker's pending prompts estimated computed in the order sent; the kv_cost scorer prices a
worker's queued prefill by what is left; the router wires it to its accounting when ``load.prefill_progress``."""

from __future__ import annotations

import random

import pytest

from litellm_disagg.routing.accounting import Accounting, FlightKey
from litellm_disagg.routing.kv.disagg_decision import LinearEstimate
from litellm_disagg.routing.kv.prefill_progress import PrefillProgress
from litellm_disagg.routing.kv.router import KVRouter
from litellm_disagg.routing.pipeline.context import ScoringContext
from litellm_disagg.routing.pipeline.pipeline import Pipeline
from litellm_disagg.routing.pipeline.profile import CostWeights, kv_decode_profile, kv_prefill_profile
from litellm_disagg.routing.pipeline.scorers import KVCostScorer
from litellm_disagg.routing.pool import WorkerPool
from litellm_disagg.runtime_config import WorkerRole
from tests.kv.helpers import load, worker
from tests.kv.test_router import settings

LINE = LinearEstimate(overhead_s=0.0, tokens_per_s=1000.0)


def progress() -> PrefillProgress:
    return PrefillProgress(LINE)


def test_a_prompt_is_computed_at_the_line_rate_from_its_sending() -> None:
    p = progress()
    p.sent("x", "w", 4000, at=10.0)
    assert p.computed("w", 10.0) == 0
    assert p.computed("w", 11.5) == 1500
    assert p.computed("w", 12.0) == 2000  # the line trusted to one half
    assert p.computed("w", 14.0) == 3000  # then what is left decays as 1 / (4x): a quarter at the line's end
    assert p.computed("w", 18.0) == 3500  # an eighth at twice it: never finished before seen over
    assert p.computed("other", 11.5) == 0


def test_of_prompts_past_the_line_the_one_sent_earlier_reads_less_left() -> None:
    """The rate a prior 2.5x too fast: every cold prompt would read finished, a tie decided by chance; they stay
    ranked by how long they have been on their worker."""
    p = PrefillProgress(LinearEstimate(overhead_s=0.1, tokens_per_s=10_000.0))
    for i, sent in enumerate((0.0, 0.1, 0.25, 0.3)):
        p.sent(i, f"w{i}", 4077, at=sent)
    computed = p.computed_all(0.75)
    assert computed["w0"] > computed["w1"] > computed["w2"] > computed["w3"]
    assert max(computed.values()) < 4077


def test_prompts_on_one_worker_are_computed_one_after_another() -> None:
    p = progress()
    p.sent("x", "w", 1000, at=0.0)
    p.sent("y", "w", 1000, at=0.2)  # waits for x (estimated over at 1.0)
    assert p.computed("w", 0.5) == 500
    assert p.computed("w", 1.5) == round(1000 * (1 - 0.25 / 1.5)) + 500
    p.sent("z", "v", 1000, at=0.2)  # another worker: starts when sent
    assert p.computed("v", 0.5) == 300


def test_the_overhead_delays_the_start() -> None:
    p = PrefillProgress(LinearEstimate(overhead_s=0.5, tokens_per_s=1000.0))
    p.sent("x", "w", 1000, at=0.0)
    assert p.computed("w", 0.4) == 0
    assert p.computed("w", 1.0) == 500


def test_a_prefill_seen_over_starts_the_next_from_then_and_is_observed() -> None:
    p = progress()
    p.sent("x", "w", 1000, at=0.0)
    p.sent("y", "w", 1000, at=0.0)
    p.over("x", at=2.0)  # slower than the line: y starts now, not at the estimated 1.0
    assert p.computed("w", 2.5, LINE) == 500
    assert p.line.observations == 1
    assert p.line.estimate() == LinearEstimate(overhead_s=1.0, tokens_per_s=1000.0)  # one size: the overhead fits
    assert p.computed("w", 2.5) == 0
    p.over("y", at=4.0)  # from x's end: 1000 tokens in 2 s
    assert p.computed_all(5.0) == {}
    assert len(p) == 0
    for i in range(10):  # a line fitted to 500 tokens/s (varied sizes, no overhead)
        p.sent(i, "w", 500 * (1 + i % 3), at=10.0 * i)
        p.over(i, at=10.0 * i + (1 + i % 3))
    fitted = p.line.estimate()
    assert fitted.tokens_per_s == pytest.approx(500.0, rel=0.01)
    assert fitted.overhead_s == pytest.approx(0.0, abs=0.01)


def test_dropped_and_forgotten_prompts_are_not_observed() -> None:
    p = progress()
    p.sent("x", "w", 1000, at=0.0)
    p.dropped("x")
    p.sent("y", "w", 1000, at=0.0)
    p.sent("z", "v", 1000, at=0.0)
    p.forget("w")
    p.over("y", at=1.0)  # already forgotten: nothing
    assert p.line.observations == 0
    assert p.computed_all(0.5) == {"v": 500}
    p.sent("z", "v", 2000, at=1.0)  # re-sent under the same key: replaces it
    assert p.computed_all(1.5) == {"v": 500}


def test_accounting_tells_its_watcher() -> None:
    now = [0.0]
    accounting = Accounting(clock=lambda: now[0])
    p = progress()
    accounting.prefill_watcher = p
    key, other, unstreamed = FlightKey.decode("a"), FlightKey.decode("b"), FlightKey.decode("c")
    accounting.start(key, "w", prefill_tokens=1000)
    accounting.start(other, "v", prefill_tokens=1000)
    accounting.start(unstreamed, "u", prefill_tokens=1000)
    accounting.start(FlightKey.decode("d"), "u")  # no prompt to compute: not watched
    assert len(p) == 3
    now[0] = 0.5
    assert p.computed_all(now[0]) == {"w": 500, "v": 500, "u": 500}
    now[0] = 0.8
    accounting.prefill_done(key)  # its first chunk: over, observed
    accounting.prefill_done(key)  # twice: nothing more
    accounting.finish(key)
    accounting.finish(unstreamed)  # ended before any chunk: dropped, not observed
    assert p.line.observations == 1
    assert set(p.computed_all(now[0])) == {"v"}
    assert p.computed("v", now[0], LINE) == round(1000 * (1 - 0.25 / 0.8))


def test_kv_cost_prices_what_is_left_of_a_queued_prompt() -> None:
    """Two workers each busy with a 4,000-token cold prompt; the one that got it earlier is nearer its end. Without
    the estimate the two read the same (a tie); with it, the cost picks the nearly done one."""
    a, b = worker("a"), worker("b")
    loads = {"a": load("a", inflight=1, prefill_tokens=4000), "b": load("b", inflight=1, prefill_tokens=4000)}
    scorer = KVCostScorer(CostWeights())
    flat = ScoringContext(prompt_tokens=4000, cached_tokens={}, loads=loads)
    est = ScoringContext(prompt_tokens=4000, cached_tokens={}, loads=loads, prefill_computed={"a": 3000, "b": 500})
    before, after = scorer.costs(flat, [a, b]), scorer.costs(est, [a, b])
    assert before["a"].total == before["b"].total
    assert after["a"].queued_prefill_blocks == 1000 // 16 + 1 and after["b"].queued_prefill_blocks == 3500 // 16 + 1
    assert after["a"].total < after["b"].total
    figures = est.figures_of([a, b])
    assert scorer.columns(est, [a, b], figures).total == [after["a"].total, after["b"].total]
    over = ScoringContext(prompt_tokens=4000, cached_tokens={}, loads=loads, prefill_computed={"a": 9000})
    assert scorer.costs(over, [a])["a"].queued_prefill_blocks == 0  # never below nothing queued
    for profile in (kv_prefill_profile(), kv_decode_profile()):  # the shipped profiles choose by it
        assert Pipeline(profile, rng=random.Random(0)).select(est, [b, a]).worker_id == "a"
        assert Pipeline(profile, rng=random.Random(0)).select(
            ScoringContext(prompt_tokens=4000, cached_tokens={}, loads=loads, prefill_computed={"b": 3000}), [a, b]
        ).worker_id == "b"


@pytest.mark.parametrize("enabled", [True, False])
def test_the_router_wires_it_when_enabled(enabled: bool) -> None:
    now = [100.0]
    router = KVRouter(settings(load={"scrape_interval_s": 60, "prefill_progress": enabled}), clock=lambda: now[0])
    a, b = worker("a", role=WorkerRole.BOTH), worker("b", role=WorkerRole.BOTH, port=8001)
    router.sync(WorkerPool.of([a, b]))
    router.accounting.start(FlightKey.decode("x"), "a", prefill_tokens=4000)
    now[0] = 100.2
    router.accounting.start(FlightKey.decode("y"), "b", prefill_tokens=4000)
    now[0] = 100.3  # prior line: 10,000 tokens/s after 20 ms: a 0.7 of its way by the line, b 0.2
    ctx = router.context(None, [a, b])
    if not enabled:
        assert router.progress is None and ctx.prefill_computed is None
        return
    assert ctx.prefill_computed == {"a": round(4000 * (1 - 0.25 / 0.7)), "b": 800}
    assert ctx.queued_prefill_tokens("a", 4000) == 4000 - round(4000 * (1 - 0.25 / 0.7))
    assert ctx.queued_prefill_tokens("c", 4000) == 4000  # nothing estimated there
    router.sync(WorkerPool.of([b]))  # a left: its prompts are forgotten
    assert set(router.context(None, [b]).prefill_computed or {}) == {"b"}


def test_short_prefills_of_one_size_fit_the_overhead_not_the_rate() -> None:
    """Cache hits: 60 uncached tokens each, over in one engine step of 100 ms. Read as a rate, that is 750 tokens/s
    on a worker that prefills 10,000; they measure the step (the overhead), and the prior rate stands until prompts
    of varied sizes pin the rate down."""
    p = PrefillProgress(LinearEstimate(overhead_s=0.02, tokens_per_s=10_000.0))
    for i in range(20):
        p.sent(i, f"w{i % 4}", 60 + i % 2, at=float(i))
        p.over(i, at=float(i) + 0.1)
    line = p.line.estimate()
    assert line.tokens_per_s == 10_000.0 and line.overhead_s == pytest.approx(0.094, abs=0.001)
    for i in range(20, 30):  # then cold prompts of 4,000 tokens: 1 s each with the same step
        p.sent(i, "w0", 4000, at=float(i))
        p.over(i, at=float(i) + 0.1 + 4000 / 4400)
    assert p.line.estimate().tokens_per_s == pytest.approx(4400, rel=0.05)


def test_on_by_default_and_a_watcher_already_set_is_kept() -> None:
    from litellm_disagg.routing.kv.settings import KVRoutingSettings

    assert KVRoutingSettings().load.prefill_progress is True
    router = KVRouter(KVRoutingSettings.model_validate({"enabled": True}))
    assert router.progress is not None and router.accounting.prefill_watcher is router.progress
    accounting = Accounting()
    other = progress()
    accounting.prefill_watcher = other  # e.g. a second router over one accounting: the first watcher stays
    assert KVRouter(KVRoutingSettings.model_validate({"enabled": True}), accounting=accounting).progress is None
    assert accounting.prefill_watcher is other

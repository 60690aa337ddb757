"""The model's load rates outside the simulator (``ModelSignals.prompt_tokens_per_s``, ``output_tokens_per_s``:
what the aggregation estimate needs, ``planner/mixing.py``): the workers' generation-token counters and the proxy's
prompt-token counter, their increase over the window (``planner/collect.py``, ``planner/window.py``). Pages come from
a mock transport; the in-proxy source reads this process's registry."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping

import httpx
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, generate_latest

from litellm_disagg.observability.requests import RequestMetrics
from litellm_disagg.planner import Planner
from litellm_disagg.planner.collect import (
    InProcessLatency,
    LatencySource,
    ProxyPagesLatency,
    ProxyTotals,
    SignalCollector,
)
from litellm_disagg.planner.mixing import EngineProfile
from litellm_disagg.planner.signals import ClusterSignals, ModelSignals
from litellm_disagg.planner.window import CounterWindow
from litellm_disagg.routing.kv.block_hash import PromptBlocks
from litellm_disagg.routing.kv.load_scraper import LoadScraper, parse_metrics
from litellm_disagg.routing.orchestrator import Mode, Outcome
from litellm_disagg.routing.route_plan import RoutePlan
from litellm_disagg.runtime_config import RuntimeConfig

from ..test_runtime_config import VALID
from .test_loop import Clock, settings

MODEL = "load-rates-model"


def engine_page(generated: float) -> str:
    """A vLLM worker's page: two engine cores, the generation-token counter split between them."""
    return (
        'vllm:num_requests_running{engine="0",model_name="m"} 2\n'
        'vllm:num_requests_waiting{engine="0",model_name="m"} 0\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25\n'
        f'vllm:generation_tokens_total{{engine="0",model_name="m"}} {0.75 * generated}\n'
        f'vllm:generation_tokens_total{{engine="1",model_name="m"}} {0.25 * generated}\n'
    )


def proxy_page(arrived: float, routed: Mapping[str, float] | None = None) -> str:
    """A proxy's page with its prompt-token counters: ``arrived`` (each request once, when its workers are chosen)
    and the per-worker counter of routed requests (``routed``: under role ``decode``; the planner does not read it)."""
    registry = CollectorRegistry()
    Counter("litellm_disagg_arrived_prompt_tokens", "", ["model"], registry=registry).labels(MODEL).inc(arrived)
    per_worker = Counter("litellm_disagg_prompt_tokens", "", ["model", "role", "worker"], registry=registry)
    for worker_id, n in (routed or {}).items():
        per_worker.labels(MODEL, "decode", worker_id).inc(n)
    return generate_latest(registry).decode()


class Pages:
    """Pages by URL (a status code: that error); an unknown URL is a 404."""

    def __init__(self) -> None:
        self.pages: dict[str, str | int] = {}

    def handler(self, request: httpx.Request) -> httpx.Response:
        page = self.pages.get(str(request.url), 404)
        return httpx.Response(page) if isinstance(page, int) else httpx.Response(200, text=page)


def worker(worker_id: str, role: str) -> RuntimeConfig:
    return RuntimeConfig.model_validate(VALID | {
        "worker_id": worker_id, "role": role, "model": MODEL, "base_url": f"http://{worker_id}:8000/v1",
        "allowed_roles": ["prefill", "decode", "both"]})


class NoLatency:
    async def read(self) -> Mapping[str, ProxyTotals]:
        return {}


@pytest.fixture
def client() -> Iterator[tuple[Pages, httpx.AsyncClient]]:
    pages = Pages()
    yield pages, httpx.AsyncClient(transport=httpx.MockTransport(pages.handler))


def collector(client: httpx.AsyncClient, latency: LatencySource, **kw: object) -> SignalCollector:
    # the scraper's own clock stands still: a page read in this step is fresh whatever the test's pace
    scraper = LoadScraper(client=client, clock=lambda: 0.0, stale_after_s=1.0)
    return SignalCollector(settings(**kw), latency, scraper=scraper)


async def rates(c: SignalCollector, now: float, workers: list[RuntimeConfig]) -> ModelSignals:
    signals = await c.collect(now, workers, {})
    found = signals.model(MODEL)
    assert found is not None
    return found


# -- the window ---------------------------------------------------------------------------------------------------


def test_counter_window_counts_each_source_from_its_own_baseline_and_a_restart_from_zero() -> None:
    w = CounterWindow(10.0)
    w.add(0.0, {"a": 1000.0, "b": 5000.0})
    assert w.rate(0.0) is None                              # one reading: a baseline only
    w.add(5.0, {"a": 1500.0, "b": 5750.0})
    assert w.rate(5.0) == pytest.approx(1250 / 5)
    w.add(10.0, {"a": 200.0, "b": 6250.0, "new": 1e6})      # a restarted (counted from zero), new joins: baseline
    assert w.rate(10.0) == pytest.approx((500 + 750 + 200 + 500) / 10)
    w.add(15.0, {"b": 6750.0})                              # a not read: keeps its baseline
    w.add(20.0, {"a": 600.0, "b": 7250.0, "new": 1e6 + 100})
    assert w.rate(20.0) == pytest.approx((500 + 400 + 500 + 100) / 10)  # since the snapshot at 10 s
    w.retain(["b"])                                         # a and new left; when a comes back, a new baseline
    w.add(25.0, {"a": 5e6, "b": 7350.0})
    assert w.rate(25.0) == pytest.approx((100 + 500 + 400 + 100) / 10)
    assert w.rate(36.0) is None                             # nothing read for longer than the window


def test_the_load_scraper_reads_the_generation_counter_summed_over_engines() -> None:
    load = parse_metrics(engine_page(1000.0))
    assert load is not None and load.generation_tokens == pytest.approx(1000.0)
    without = parse_metrics('vllm:num_requests_running{engine="0"} 1\n')
    assert without is not None and without.generation_tokens is None


# -- output tokens: the workers' counters -------------------------------------------------------------------------


async def test_output_tokens_per_s_from_the_workers_counters_a_restart_neither_negative_nor_huge(client) -> None:
    pages, http = client
    workers = [worker("d0", "decode"), worker("d1", "decode")]
    c = collector(http, NoLatency())
    try:
        pages.pages = {"http://d0:8000/metrics": engine_page(1000), "http://d1:8000/metrics": engine_page(5000)}
        assert (await rates(c, 0.0, workers)).output_tokens_per_s is None   # a baseline only
        pages.pages = {"http://d0:8000/metrics": engine_page(1500), "http://d1:8000/metrics": engine_page(5750)}
        assert (await rates(c, 5.0, workers)).output_tokens_per_s == pytest.approx((500 + 750) / 5)
        # d0 restarted: its counter starts again from zero (the summed counter went down from 7250 to 6450);
        # d2 joins after hours of serving: its counter is a baseline, not a burst
        workers.append(worker("d2", "decode"))
        pages.pages = {"http://d0:8000/metrics": engine_page(200), "http://d1:8000/metrics": engine_page(6250),
                       "http://d2:8000/metrics": engine_page(3e6)}
        model = await rates(c, 10.0, workers)
        assert model.output_tokens_per_s == pytest.approx((500 + 750 + 200 + 500) / 10)
        # d1's page fails: its tokens are counted at its next read
        pages.pages["http://d0:8000/metrics"] = engine_page(400)
        pages.pages["http://d1:8000/metrics"] = 500
        pages.pages["http://d2:8000/metrics"] = engine_page(3e6 + 300)
        assert (await rates(c, 15.0, workers)).output_tokens_per_s == pytest.approx((200 + 500 + 200 + 300) / 10)
        pages.pages["http://d1:8000/metrics"] = engine_page(6650)
        assert (await rates(c, 20.0, workers)).output_tokens_per_s == pytest.approx((200 + 400 + 300) / 10)
    finally:
        await c.aclose()
        await http.aclose()


# -- prompt tokens: the proxy's counter ---------------------------------------------------------------------------


async def test_standalone_prompt_tokens_per_s_added_over_proxies_from_the_arrivals(client) -> None:
    pages, http = client
    a, b = "http://proxy-a/metrics", "http://proxy-b/metrics"
    source = ProxyPagesLatency([a, b], client=http)
    c = collector(http, source)
    workers = [worker("p0", "prefill"), worker("d0", "decode")]
    try:
        pages.pages = {a: proxy_page(1000, {"d0": 800}), b: proxy_page(500)}
        totals = (await source.read())[MODEL]
        assert totals.prompt_tokens == {a: 1000.0, b: 500.0}       # per proxy; arrivals, not the routed counter
        assert (await rates(c, 0.0, workers)).prompt_tokens_per_s is None
        # 600 tokens arrived at proxy a (their prefills still queued: the routed counter has not moved); proxy b
        # restarted and 300 arrived since
        pages.pages = {a: proxy_page(1600, {"d0": 800}), b: proxy_page(300)}
        assert (await rates(c, 10.0, workers)).prompt_tokens_per_s == pytest.approx((600 + 300) / 10)
        pages.pages[b] = 503                                          # b unreadable: counted at its next read
        pages.pages[a] = proxy_page(2000)
        assert (await rates(c, 20.0, workers)).prompt_tokens_per_s == pytest.approx(400 / 10)
        pages.pages[b] = proxy_page(500)
        assert (await rates(c, 30.0, workers)).prompt_tokens_per_s == pytest.approx(200 / 10)
    finally:
        await c.aclose()
        await http.aclose()


async def test_the_prompt_rate_over_the_reach_sees_an_arrival_the_window_has_dropped(client) -> None:
    """``recent_prompt_tokens_per_s``: the same counter over ``window_max_s`` (60 s here), where the latency windows
    reach; the rate over ``window_s`` (10 s) reads zero in a lull between two arrivals."""
    pages, http = client
    a = "http://proxy-a/metrics"
    c = collector(http, ProxyPagesLatency([a], client=http), window_max_s=60)
    bare = collector(http, ProxyPagesLatency([a], client=http))
    workers = [worker("p0", "prefill"), worker("d0", "decode")]
    try:
        for now, arrived in ((0.0, 1000), (5.0, 1600), (15.0, 1600), (30.0, 1600)):
            pages.pages = {a: proxy_page(arrived)}
            model, plain = await rates(c, now, workers), await rates(bare, now, workers)
        assert model.prompt_tokens_per_s == 0.0 and model.recent_prompt_tokens_per_s == pytest.approx(600 / 30)
        assert plain.recent_prompt_tokens_per_s is None  # no reach past window_s: nothing more to say
        pages.pages = {a: proxy_page(1600)}
        assert (await rates(c, 70.0, workers)).recent_prompt_tokens_per_s == 0.0  # the arrival left the reach
    finally:
        await c.aclose()
        await bare.aclose()
        await http.aclose()


class Routed:
    """Requests routed through the proxy's own request metrics (``RequestMetrics``): this process's registry."""

    def __init__(self, decode: RuntimeConfig, prefill: RuntimeConfig):
        self.decode, self.prefill = decode, prefill
        self.metrics = RequestMetrics(clock=Clock())
        self.n = 0

    def serve(self, prompt_tokens: int, *, remote: bool) -> None:
        self.n += 1
        call = f"load-rates-{self.n}"
        plan, outcome = self.arrive(call, prompt_tokens, remote=remote)
        self.metrics.routed(call, plan, outcome, started=0.0, selection_s=0.0)
        self.metrics.finished(call)

    def arrive(self, call: str, prompt_tokens: int, *, remote: bool) -> tuple[RoutePlan, Outcome]:
        """The call's workers chosen (as the strategy does before the prefill runs); its plan and outcome."""
        prompt = PromptBlocks(list(range(prompt_tokens)))
        if remote:
            plan = RoutePlan(self.decode, (self.prefill,), None, "remote", prompt=prompt)
            outcome = Outcome(Mode.DISAGGREGATED, self.decode, self.prefill.worker_id, prefill_seconds=0.1)
        else:
            plan = RoutePlan(self.decode, (), "short", "local", prompt=prompt)
            outcome = Outcome(Mode.AGGREGATED, self.decode)
        self.metrics.chosen(call, plan)
        return plan, outcome


async def test_in_the_proxy_prompt_tokens_per_s_counts_each_request_once_and_the_planner_estimates(client) -> None:
    pages, http = client
    prefill, decode = worker("p1", "prefill"), worker("d1", "decode")
    routed = Routed(decode, prefill)
    profile = EngineProfile(weight_read_ms=20.0, per_sequence_ms=0.2, prefill_tokens_per_s=20_000,
                            max_num_batched_tokens=512)
    c = collector(http, InProcessLatency(), engine_profile=profile)
    workers = [prefill, decode]
    pages.pages = {"http://d1:8000/metrics": engine_page(0), "http://p1:8000/metrics": engine_page(0)}
    try:
        routed.serve(10, remote=False)  # before the baseline: not in the window
        first = await rates(c, 0.0, workers)
        assert first.prompt_tokens_per_s is None and first.output_tokens_per_s is None
        for _ in range(10):
            routed.serve(100, remote=True)   # counted under decode and prefill: once here
            routed.serve(50, remote=False)
        pages.pages["http://d1:8000/metrics"] = engine_page(4000)
        model = await rates(c, 10.0, workers)
        assert model.prompt_tokens_per_s == pytest.approx((10 * 100 + 10 * 50) / 10)
        assert model.output_tokens_per_s == pytest.approx(4000 / 10)
        decision = Planner(c.settings).step(ClusterSignals((model,)), 10.0).decision(MODEL)
        assert decision is not None and decision.pressures.aggregated_itl_ratio is not None
    finally:
        await c.aclose()
        await http.aclose()


async def test_in_the_proxy_prompts_count_when_they_arrive_not_when_their_queued_prefill_answers(client) -> None:
    """Under a prefill backlog the requests routed per second are the prefill pool's throughput; the estimate of
    aggregated serving needs what arrives. 20 prompts arrive and wait for their remote prefills: the rate counts them;
    when their prefills answer (``routed``) and a retry of one is chosen again, nothing is counted twice."""
    pages, http = client
    prefill, decode = worker("p1", "prefill"), worker("d1", "decode")
    routed = Routed(decode, prefill)
    c = collector(http, InProcessLatency())
    workers = [prefill, decode]
    pages.pages = {"http://d1:8000/metrics": engine_page(0), "http://p1:8000/metrics": engine_page(0)}
    try:
        routed.serve(10, remote=False)
        assert (await rates(c, 0.0, workers)).prompt_tokens_per_s is None    # a baseline
        waiting = [(f"queued-{i}", *routed.arrive(f"queued-{i}", 200, remote=True)) for i in range(20)]
        assert (await rates(c, 10.0, workers)).prompt_tokens_per_s == pytest.approx(20 * 200 / 10)
        for call, plan, outcome in waiting:
            routed.metrics.routed(call, plan, outcome, started=1000.0, selection_s=0.0)  # the metrics' clock
        routed.metrics.chosen(waiting[0][0], waiting[0][1])   # a retry of a routed call
        for call, _, _ in waiting:
            routed.metrics.finished(call)
        assert (await rates(c, 20.0, workers)).prompt_tokens_per_s == 0.0   # nothing arrived in the last window
    finally:
        await c.aclose()
        await http.aclose()


async def test_a_worker_whose_metrics_page_answers_slower_than_the_planners_interval_is_still_read() -> None:
    """The planner's own scraper (no scraper given) waits for a page longer than a short ``interval_s``: a real
    CPU engine's API process on a starved machine answers late, and an unread generation counter leaves the
    estimates without an output rate (``planner.collect.SCRAPE_TIMEOUT_S``)."""
    delay_s, generated = 1.0, [1000.0]

    async def metrics(_: web.Request) -> web.Response:
        await asyncio.sleep(delay_s)
        return web.Response(text=engine_page(generated[0]))

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    slow = RuntimeConfig.model_validate(VALID | {
        "worker_id": "slow", "role": "decode", "model": MODEL, "base_url": f"http://127.0.0.1:{port}/v1"})
    c = SignalCollector(settings(interval_s=0.5), NoLatency())
    try:
        assert c.scraper.timeout_s > delay_s
        first = await rates(c, 0.0, [slow])
        assert first.workers[0].kv_usage == pytest.approx(0.25)           # read, not unknown
        generated[0] = 1500.0
        assert (await rates(c, 5.0, [slow])).output_tokens_per_s == pytest.approx(500 / 5)
    finally:
        await c.aclose()
        await runner.cleanup()


async def test_a_slow_proxy_page_does_not_make_this_steps_worker_counters_stale(client) -> None:
    """The standalone planner reads the workers' pages, then the proxies' (their own timeout): values scraped in
    this step are this step's, however long the proxies' pages take (CI at 1f68b9b: the output rate unknown for the
    whole test while the counters were read at every step)."""
    pages, http = client
    clock = [0.0]

    class SlowProxy:
        async def read(self) -> Mapping[str, ProxyTotals]:
            clock[0] += 3.0                        # the proxy's page answers 3 s later: past stale_after_s
            return {}

    scraper = LoadScraper(client=http, clock=lambda: clock[0], stale_after_s=1.0)
    c = SignalCollector(settings(), SlowProxy(), scraper=scraper)
    workers = [worker("d0", "decode")]
    try:
        pages.pages = {"http://d0:8000/metrics": engine_page(1000)}
        first = await rates(c, 0.0, workers)
        assert first.workers[0].kv_usage == pytest.approx(0.25)
        pages.pages = {"http://d0:8000/metrics": engine_page(1500)}
        assert (await rates(c, 5.0, workers)).output_tokens_per_s == pytest.approx(500 / 5)
    finally:
        await c.aclose()
        await http.aclose()

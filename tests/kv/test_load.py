"""Load collection: /metrics parsing and scraping (stub HTTP), the router's accounting (requests, tokens, blocks),
WorkerLoad snapshots."""

from __future__ import annotations

import random

import httpx
import pytest

from litellm_disagg.routing.accounting import Accounting, FlightKey
from litellm_disagg.routing.kv.load_scraper import NOT_SCRAPED, LoadScraper, ScrapedLoad, parse_metrics
from litellm_disagg.routing.pipeline.context import WorkerLoad, collect_loads
from tests.kv.helpers import worker
from tests.kv.zmq_pub import until

PAGE = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 1.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 5.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.25
vllm:num_requests_running_total{model_name="m"} 99.0
vllm:prompt_tokens_total{model_name="m"} 1234.0
vllm:time_to_first_token_seconds_bucket{le="0.001",model_name="m"} 0.0
"""


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (PAGE, ScrapedLoad(waiting=5.0, running=4.0, kv_usage=0.375, stale=False)),
        (
            "vllm:num_requests_running 2\nvllm:gpu_cache_usage_perc 0.9\n",
            ScrapedLoad(running=2.0, kv_usage=0.9, stale=False),
        ),
        ('vllm:kv_cache_usage_perc{a="}"} 1.5 1700000000\n', ScrapedLoad(kv_usage=1.0, stale=False)),
        ('vllm:num_requests_waiting{x="1"} NaNish\n', None),
        ("# nothing here\nother_metric 1\n", None),
    ],
)
def test_parse_metrics(text: str, expected: ScrapedLoad | None) -> None:
    assert parse_metrics(text) == expected


class Pages:
    def __init__(self) -> None:
        self.pages: dict[str, str | int] = {}
        self.calls = 0

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.calls += 1
        assert request.url.path == "/metrics"
        page = self.pages.get(request.url.host, 404)
        if isinstance(page, int):
            return httpx.Response(page)
        return httpx.Response(200, text=page)


async def test_scrape_keeps_last_values_marked_stale_on_failure() -> None:
    pages, clock = Pages(), Clock()
    pages.pages = {"a": PAGE, "b": "vllm:num_requests_running 1\n"}
    scraper = LoadScraper(
        client=httpx.AsyncClient(transport=httpx.MockTransport(pages.handler)), clock=clock, stale_after_s=2.0
    )
    scraper.set_targets({"wa": "http://a", "wb": "http://b", "wc": "http://c"})
    await scraper.scrape_once()
    snap = scraper.snapshot()
    assert snap["wa"] == ScrapedLoad(5.0, 4.0, 0.375, scraped_at=100.0, stale=False)
    assert snap["wc"].stale and snap["wc"].running == 0  # never scraped successfully
    pages.pages["a"] = 500
    clock.now = 101.0
    await scraper.scrape_once()
    assert scraper.get("wa") == ScrapedLoad(5.0, 4.0, 0.375, scraped_at=100.0, stale=True)
    assert not scraper.get("wb").stale
    clock.now = 104.0  # too old now, even without a failure
    assert scraper.get("wb").stale
    scraper.set_targets({"wb": "http://b"})
    assert set(scraper.snapshot()) == {"wb"} and scraper.get("wa") == ScrapedLoad()


async def test_each_scrape_records_what_the_router_counted_there_when_it_arrived() -> None:
    pages, clock = Pages(), Clock()
    pages.pages = {"a": "vllm:num_requests_running 1\n", "b": "vllm:num_requests_running 0\n"}
    accounting = Accounting()
    accounting.start(FlightKey.prefill("p"), "wa", prefill_tokens=2000)
    scraper = LoadScraper(client=httpx.AsyncClient(transport=httpx.MockTransport(pages.handler)), clock=clock,
                          counted=accounting.requests)
    scraper.set_targets({"wa": "http://a", "wb": "http://b"})
    await scraper.scrape_once()
    assert scraper.get("wa").counted_at_scrape == 1.0 and scraper.get("wb").counted_at_scrape == 0.0
    # The prompt ends before the next scrape: the worker reads idle at once, not busy until then.
    loads = collect_loads([worker("wa")], accounting=accounting, scraped=scraper.lookup())
    assert loads["wa"].active_requests == 1.0
    accounting.finish(FlightKey.prefill("p"))
    loads = collect_loads([worker("wa")], accounting=accounting, scraped=scraper.lookup())
    assert loads["wa"].active_requests == 0.0
    unmoved = LoadScraper(client=httpx.AsyncClient(transport=httpx.MockTransport(pages.handler)), clock=clock)
    unmoved.set_targets({"wa": "http://a"})
    await unmoved.scrape_once()
    assert unmoved.get("wa").counted_at_scrape is None
    assert collect_loads([worker("wa")], accounting=accounting, scraped=unmoved.lookup())["wa"].active_requests == 1.0


async def test_scraper_task_runs_and_stops() -> None:
    pages = Pages()
    pages.pages = {"a": PAGE}
    scraper = LoadScraper(interval_s=0.01, client=httpx.AsyncClient(transport=httpx.MockTransport(pages.handler)))
    scraper.set_targets({"wa": "http://a"})
    scraper.start()
    await until(lambda: pages.calls >= 3)
    await scraper.stop()
    calls = pages.calls
    assert scraper.get("wa").running == 4.0
    import asyncio

    await asyncio.sleep(0.05)
    assert pages.calls == calls


def test_accounting_tracks_tokens_and_blocks() -> None:
    clock = Clock()
    tracker = Accounting(max_age_s=60, clock=clock)
    r1, r2, r3 = FlightKey.decode("r1"), FlightKey.decode("r2"), FlightKey.decode("r3")
    tracker.start(r1, "a", prefill_tokens=1000, decode_blocks=70)
    tracker.start(r2, "a", prefill_tokens=500)
    tracker.start(r3, "b", decode_blocks=10)
    assert (tracker.prefill_tokens("a"), tracker.decode_blocks("a")) == (1500, 70)
    assert (tracker.requests("a"), tracker.requests("b")) == (2, 1)  # every entry is one request in flight
    tracker.prefill_done(r1)
    assert (tracker.prefill_tokens("a"), tracker.decode_blocks("a")) == (500, 70)
    assert tracker.requests("a") == 2  # prefilled, still decoding
    tracker.start(r2, "b", prefill_tokens=5)  # a key moves
    assert tracker.prefill_tokens("a") == 0 and tracker.prefill_tokens("b") == 5
    assert (tracker.requests("a"), tracker.requests("b")) == (1, 2)
    tracker.finish(r1)
    tracker.finish(FlightKey.decode("unknown"))
    assert tracker.decode_blocks("a") == 0 and tracker.requests("a") == 0
    clock.now += 61  # a lost completion cannot pin a worker
    assert tracker.decode_blocks("b") == 0 and tracker.prefill_tokens("b") == 0 and tracker.requests("b") == 0


@pytest.mark.parametrize(
    ("load", "active", "used", "free"),
    [
        (WorkerLoad("w", 100, inflight_requests=2, inflight_decode_blocks=10), 2.0, 10.0, 0.9),
        (WorkerLoad("w", 100, 2, 0, 10, ScrapedLoad(waiting=3, running=4, kv_usage=0.5, stale=False)), 7.0, 50.0, 0.5),
        (
            WorkerLoad("w", 100, 9, 0, 80, ScrapedLoad(waiting=3, running=4, kv_usage=0.5, stale=False)),
            9.0,
            80.0,
            pytest.approx(0.2),
        ),
        (WorkerLoad("w", 100, 1, 0, 0, ScrapedLoad(waiting=30, running=40, kv_usage=0.9, stale=True)), 1.0, 0.0, 1.0),
        # The engine's count moved by what the router started and saw end since the scrape: its one request there
        # ended after the scrape (idle now); two outside requests stay counted; two more of its own started since.
        (WorkerLoad("w", 100, 0, 0, 0, ScrapedLoad(running=1, stale=False, counted_at_scrape=1)), 0.0, 0.0, 1.0),
        (WorkerLoad("w", 100, 0, 0, 0, ScrapedLoad(running=3, stale=False, counted_at_scrape=1)), 2.0, 0.0, 1.0),
        (WorkerLoad("w", 100, 3, 0, 0, ScrapedLoad(running=3, stale=False, counted_at_scrape=1)), 5.0, 0.0, 1.0),
        (WorkerLoad("w", 0), 0.0, 0.0, 0.0),
    ],
)
def test_worker_load_combines_router_and_engine_views(
    load: WorkerLoad, active: float, used: float, free: float
) -> None:
    assert (load.active_requests, load.used_blocks, load.free_kv_fraction) == (active, used, free)


def test_collect_loads() -> None:
    accounting = Accounting()
    accounting.start(FlightKey.decode("x"), "a", prefill_tokens=64, decode_blocks=4)
    scraped = {"b": ScrapedLoad(running=2, stale=False)}
    loads = collect_loads([worker("a", capacity=50), worker("b")], accounting=accounting, scraped=scraped)
    assert loads["a"] == WorkerLoad("a", 50, 1, 64, 4)
    assert loads["b"].active_requests == 2.0
    assert collect_loads([worker("a")])["a"] == WorkerLoad("a", 1000)


def reference_views(load: WorkerLoad) -> tuple[float, float, float]:
    """``active_requests``, ``used_blocks`` and ``free_kv_fraction`` as first written, with ``max``."""
    s = load.scraped
    engine = s.running + s.waiting
    if s.counted_at_scrape is not None:
        engine += load.inflight_requests - s.counted_at_scrape
    active = float(load.inflight_requests) if s.stale else max(float(load.inflight_requests), engine)
    used = max(float(load.inflight_decode_blocks), 0.0 if s.stale else s.kv_usage * load.kv_capacity_blocks)
    free = 0.0 if load.kv_capacity_blocks <= 0 else max(0.0, 1.0 - used / load.kv_capacity_blocks)
    return active, used, free


def test_worker_load_views_equal_their_max_definition() -> None:
    nan, inf = float("nan"), float("inf")
    values = [0, 1, 3, 2.5, -1.0, nan, inf, 1e300]
    rng = random.Random(0)
    for _ in range(3000):
        scraped = ScrapedLoad(
            waiting=rng.choice(values),
            running=rng.choice(values),
            kv_usage=rng.choice(values),
            stale=rng.random() < 0.3,
            counted_at_scrape=rng.choice([None, None, 0.0, 1.0, 4.0]),
        )
        load = WorkerLoad("w", rng.choice([0, 1, 100, -5]), rng.choice([0, 1, 7]), 0, rng.choice([0, 5, 200]), scraped)
        got = (load.active_requests, load.used_blocks, load.free_kv_fraction)
        # repr: the same value and type (an int stays an int), NaN included
        assert repr(got) == repr(reference_views(load)), load


def reference_collect_loads(candidates, *, accounting=None, scraped=None):  # type: ignore[no-untyped-def]
    """``collect_loads`` as first written (its in-flight count and its token counts, once two trackers, now read
    from ``Accounting``'s per-worker accessors, each of which expires old entries first)."""
    if scraped is None:
        lookup = lambda _: NOT_SCRAPED  # noqa: E731
    elif isinstance(scraped, dict):
        lookup = lambda wid: scraped.get(wid, NOT_SCRAPED)  # noqa: E731
    else:
        lookup = scraped
    out = {}
    for w in candidates:
        if accounting is not None:
            count = accounting.requests(w.worker_id)
            prefill, decode = accounting.prefill_tokens(w.worker_id), accounting.decode_blocks(w.worker_id)
        else:
            count, prefill, decode = 0, 0, 0
        out[w.worker_id] = WorkerLoad(w.worker_id, w.kv_capacity_blocks, count, prefill, decode, lookup(w.worker_id))
    return out


def test_collect_loads_equals_its_first_definition() -> None:
    rng = random.Random(1)
    workers = [worker(f"w{i}", capacity=rng.randrange(0, 500)) for i in range(40)]
    clock = Clock()
    accounting = Accounting(max_age_s=60, clock=clock)
    for i in range(60):
        wid = rng.choice(workers).worker_id
        key = FlightKey.decode(f"r{i}") if i % 2 else FlightKey.prefill(f"r{i}")
        if i % 5 == 0:  # a request without tokens or blocks: counted as a request only
            accounting.start(key, wid)
        else:
            accounting.start(key, wid, prefill_tokens=rng.randrange(0, 999), decode_blocks=rng.randrange(0, 99))
        clock.now += 1.0
    # the oldest entries are past max_age_s at the first snapshot: collect_loads must expire them as the reads do
    clock.now = 100.0 + 60 + 15.5
    scraped = {w.worker_id: ScrapedLoad(running=rng.randrange(5), stale=rng.random() < 0.5) for w in workers[::2]}
    for kwargs in (
        {},
        {"accounting": accounting},
        {"scraped": scraped},
        {"scraped": lambda wid: scraped.get(wid, NOT_SCRAPED)},
        {"accounting": accounting, "scraped": scraped},
    ):
        got = collect_loads(workers, **kwargs)  # type: ignore[arg-type]
        expected = reference_collect_loads(workers, **kwargs)
        assert got == expected and list(got) == list(expected)
        assert all(type(v) is WorkerLoad for v in got.values())
    assert len(accounting) == 60 - 16  # the entries started at 100..115 s expired, the others are counted


async def test_load_cache_equals_collect_loads_at_every_step() -> None:
    """``LoadCache`` (the router's snapshot kept between decisions) against ``collect_loads`` at the same instant,
    over random accounting changes, scrapes that succeed or fail, figures aging past ``stale_after_s``, entries
    expiring, targets and capacities changing and the clock going back: every candidate's load and figures equal."""
    from litellm_disagg.routing.pipeline.context import LoadCache, figures

    rng = random.Random(3)
    pages, clock = Pages(), Clock()
    scraper = LoadScraper(
        client=httpx.AsyncClient(transport=httpx.MockTransport(pages.handler)), clock=clock, stale_after_s=2.0
    )
    accounting = Accounting(max_age_s=30, clock=clock)
    cache = LoadCache(accounting, scraper)
    ids = [f"w{i}" for i in range(12)]
    capacity = {wid: rng.choice([0, 100, 1000]) for wid in ids}
    scraper.set_targets({wid: f"http://{wid}" for wid in ids})

    def page() -> str:
        return f"vllm:num_requests_running {rng.randrange(6)}\nvllm:kv_cache_usage_perc {rng.random()}\n"

    pages.pages = {wid: page() for wid in ids}
    live: list[FlightKey] = []
    checked = 0
    for step in range(600):
        action = rng.randrange(8)
        if action == 0:
            key = FlightKey.decode(f"r{step}")
            accounting.start(
                key, rng.choice(ids), prefill_tokens=rng.choice([0, 64, 999]), decode_blocks=rng.randrange(50)
            )
            live.append(key)
        elif action == 1 and live:
            accounting.finish(live.pop(rng.randrange(len(live))))
        elif action == 2 and live:
            accounting.prefill_done(rng.choice(live))
        elif action == 3:
            for wid in rng.sample(ids, rng.randrange(1, 5)):  # the others serve their page again (new values or not)
                pages.pages[wid] = page() if rng.random() < 0.8 else 500
            await scraper.scrape_once()
        elif action == 4:
            clock.now += rng.choice([0.01, 0.5, 1.0, 1.99, 2.0, 2.5, 12.0])
        elif action == 5 and rng.random() < 0.2:
            clock.now -= rng.choice([0.5, 3.0])
        elif action == 6 and rng.random() < 0.3:
            scraper.set_targets({wid: f"http://{wid}" for wid in rng.sample(ids, rng.randrange(6, 13))})
        elif action == 7 and rng.random() < 0.3:
            capacity[rng.choice(ids)] = rng.choice([0, 100, 1000, 5000])
        candidates = [worker(wid, capacity=capacity[wid]) for wid in rng.sample(ids, rng.randrange(1, 13))]
        loads, figs = cache.snapshot(candidates)
        want = collect_loads(candidates, accounting=accounting, scraped=scraper.lookup())
        for w in candidates:
            assert loads[w.worker_id] == want[w.worker_id], (step, w.worker_id)
            assert figs[w.worker_id] == figures(want[w.worker_id])
            checked += 1
    assert checked > 2000


def test_the_kv_router_moves_its_scrapes_by_its_accounting_only_when_told_to() -> None:
    from litellm_disagg.routing.kv.router import KVRouter
    from litellm_disagg.routing.kv.settings import KVRoutingSettings

    moved = KVRouter(KVRoutingSettings.model_validate({"enabled": True, "load": {"advance_scrapes": True}}))
    assert moved.scraper.counted == moved.accounting.requests
    plain = KVRouter(KVRoutingSettings.model_validate({"enabled": True}))  # off by default since 2026-12-07
    assert plain.scraper.counted is None

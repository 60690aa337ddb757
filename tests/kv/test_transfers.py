"""Measured KV transfer cost: NIXL counters parsed from /metrics, their increases per worker, the decider's transfer
fit fed through KVRouter, and all of it against a simulated prefill/decode cluster."""

from __future__ import annotations

import httpx
import pytest

from litellm_disagg.engines.base import Endpoint
from litellm_disagg.engines.vllm.transfer import KVTransferParams, build_prefill_body
from litellm_disagg.routing.kv.disagg_decision import DisaggDecider, LinearEstimate, OnlineLinearFit
from litellm_disagg.routing.kv.load_scraper import (
    LoadScraper,
    TransferDeltas,
    TransferSample,
    TransferTotals,
    parse_metrics,
    parse_transfer_totals,
)
from litellm_disagg.routing.kv.router import KVRouter
from litellm_disagg.routing.kv.settings import DisaggDecisionSettings, KVRoutingSettings
from litellm_disagg.routing.pool import WorkerPool
from litellm_disagg.runtime_config import WorkerRole
from litellm_disagg.sim import SimCluster, SimSettings
from litellm_disagg.sim.settings import EngineSettings
from tests.kv.helpers import worker


def page(transfers: float, seconds: float, tokens: float, *, start: float | None = None, running: int = 1) -> str:
    """A decode worker's /metrics as vLLM writes it (two engines, the histogram's buckets, the other sources)."""
    half = transfers / 2
    lines = [
        f'vllm:num_requests_running{{engine="0",model_name="m"}} {running}',
        "# TYPE vllm:nixl_xfer_time_seconds histogram",
        f'vllm:nixl_xfer_time_seconds_bucket{{engine="0",le="0.005",model_name="m"}} {half}',
        f'vllm:nixl_xfer_time_seconds_bucket{{engine="0",le="+Inf",model_name="m"}} {half}',
        f'vllm:nixl_xfer_time_seconds_count{{engine="0",model_name="m"}} {half}',
        f'vllm:nixl_xfer_time_seconds_sum{{engine="0",model_name="m"}} {seconds / 2}',
        f'vllm:nixl_xfer_time_seconds_count{{engine="1",model_name="m"}} {transfers - half}',
        f'vllm:nixl_xfer_time_seconds_sum{{engine="1",model_name="m"}} {seconds / 2}',
        'vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_compute"} 999.0',
        f'vllm:prompt_tokens_by_source_total{{engine="0",model_name="m",source="external_kv_transfer"}} {tokens}',
        'vllm:prompt_tokens_by_source_total{engine="1",model_name="m",source="local_cache_hit"} 7.0',
        'vllm:nixl_bytes_transferred_sum{engine="0",model_name="m"} 123456.0',
    ]
    if start is not None:
        lines.append(f"process_start_time_seconds {start}")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (page(4, 0.5, 3000), TransferTotals(4.0, 0.5, 3000.0, bytes=123456.0)),
        (page(4, 0.5, 3000, start=1.7e9), TransferTotals(4.0, 0.5, 3000.0, process_start=1.7e9, bytes=123456.0)),
        # an aggregated worker, or one without NixlConnector: no histogram
        ('vllm:num_requests_running 1\nvllm:prompt_tokens_by_source_total{source="external_kv_transfer"} 0\n', None),
        # an older vLLM: the histogram but no tokens by source
        ("vllm:num_requests_running 1\nvllm:nixl_xfer_time_seconds_count 3\nvllm:nixl_xfer_time_seconds_sum 1\n", None),
        ("vllm:nixl_xfer_time_seconds_count NaN\nvllm:nixl_xfer_time_seconds_sum 1\n", None),
    ],
)
def test_parse_transfer_totals(text: str, expected: TransferTotals | None) -> None:
    assert parse_transfer_totals(text) == expected


def test_transfer_metrics_alone_are_no_load_figures() -> None:
    assert parse_metrics("process_start_time_seconds 5\nvllm:nixl_xfer_time_seconds_count 3\n") is None
    assert parse_metrics(page(4, 0.5, 3000, running=3)) is not None


def totals(transfers: float, seconds: float, tokens: float, start: float | None = None) -> TransferTotals:
    return TransferTotals(transfers, seconds, tokens, start)


def test_deltas_between_scrapes() -> None:
    deltas = TransferDeltas(carry_s=5.0)
    assert deltas.update("w", totals(10, 1.0, 5000), now=0.0) is None  # first scrape: the baseline only
    assert deltas.update("w", totals(10, 1.0, 5000), now=1.0) is None  # nothing happened
    assert deltas.update("w", totals(12, 1.5, 5800), now=2.0) == TransferSample("w", 2.0, 0.5, 800.0)
    assert deltas.update("v", totals(3, 0.3, 300), now=2.0) is None  # workers are independent
    # a restart: counters went down; the new values are the baseline, nothing is reported
    assert deltas.update("w", totals(1, 0.25, 100), now=3.0) is None
    assert deltas.update("w", totals(2, 0.75, 300), now=4.0) == TransferSample("w", 1.0, 0.5, 200.0)
    # a restart that the counters alone would miss (they grew past the old values): the process start tells
    assert deltas.update("w", totals(2, 0.75, 300, start=10.0), now=5.0) is None
    assert deltas.update("w", totals(50, 9.0, 9000, start=20.0), now=6.0) is None
    assert deltas.update("w", totals(51, 9.5, 9100, start=20.0), now=7.0) == TransferSample("w", 1.0, 0.5, 100.0)
    # metrics gone (the worker came back aggregated): no baseline any more
    assert deltas.update("w", None, now=8.0) is None
    assert deltas.update("w", totals(60, 10.0, 9900, start=20.0), now=9.0) is None


def test_a_one_sided_increase_waits_for_its_other_side_for_a_while() -> None:
    deltas = TransferDeltas(carry_s=5.0)
    deltas.update("w", totals(0, 0.0, 0), now=0.0)
    # the transfer completed before this scrape, its tokens are counted after it
    assert deltas.update("w", totals(1, 0.25, 0), now=1.0) is None
    assert deltas.update("w", totals(1, 0.25, 400), now=2.0) == TransferSample("w", 1.0, 0.25, 400.0)
    # tokens from somewhere else (no transfer to match within carry_s) do not pile onto a later transfer
    assert deltas.update("w", totals(1, 0.25, 900), now=3.0) is None
    assert deltas.update("w", totals(1, 0.25, 900), now=7.0) is None  # still waiting (4 s)
    assert deltas.update("w", totals(2, 0.5, 1000), now=9.0) == TransferSample("w", 1.0, 0.25, 100.0)


class Pages:
    def __init__(self) -> None:
        self.pages: dict[str, str | int] = {}

    def handler(self, request: httpx.Request) -> httpx.Response:
        found = self.pages.get(request.url.host, 404)
        return httpx.Response(found) if isinstance(found, int) else httpx.Response(200, text=found)


async def test_scraper_hands_samples_to_its_observer() -> None:
    pages, samples = Pages(), list[TransferSample]()
    scraper = LoadScraper(
        client=httpx.AsyncClient(transport=httpx.MockTransport(pages.handler)), on_transfers=samples.append
    )
    scraper.set_targets({"wa": "http://a", "wb": "http://b"})
    pages.pages = {"a": page(2, 0.5, 1000), "b": "vllm:num_requests_running 1\n"}  # b: aggregated, no NIXL
    await scraper.scrape_once()
    assert samples == []  # baselines
    pages.pages["a"] = 500
    await scraper.scrape_once()  # a failed scrape in between changes nothing
    pages.pages["a"] = page(6, 1.5, 3000)
    await scraper.scrape_once()
    assert samples == [TransferSample("wa", 4.0, 1.0, 2000.0)]
    assert not scraper.get("wa").stale and not scraper.get("wb").stale

    scraper.set_targets({"wa": "http://a2"})  # same id, another URL: another process, a new baseline
    pages.pages["a2"] = page(7, 1.1, 3500)
    await scraper.scrape_once()
    assert len(samples) == 1

    def broken(sample: TransferSample) -> None:
        raise RuntimeError("observer bug")

    scraper.on_transfers = broken
    pages.pages["a2"] = page(8, 1.2, 4000)
    await scraper.scrape_once()  # logged, not raised; the load is still read
    assert scraper.get("wa").running == 1.0
    await scraper.stop()


def test_weighted_observation_equals_repeated_ones() -> None:
    prior = LinearEstimate(overhead_s=0.005, tokens_per_s=200_000.0)
    once, repeated = OnlineLinearFit(prior, halflife_observations=10), OnlineLinearFit(prior, halflife_observations=10)
    for tokens, seconds, n in ((1000, 0.02, 3), (4000, 0.05, 5), (200, 0.01, 1), (8000, 0.09, 4)):
        once.observe(tokens, seconds, weight=n)
        for _ in range(n):
            repeated.observe(tokens, seconds)
    a, b = once.estimate(), repeated.estimate()
    assert a.overhead_s == pytest.approx(b.overhead_s) and a.tokens_per_s == pytest.approx(b.tokens_per_s)
    assert once.observations == 4
    once.observe(100, 0.01, weight=0)
    once.observe(float("inf"), 0.01)
    assert once.observations == 4


def test_observe_transfers_counts_requests_not_handles() -> None:
    decider = DisaggDecider(DisaggDecisionSettings())
    assert decider.estimates().transfer == decider.transfer.prior and decider.estimates().transfer_observations == 0
    # TP 4 on the decode side: 8 handles are 2 requests of 3000 tokens, each waiting the mean handle time
    for transfers, seconds, tokens in ((8, 8 * 0.0085, 2 * 3000), (4, 4 * 0.021, 8000), (12, 12 * 0.0035, 3 * 1000)):
        decider.observe_transfers(transfers=transfers, seconds=seconds, tokens=tokens, handles_per_request=4)
    fitted = decider.estimates().transfer
    assert fitted.overhead_s == pytest.approx(0.001) and fitted.tokens_per_s == pytest.approx(400_000.0)
    decider.observe_transfers(transfers=0, seconds=0.0, tokens=100)  # nothing to learn from
    assert decider.estimates().transfer_observations == 3


async def test_router_feeds_scraped_transfers_to_the_decider() -> None:
    pages = Pages()
    client = httpx.AsyncClient(transport=httpx.MockTransport(pages.handler))
    router = KVRouter(KVRoutingSettings.model_validate({"enabled": True}), http_client=client)
    decode = worker("d", role=WorkerRole.DECODE).model_copy(update={"tensor_parallel_size": 2})
    router.sync(WorkerPool.of([decode]))
    pages.pages[httpx.URL(decode.server_url).host] = page(0, 0.0, 0)
    await router.scraper.scrape_once()
    pages.pages[httpx.URL(decode.server_url).host] = page(4, 0.04, 2000)  # 2 requests of 1000 tokens, 10 ms each
    await router.scraper.scrape_once()
    fit = router.decider.transfer
    assert fit.observations == 1
    assert fit.estimate().seconds(1000) == pytest.approx(0.01)
    await router.stop()
    await client.aclose()


async def test_a_simulated_cluster_moves_the_transfer_fit_off_its_prior() -> None:
    engine = EngineSettings.model_validate({"num_gpu_blocks": 2048, "max_model_len": 4096, "block_size": 16})
    settings = SimSettings(engine=engine).with_speedup(200.0)
    async with SimCluster(settings=settings, name="xfer") as cluster, httpx.AsyncClient(timeout=20) as client:
        prefill, decode = await cluster.start(prefill=1, decode=1)
        router = KVRouter(KVRoutingSettings.model_validate({"enabled": True, "seed": 0}), http_client=client)
        assert prefill.config is not None and decode.config is not None and decode.engine is not None
        engine_stats = decode.engine.stats
        router.sync(WorkerPool.of([prefill.config, decode.config]))
        await router.scraper.scrape_once()  # the baselines
        sizes = (30, 120, 300, 600, 1000)
        for i, words in enumerate(sizes):
            request = {
                "model": "sim-model",
                "messages": [{"role": "user", "content": f"question {i}: " + "tell me more " * (words // 3)}],
                "max_tokens": 2,
            }
            headers = {"X-Request-Id": f"xfer-{i}"}
            body = build_prefill_body(Endpoint.CHAT, "sim-model", request)
            first = await client.post(f"{prefill.base_url}/chat/completions", json=body, headers=headers)
            params = KVTransferParams.model_validate(first.json()["kv_transfer_params"])
            second = await client.post(
                f"{decode.base_url}/chat/completions",
                json={**request, "kv_transfer_params": params.for_decode()},
                headers=headers,
            )
            assert second.status_code == 200, second.text
            await router.scraper.scrape_once()
        await router.stop()

    assert engine_stats.nixl_transfers == len(sizes)
    estimates = router.decider.estimates()
    assert estimates.transfer_observations == len(sizes)
    assert estimates.transfer != router.decider.transfer.prior
    # the simulator's transfer model (latency + tokens x bytes per token / bandwidth), in wall seconds: the simulated
    # time divided by the speed-up, as prefill times are measured
    timing = settings.timing
    assert estimates.transfer.overhead_s == pytest.approx(timing.kv_transfer_latency_s / timing.speedup, rel=0.01)
    rate = timing.kv_transfer_bytes_per_s / timing.kv_bytes_per_token * timing.speedup
    assert estimates.transfer.tokens_per_s == pytest.approx(rate, rel=0.01)
    assert estimates.prefill == router.decider.prefill.prior  # untouched: only the orchestrator observes prefills

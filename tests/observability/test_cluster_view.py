"""What ``top`` reads, frame by frame, from workers' and the proxy's ``/metrics`` pages (served by a mock transport):
gauges as they are, rates and hit ratios since the previous frame, latency percentiles from histogram buckets, the
planner only while one runs."""

from __future__ import annotations

import httpx
import pytest

from litellm_disagg.observability.cluster_view import ClusterWatcher, ProxyMetricNames, quantiles
from litellm_disagg.runtime_config import RuntimeConfig, VllmNixlTransfer, WorkerState

L = '{engine="0",model_name="m"}'


def worker(worker_id: str, role: str, port: int) -> RuntimeConfig:
    return RuntimeConfig(worker_id=worker_id, model="m", role=role, base_url=f"http://w{port}:{port}/v1",
                         transfer=VllmNixlTransfer(host="127.0.0.1", port=port + 1), kv_capacity_blocks=100,
                         block_size=16, state=WorkerState.READY)


def engine_page(finished: float, queries: float, hits: float) -> str:
    return "\n".join([
        "# HELP vllm:num_requests_running running", f"vllm:num_requests_running{L} 2",
        f"vllm:num_requests_waiting{L} 1",
        f'vllm:request_success_total{{engine="0",finished_reason="stop",model_name="m"}} {finished - 5}',
        'vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 5',
        f"vllm:kv_cache_usage_perc{L} 0.25",
        f"vllm:prefix_cache_queries_total{L} {queries}", f"vllm:prefix_cache_hits_total{L} {hits}", "",
    ])


def proxy_page(requests: float, ttft: dict[str, float], planner: bool) -> str:
    lines = [f'litellm_disagg_requests_total{{mode="disaggregated",model="m"}} {requests}']
    lines += [f'litellm_disagg_time_to_first_token_seconds_bucket{{le="{le}",mode="disaggregated",model="m"}} {n}'
              for le, n in ttft.items()]
    lines += [f"litellm_disagg_planner_enabled {1 if planner else 0}",
              'litellm_disagg_planner_desired_workers{model="m",role="prefill"} ' + ("3" if planner else "NaN")]
    return "\n".join(lines) + "\n"


class Pages:
    def __init__(self):
        self.pages: dict[str, str] = {}
        self.auth: dict[str, str | None] = {}

    def handler(self, request: httpx.Request) -> httpx.Response:
        url = str(request.url)
        self.auth[url] = request.headers.get("authorization")
        if url not in self.pages and url + "/" in self.pages:  # as LiteLLM's /metrics does
            return httpx.Response(307, headers={"location": url + "/"})
        return httpx.Response(200, text=self.pages[url]) if url in self.pages else httpx.Response(503)


class StaticRegistry:
    def __init__(self, configs):
        self.configs = configs

    async def snapshot(self):
        return list(self.configs)


async def test_frames_read_gauges_rates_hit_ratios_and_latency_percentiles():
    d, p = worker("d1", "decode", 8001), worker("p1", "prefill", 8002)
    pages = Pages()
    pages.pages[f"{d.server_url}/metrics"] = engine_page(finished=15, queries=1000, hits=250)
    proxy_url = "http://proxy:4000/metrics"
    pages.pages[proxy_url + "/"] = proxy_page(10, {"0.1": 50, "0.5": 90, "1.0": 100, "+Inf": 100}, planner=False)
    async with httpx.AsyncClient(transport=httpx.MockTransport(pages.handler)) as client:
        watcher = ClusterWatcher(StaticRegistry([p, d]), client, metrics_url=proxy_url, metrics_key="sk-1")
        first = await watcher.sample()
        assert pages.auth[proxy_url + "/"] == "Bearer sk-1" and pages.auth[f"{d.server_url}/metrics"] is None
        by_id = {w.config.worker_id: w for w in first.workers}
        assert [w.config.worker_id for w in first.workers] == ["d1", "p1"]  # by model, role, id
        assert not by_id["p1"].reachable  # its page answers 503
        dw = by_id["d1"]
        assert (dw.running, dw.waiting, dw.finished, dw.kv_usage) == (2, 1, 15, 0.25)
        assert dw.prefix_hit_rate == 0.25 and dw.finished_per_s is None  # since start; no rate yet
        assert first.proxy.request_rate is None and first.proxy.planner is None
        assert first.proxy.ttft == pytest.approx({0.5: 0.1, 0.95: 0.75, 0.99: 0.95})
        assert first.proxy.itl == {}

        pages.pages[f"{d.server_url}/metrics"] = engine_page(finished=25, queries=1400, hits=550)
        pages.pages[proxy_url + "/"] = proxy_page(30, {"0.1": 50, "0.5": 90, "1.0": 110, "+Inf": 110}, planner=True)
        second = await watcher.sample()
    dw = next(w for w in second.workers if w.config.worker_id == "d1")
    assert dw.prefix_hit_rate == 0.75  # (550 - 250) / (1400 - 1000): since the previous frame
    assert dw.finished == 25 and dw.finished_per_s > 0
    assert second.proxy.request_rate > 0
    assert second.proxy.ttft == pytest.approx({0.5: 0.75, 0.95: 0.975, 0.99: 0.995})  # only the 10 new ones
    assert second.proxy.planner == ("wants m prefill: 3",)


async def test_an_unreachable_proxy_and_failing_discovery_are_shown_not_raised():
    class Down:
        async def snapshot(self):
            raise ConnectionError("consul unreachable")

    async with httpx.AsyncClient(transport=httpx.MockTransport(lambda r: httpx.Response(503))) as client:
        view = await ClusterWatcher(Down(), client, metrics_url="http://proxy:4000/metrics").sample()
    assert view.workers == () and "consul unreachable" in view.discovery_error
    assert view.proxy is not None and not view.proxy.reachable


def test_quantiles_of_an_empty_or_overflowing_histogram():
    assert quantiles({}) == {} and quantiles({1.0: 0, float("inf"): 0}) == {}
    assert quantiles({1.0: 0, float("inf"): 4}) == {0.5: 1.0, 0.95: 1.0, 0.99: 1.0}  # beyond the last bound


def test_the_names_top_reads_are_the_ones_the_plugin_exports():
    metrics = pytest.importorskip("litellm_disagg.observability.metrics")
    names = ProxyMetricNames()
    assert metrics.REQUESTS.describe()[0].name + "_total" == names.requests
    assert metrics.TTFT.describe()[0].name == names.ttft and metrics.ITL.describe()[0].name == names.itl
    assert metrics.PLANNER_ENABLED.describe()[0].name == names.planner_enabled
    assert metrics.PLANNER_DESIRED_WORKERS.describe()[0].name == names.planner_desired
    assert metrics.PLANNER_DECISIONS.describe()[0].name + "_total" == names.planner_decisions

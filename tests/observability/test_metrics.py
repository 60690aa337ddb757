"""The metrics module and its recorders, as units: the table names every metric, per-request timings by mode, causes
and reasons from bounded sets, pool gauges that follow discovery, and where the metrics are served."""

from __future__ import annotations

import math
import re
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client import REGISTRY, Counter, Gauge, Histogram

from litellm_disagg.observability import metrics as m
from litellm_disagg.observability.pool_metrics import PoolMetrics
from litellm_disagg.observability.requests import RequestMetrics, failover_cause, local_reason_label, mode_of
from litellm_disagg.observability.serve import MetricsSettings, metrics_endpoints, serve
from litellm_disagg.routing.orchestrator import Mode, Outcome
from litellm_disagg.routing.pool import WorkerPool
from litellm_disagg.routing.route_plan import NOT_SPLITTABLE, ONLY_ITSELF, RoutePlan
from litellm_disagg.runtime_config import RuntimeConfig
from litellm_disagg.transfer.prefill import PrefillUnavailable
from litellm_disagg.workers.wrapper import free_port

from ..test_runtime_config import VALID

ROOT = Path(__file__).resolve().parents[2]


def w(worker_id: str, role: str = "decode", state: str = "ready", model: str = "obs-model") -> RuntimeConfig:
    return RuntimeConfig.model_validate(VALID | {"worker_id": worker_id, "role": role, "state": state, "model": model})


def value(name: str, **labels: str) -> float:
    found = REGISTRY.get_sample_value(name, labels)
    return 0.0 if found is None else found


def defined() -> dict[str, str]:
    """Exposed name -> type of every metric object in the module."""
    out = {}
    for obj in vars(m).values():
        if isinstance(obj, (Counter, Gauge, Histogram)):
            family = obj.describe()[0]
            name = family.name + ("_total" if family.type == "counter" else "")
            out[name] = family.type
    return out


def test_the_docstring_table_lists_every_metric_with_its_type():
    rows = {}
    for line in (m.__doc__ or "").splitlines():
        found = re.match(r"^(litellm_disagg_\w+)\s+(counter|gauge|histogram)\s", line)
        if found:
            rows[found.group(1)] = found.group(2)
    assert rows == defined()


def test_every_metric_is_named_by_convention():
    for name, kind in defined().items():
        assert name.startswith("litellm_disagg_")
        assert name.endswith("_total") == (kind == "counter"), name
        if kind == "histogram":
            assert name.endswith(("_seconds", "_tokens")), name  # a histogram names its unit


def plan(decode: RuntimeConfig, prefill: RuntimeConfig | None, local_reason: str | None = None) -> RoutePlan:
    return RoutePlan(decode, (prefill,) if prefill else (), local_reason, local_reason or "remote")


def test_a_streamed_request_records_ttft_itl_and_duration_by_mode():
    clock = [100.0]
    requests = RequestMetrics(clock=lambda: clock[0])
    decode, prefill = w("obs-d1"), w("obs-p1", "prefill")
    labels = {"model": "obs-model", "mode": "disaggregated"}
    before = {
        name: value(name, **labels)
        for name in (
            "litellm_disagg_time_to_first_token_seconds_count",
            "litellm_disagg_inter_token_latency_seconds_count",
            "litellm_disagg_request_duration_seconds_sum",
        )
    }
    routed_before = value("litellm_disagg_routed_total", model="obs-model", role="prefill", worker="obs-p1")
    outcome = Outcome(Mode.DISAGGREGATED, decode, "obs-p1", prefill_seconds=0.2)
    clock[0] = 100.3
    requests.routed("call-1", plan(decode, prefill), outcome, started=100.0, selection_s=0.001)
    for t in (100.5, 100.52, 100.55):
        clock[0] = t
        requests.chunk("call-1", last=t == 100.55)
    assert len(requests) == 0  # the last chunk ended it; LiteLLM's success event then finds nothing
    requests.finished("call-1")
    assert value("litellm_disagg_time_to_first_token_seconds_count", **labels) == before[
        "litellm_disagg_time_to_first_token_seconds_count"] + 1
    assert value("litellm_disagg_inter_token_latency_seconds_count", **labels) == before[
        "litellm_disagg_inter_token_latency_seconds_count"] + 2
    assert value("litellm_disagg_request_duration_seconds_sum", **labels) == pytest.approx(
        before["litellm_disagg_request_duration_seconds_sum"] + 0.55)
    assert value("litellm_disagg_routed_total", model="obs-model", role="prefill", worker="obs-p1") == routed_before + 1


def test_a_retry_keeps_its_first_start_and_a_failure_counts_by_cause():
    clock = [10.0]
    requests = RequestMetrics(clock=lambda: clock[0])
    decode = w("obs-d2")
    local = plan(decode, None, NOT_SPLITTABLE)
    outcome = Outcome(Mode.AGGREGATED, decode, reason=NOT_SPLITTABLE)
    before = value("litellm_disagg_request_failures_total", model="obs-model", mode="local_prefill", cause="worker")
    requests.routed("call-2", local, outcome, started=10.0, selection_s=0.0)
    requests.routed("call-2", local, outcome, started=12.0, selection_s=0.0)
    requests.finished("call-2", failed=True, worker_fault=True)
    after = value("litellm_disagg_request_failures_total", model="obs-model", mode="local_prefill", cause="worker")
    assert after == before + 1 and len(requests) == 0


def test_entries_expire_so_a_lost_end_event_cannot_pin_memory():
    clock = [0.0]
    requests = RequestMetrics(max_age_s=10.0, clock=lambda: clock[0])
    decode = w("obs-d3")
    outcome = Outcome(Mode.AGGREGATED, decode)
    requests.routed("old", plan(decode, None), outcome, started=0.0, selection_s=0.0)
    clock[0] = 20.0
    requests.routed("new", plan(decode, None), outcome, started=20.0, selection_s=0.0)
    assert len(requests) == 1


def test_modes_reasons_and_causes_come_from_bounded_sets():
    decode, prefill = w("d"), w("p", "prefill")
    assert mode_of(plan(decode, prefill), Outcome(Mode.DISAGGREGATED, decode, "p")) == "disaggregated"
    assert mode_of(plan(decode, None, "mode never"), Outcome(Mode.AGGREGATED, decode)) == "local_prefill"
    assert mode_of(plan(decode, prefill), Outcome(Mode.AGGREGATED, decode)) == "aggregated"
    assert local_reason_label(NOT_SPLITTABLE) == "not_splittable"
    assert local_reason_label("mode never") == "mode_never"
    assert local_reason_label("override: 10 uncached tokens < 64") == "threshold"
    assert local_reason_label("local 1.0 ms <= remote 2.0 ms") == "cost_model"
    assert local_reason_label(ONLY_ITSELF) == "aggregated_worker"
    assert local_reason_label("anything else") == "other"

    def unavailable(message: str, cause: BaseException | None = None) -> PrefillUnavailable:
        exc = PrefillUnavailable(message, worker_id="p")
        exc.__cause__ = cause
        return exc

    assert failover_cause(unavailable("x", httpx.ReadTimeout("slow"))) == "timeout"
    assert failover_cause(unavailable("x", httpx.ConnectError("refused"))) == "connection"
    assert failover_cause(unavailable("prefill on p answered 429")) == "overloaded"
    assert failover_cause(unavailable("prefill on p answered 503")) == "server_error"
    assert failover_cause(unavailable("prefill on p: unusable response")) == "bad_response"
    assert {"disaggregated", "local_prefill", "aggregated"} == set(m.MODES)


def test_pool_gauges_follow_discovery_and_drop_departed_workers():
    pool_metrics = PoolMetrics()
    model = "obs-pool"
    pool_metrics.pool_changed(WorkerPool.of([w("op1", "prefill", model=model), w("od1", model=model),
                                             w("od2", state="draining", model=model)]))
    assert value("litellm_disagg_workers", model=model, role="decode", state="ready") == 1
    assert value("litellm_disagg_workers", model=model, role="decode", state="draining") == 1
    assert value("litellm_disagg_workers", model=model, role="prefill", state="starting") == 0  # present, as 0
    assert value("litellm_disagg_worker_state", model=model, role="decode", worker="od2", state="draining") == 1
    assert REGISTRY.get_sample_value("litellm_disagg_prefill_failovers_total",
                                     {"model": model, "worker": "op1", "cause": "timeout"}) == 0
    assert math.isnan(REGISTRY.get_sample_value("litellm_disagg_planner_desired_workers",
                                                {"model": model, "role": "prefill"}))

    pool_metrics.pool_changed(WorkerPool.of([w("od1", model=model), w("od2", model=model)]))
    assert value("litellm_disagg_workers", model=model, role="decode", state="ready") == 2
    assert REGISTRY.get_sample_value("litellm_disagg_worker_state",
                                     {"model": model, "role": "decode", "worker": "od2", "state": "draining"}) is None
    assert REGISTRY.get_sample_value("litellm_disagg_prefill_failovers_total",
                                     {"model": model, "worker": "op1", "cause": "timeout"}) is None


def test_the_shipped_proxy_config_serves_metrics_on_the_proxy_with_the_key():
    config = yaml.safe_load((ROOT / "proxy_config.yaml").read_text())
    [endpoint] = metrics_endpoints(config, "http://127.0.0.1:4000")
    assert endpoint.url == "http://127.0.0.1:4000/metrics/" and endpoint.needs_key
    assert "Bearer sk-x" in endpoint.curl("sk-x")
    config["litellm_disagg"]["metrics"] = {"port": 9464}
    assert [e.url for e in metrics_endpoints(config, "http://h:1")][1] == "http://127.0.0.1:9464/metrics"


def test_the_metrics_port_serves_the_default_registry():
    server = serve(MetricsSettings(port=free_port()))
    assert server is not None
    try:
        text = httpx.get(server.url, timeout=10).text
        assert "litellm_disagg_build_info" in text and "litellm_disagg_requests_total" in text
    finally:
        server.close()
    assert serve(MetricsSettings()) is None


def test_up_prints_where_the_metrics_are():
    from litellm_disagg.stack import _banner, _metrics_line

    line = _metrics_line(ROOT / "proxy_config.yaml", "http://127.0.0.1:4000", "sk-x")
    assert line == 'curl -H "Authorization: Bearer sk-x" http://127.0.0.1:4000/metrics/'
    assert line in _banner("http://127.0.0.1:4000", "sk-x", "m", "/tmp/r", line)


def test_transfer_samples_count_transfers_seconds_tokens_and_bytes():
    from litellm_disagg.routing.kv.load_scraper import TransferDeltas, TransferTotals

    deltas = TransferDeltas()
    assert deltas.update("obs-t", TransferTotals(1, 0.1, 100, bytes=1000.0), now=0.0) is None  # the baseline
    sample = deltas.update("obs-t", TransferTotals(3, 0.4, 300, bytes=5000.0), now=1.0)
    assert sample is not None and (sample.worker_id, sample.transfers, sample.tokens, sample.bytes) == ("obs-t", 2, 200, 4000)
    assert sample.seconds == pytest.approx(0.3)
    pool_metrics = PoolMetrics()
    pool_metrics.pool_changed(WorkerPool.of([w("obs-t")]))
    before = value("litellm_disagg_kv_transfer_bytes_total", model="obs-model", worker="obs-t")
    pool_metrics.also_count_transfers(None)(sample)
    assert value("litellm_disagg_kv_transfer_bytes_total", model="obs-model", worker="obs-t") == before + 4000.0
    assert value("litellm_disagg_kv_transfers_total", model="obs-model", worker="obs-t") >= 2


def test_the_decisions_cost_estimates_are_recorded_per_request():
    requests = RequestMetrics(clock=lambda: 1.0)
    decode = w("obs-cost-d1")
    labels = {"model": "obs-model"}
    before = {o: value("litellm_disagg_prefill_cost_estimate_seconds_count", option=o, **labels) for o in ("remote", "local")}
    chosen = RoutePlan(decode, (), "local 1.0 ms <= remote 9.0 ms", "local 1.0 ms <= remote 9.0 ms",
                       remote_cost_s=0.009, local_cost_s=0.001)
    requests.routed("cost-call", chosen, Outcome(Mode.AGGREGATED, decode), started=1.0, selection_s=0.0)
    for option in ("remote", "local"):
        assert value("litellm_disagg_prefill_cost_estimate_seconds_count", option=option, **labels) == before[option] + 1
    requests.routed("no-cost-call", plan(decode, None, "mode never"), Outcome(Mode.AGGREGATED, decode), started=1.0,
                    selection_s=0.0)  # no estimate (mode never, KV routing off): nothing observed
    assert value("litellm_disagg_prefill_cost_estimate_seconds_count", option="local", **labels) == before["local"] + 1


def test_the_backlogs_the_decision_priced_are_recorded_per_request():
    from litellm_disagg.routing.kv.disagg_decision import DisaggInputs

    requests = RequestMetrics(clock=lambda: 1.0)
    decode = w("obs-backlog-d1")
    labels = {"model": "obs-model"}

    def sums() -> dict[str, float]:
        return {o: value("litellm_disagg_prefill_backlog_tokens_sum", option=o, **labels) for o in ("remote", "local")}

    def counts() -> dict[str, float]:
        return {o: value("litellm_disagg_prefill_backlog_tokens_count", option=o, **labels) for o in ("remote", "local")}

    before_sum, before_n = sums(), counts()
    inputs = DisaggInputs(prompt_tokens=900, prefill_queued_tokens=3000, decode_queued_tokens=700)
    priced = RoutePlan(decode, (), "local 1.0 ms <= remote 9.0 ms", "local 1.0 ms <= remote 9.0 ms",
                       remote_cost_s=0.009, local_cost_s=0.001, decision_inputs=inputs)
    requests.routed("backlog-call", priced, Outcome(Mode.AGGREGATED, decode), started=1.0, selection_s=0.0)
    assert sums() == {"remote": before_sum["remote"] + 3000, "local": before_sum["local"] + 700}
    assert counts() == {"remote": before_n["remote"] + 1, "local": before_n["local"] + 1}
    # Not priced by the cost model (an override, mode never): no backlog observed.
    unpriced = RoutePlan(decode, (), "override", "override", decision_inputs=inputs)
    requests.routed("override-call", unpriced, Outcome(Mode.AGGREGATED, decode), started=1.0, selection_s=0.0)
    assert counts() == {"remote": before_n["remote"] + 1, "local": before_n["local"] + 1}


def test_the_prefill_progress_line_is_a_cost_model_phase():
    from litellm_disagg.routing.accounting import FlightKey
    from litellm_disagg.routing.cooldown import FailureCooldown
    from litellm_disagg.routing.kv.router import KVRouter
    from litellm_disagg.routing.kv.settings import KVRoutingSettings

    now = [0.0]
    kv = KVRouter(KVRoutingSettings.model_validate({"enabled": True}), clock=lambda: now[0])
    assert kv.progress is not None
    for i, tokens in enumerate((500, 1000, 2000, 4000)):  # varied sizes: 5,000 tokens/s, 50 ms of overhead
        key = FlightKey.decode(f"obs-progress-{i}")
        now[0] = 10.0 * i
        kv.accounting.start(key, "w", prefill_tokens=tokens)
        now[0] += 0.05 + tokens / 5000
        kv.accounting.prefill_done(key)
    PoolMetrics().refresh(kv.accounting, FailureCooldown(), kv)
    assert value("litellm_disagg_cost_model_tokens_per_second", phase="progress") == pytest.approx(5000, rel=0.01)
    assert value("litellm_disagg_cost_model_overhead_seconds", phase="progress") == pytest.approx(0.05, abs=0.001)

"""bench.serving.engine_traces: vLLM's per-request OpenTelemetry spans received over OTLP/HTTP and turned into the
request traces ``breakdown.py`` joins with the client's timings.

The spans are sent by OpenTelemetry's own OTLP/HTTP exporter (the one vLLM uses with
``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf``) with the attributes vLLM's output processor sets."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind

from bench.serving import breakdown, engine_traces
from bench.serving.engine_traces import EngineSpan, SpanCollector
from bench.serving.loadgen import RequestResult
from bench.serving.report import percentile
from bench.serving.trace_source import TraceSource
from bench.serving.workers import vllm_worker_argvs


@pytest.fixture
def collector():
    c = SpanCollector()
    yield c
    c.close()


def export(endpoint: str, request_id: str, *, start_wall: float, ttft: float, queue: float, prefill: float,
           e2e: float, name: str = "llm_request", prompt_tokens: int = 321) -> None:
    """One span as vLLM's ``OutputProcessor.do_tracing`` makes it, sent as vLLM's exporter sends it."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    attributes = {"gen_ai.latency.time_to_first_token": ttft, "gen_ai.latency.e2e": e2e,
                  "gen_ai.latency.time_in_queue": queue, "gen_ai.usage.prompt_tokens": prompt_tokens,
                  "gen_ai.usage.completion_tokens": 8, "gen_ai.latency.time_in_model_prefill": prefill,
                  "gen_ai.latency.time_in_model_decode": e2e - ttft, "gen_ai.request.id": request_id}
    if name != "llm_request":
        del attributes["gen_ai.latency.time_in_queue"]
    with provider.get_tracer("vllm.llm_engine").start_as_current_span(
            name, kind=SpanKind.SERVER, start_time=int(start_wall * 1e9), attributes=attributes):
        pass
    provider.shutdown()


def test_a_vllm_span_exported_over_otlp_http_arrives_under_its_workers_path(collector):
    now = time.time()
    export(collector.endpoint("bench-prefill-0"), "chatcmpl-abc-123", start_wall=now, ttft=0.5, queue=0.1,
           prefill=0.3, e2e=0.9)
    export(collector.endpoint("bench-1"), "chatcmpl-other", start_wall=now, ttft=0.2, queue=0.0, prefill=0.2,
           e2e=0.2, name="not_a_request")  # another span name: ignored
    [span] = collector.settle(quiet_s=0.3)
    assert span == EngineSpan(worker_id="bench-prefill-0", request_id="chatcmpl-abc-123",
                              received_wall=pytest.approx(now, abs=1e-6), ttft_s=0.5, queue_s=0.1, prefill_s=0.3,
                              e2e_s=0.9, prompt_tokens=321)


def test_an_unreadable_export_is_refused_and_nothing_is_kept(collector):
    r = httpx.post(collector.endpoint("w"), content=b"\xff\xff not protobuf",
                   headers={"Content-Type": "application/x-protobuf"})
    assert r.status_code == 400 and collector.count() == 0


def span(worker: str, request_id: str, received: float, *, ttft: float, queue: float, prefill: float,
         e2e: float) -> EngineSpan:
    return EngineSpan(worker, request_id, received, ttft, queue, prefill, e2e, 100)


def test_spans_become_traces_on_the_monotonic_clock_and_a_decode_half_is_marked_as_pulling():
    offset = 1000.0  # wall = monotonic + 1000
    spans = [span("p", "chatcmpl-x", 1001.0, ttft=0.30, queue=0.05, prefill=0.20, e2e=0.30),
             span("d", "chatcmpl-x", 1001.4, ttft=0.15, queue=0.02, prefill=0.10, e2e=0.40),
             span("d", "chatcmpl-y", 1002.0, ttft=0.10, queue=0.00, prefill=0.08, e2e=0.20)]
    p, d, alone = engine_traces.traces(spans, {"p": "prefill", "d": "decode"}, offset)
    assert (p.received, p.arrived, p.scheduled, p.first_token, p.finished) == pytest.approx(
        (1.0, 1.05, 1.10, 1.30, 1.30))
    assert p.client_id == d.client_id == "x" and p.pull_started is None
    assert d.pull_started == pytest.approx(d.scheduled) and d.pull_ended is None
    assert alone.pull_started is None  # no prefill span of its id: served whole on the decode worker


def result(response_id: str, sent_at: float, ttft_s: float) -> RequestResult:
    return RequestResult("s", 0, "k", 0.0, ttft_s, 1.0, 0.02, 5, None, user="s#0", sent_at=sent_at,
                         response_id=response_id)


def test_the_breakdown_finds_vllm_requests_by_response_id_and_its_parts_add_up():
    offset = 1000.0
    spans = [span("p", "chatcmpl-x", 1001.01, ttft=0.30, queue=0.05, prefill=0.20, e2e=0.30),
             span("d", "chatcmpl-x", 1001.35, ttft=0.15, queue=0.02, prefill=0.10, e2e=0.40),
             span("b", "chatcmpl-z", 1003.02, ttft=0.20, queue=0.04, prefill=0.15, e2e=0.50)]
    traces = engine_traces.traces(spans, {"p": "prefill", "d": "decode", "b": "both"}, offset)
    remote, local = breakdown.join([result("chatcmpl-x", 1.0, 0.52), result("chatcmpl-z", 3.0, 0.23),
                                    result("chatcmpl-unseen", 5.0, 0.1)], traces)
    assert remote.prefill_worker == "p" and remote.worker == "d"
    assert remote.parts_ms == pytest.approx({"proxy_in": 10, "frontend": 50, "queue": 50, "prefill": 200,
                                             "handoff": 40, "admit": 50, "decode_first": 100, "proxy_out": 20})
    assert "transfer" not in remote.parts_ms  # vLLM's span does not time the pull
    assert sum(remote.parts_ms.values()) == pytest.approx(remote.ttft_ms)
    assert local.prefill_worker is None
    assert local.parts_ms == pytest.approx({"proxy_in": 20, "frontend": 10, "queue": 40, "prefill": 150,
                                            "proxy_out": 10})
    assert breakdown.medians([remote, local])["frontend"] == pytest.approx(percentile([50, 10], 0.5))
    mean = breakdown.means([remote, local])  # a part a request lacks counts 0 there: the means add up to TTFT's
    assert mean["ttft"] == pytest.approx((520 + 230) / 2) and mean["handoff"] == pytest.approx(20)
    assert sum(v for k, v in mean.items() if k != "ttft") == pytest.approx(mean["ttft"])


def test_the_trace_source_reads_only_the_spans_after_its_mark(collector):
    now = time.time()
    export(collector.endpoint("w"), "chatcmpl-before", start_wall=now, ttft=0.1, queue=0.0, prefill=0.1, e2e=0.1)
    collector.settle(quiet_s=0.3)
    source = TraceSource(spans=collector, roles={"w": "both"})
    mark = source.mark()
    export(collector.endpoint("w"), "chatcmpl-after", start_wall=now, ttft=0.1, queue=0.0, prefill=0.1, e2e=0.1)
    assert [t.client_id for t in source.since(mark)] == ["after"]


def test_worker_argvs_name_vllms_trace_endpoint_per_worker(tmp_path):
    argvs = vllm_worker_argvs(tmp_path, count=2, model_dir="/m", served="s", kv_cache_mib=64, max_model_len=512,
                              roles=["prefill", "decode"], otlp_endpoint=lambda w: f"http://h/{w}/v1/traces")
    for argv, worker in zip(argvs, ["bench-prefill-0", "bench-decode-1"], strict=True):
        assert argv[argv.index("--") + 1:] == ["--otlp-traces-endpoint", f"http://h/{worker}/v1/traces"]
    assert "--" not in vllm_worker_argvs(tmp_path, count=1, model_dir="/m", served="s", kv_cache_mib=64,
                                         max_model_len=512)[0]


def test_the_breakdown_plot_stacks_the_saved_means_and_skips_rows_without_them(tmp_path):
    from bench.serving import breakdown_plot

    run = tmp_path / "pd.json"
    run.write_text(json.dumps({"meta": {}, "runs": [
        {"arm": "pd_kv_precise", "run": 1, "ttft_parts_mean_ms": {"ttft": 30.0, "proxy_in": 10.0, "prefill": 20.0}},
        {"arm": "pd_least_inflight", "run": 1, "ttft_parts_mean_ms": {}},  # --no-engine-traces
    ]}))
    assert breakdown_plot.rows_of(run) == [("kv_precise\nrun 1", {"ttft": 30.0, "proxy_in": 10.0, "prefill": 20.0})]
    breakdown_plot.main([str(run), "--out", str(tmp_path / "b.png")])
    assert (tmp_path / "b.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"arms": [{"arm": "kv_aware"}]}))  # bench.serving's JSON, no means saved
    with pytest.raises(SystemExit):
        breakdown_plot.main([str(empty), "--out", str(tmp_path / "c.png")])

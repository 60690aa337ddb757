"""RequestTracing's bookkeeping without a router: failures, retries and calls whose end never comes."""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from litellm_disagg.observability.tracing import RequestTracing
from litellm_disagg.routing.route_plan import RoutePlan
from litellm_disagg.runtime_config import RuntimeConfig, VllmNixlTransfer, WorkerState

P = "litellm_disagg."


def tracing() -> tuple[RequestTracing, InMemorySpanExporter]:
    provider = TracerProvider()
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    return RequestTracing(provider.get_tracer("test"), max_open_s=1.0), memory


def plan() -> RoutePlan:
    decode = RuntimeConfig(worker_id="d1", model="m", role="decode", base_url="http://d1:8000/v1",
                           transfer=VllmNixlTransfer(host="d1", port=5600), kv_capacity_blocks=10, block_size=16,
                           state=WorkerState.READY)
    return RoutePlan(decode, (), "prefills locally", "prefills locally")


def by_name(memory: InMemorySpanExporter) -> dict[str, object]:
    return {s.name.removeprefix(P): s for s in memory.get_finished_spans()}


def test_a_phase_that_raises_ends_the_attempt_in_error_with_the_exception():
    t, memory = tracing()
    slot = t.slot("call-1", None)
    t.route_started(slot, "req-1")
    t.failed(slot, RuntimeError("no decode worker"))
    spans = by_name(memory)
    assert set(spans) == {"request", "route"} and t.open_traces() == 0
    assert spans["route"].status.status_code is StatusCode.ERROR
    assert spans["request"].status.status_code is StatusCode.ERROR
    assert [e.name for e in spans["route"].events] == ["exception"]


def test_a_group_that_is_not_ours_leaves_no_trace():
    t, memory = tracing()
    slot = t.slot("call-1", None)  # the strategy handed the call to LiteLLM's own selection: no route phase
    t.routed(slot)
    assert t.open_traces() == 0 and memory.get_finished_spans() == ()


def test_a_retry_closes_the_earlier_attempt_and_a_failed_call_ends_in_error():
    from litellm_disagg.routing.orchestrator import Mode, Outcome

    t, memory = tracing()
    first = t.slot("call-1", None)
    t.route_started(first, "req-1")
    t.route_done(first, plan())
    t.prefill_done(first, Outcome(Mode.AGGREGATED, plan().decode, reason="prefills locally"), plan())
    t.routed(first)
    assert t.open_traces() == 1
    second = t.slot("call-1", None)  # LiteLLM retries the same call
    assert [s.status.description for s in memory.get_finished_spans() if s.name == P + "request"] == ["retried"]
    t.route_started(second, "req-2")
    t.route_done(second, plan())
    t.prefill_done(second, Outcome(Mode.AGGREGATED, plan().decode, reason="prefills locally"), plan())
    t.routed(second)
    t.finished("call-1", error="APIConnectionError")
    decode = [s for s in memory.get_finished_spans() if s.name == P + "decode"]
    assert [s.status.status_code for s in decode] == [StatusCode.ERROR, StatusCode.ERROR]
    assert decode[1].attributes[P + "mode"] == "local_prefill" and t.open_traces() == 0
    t.finished("call-1")  # a late event for a call already ended: nothing

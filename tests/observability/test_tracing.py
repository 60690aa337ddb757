"""Traces per request phase, read with OpenTelemetry's in-memory exporter, through a real LiteLLM Router routing to
simulated workers: which spans, their parents (LiteLLM's proxy span, as the proxy passes it in the call's metadata),
their order in time, their attributes, and no prompt data in any of them."""

from __future__ import annotations

import asyncio
import os

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import litellm  # noqa: E402
from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from opentelemetry.trace import StatusCode  # noqa: E402

from litellm_disagg.discovery.file.registry import FileRegistry  # noqa: E402
from litellm_disagg.discovery.file.settings import FileRegistrySettings  # noqa: E402
from litellm_disagg.observability.traced import TracedRoutingStrategy  # noqa: E402
from litellm_disagg.plugin import DisaggPlugin  # noqa: E402
from litellm_disagg.routing.strategy import DisaggRoutingStrategy  # noqa: E402
from litellm_disagg.runtime_config import WorkerRole  # noqa: E402
from litellm_disagg.settings import DisaggSettings  # noqa: E402
from litellm_disagg.sim import SimCluster  # noqa: E402
from tests.sim.conftest import fast_settings  # noqa: E402

SECRET = "the-prompt-must-not-leak-into-spans"
MESSAGES = [{"role": "system", "content": "You are a simulated model. " * 8}, {"role": "user", "content": SECRET}]
P = "litellm_disagg."


@pytest.fixture(scope="module")
def exporter() -> InMemorySpanExporter:
    # The global provider, as LiteLLM's `callbacks: ["otel"]` sets it in the proxy (only once per process).
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    return memory


@pytest.fixture
def plugin() -> DisaggPlugin:
    return DisaggPlugin()  # outside the loop: inside one it would follow the proxy's router


class Traced:
    def __init__(self, plugin: DisaggPlugin, registry_dir, *, tracing: bool = True):
        self.plugin = plugin
        self.router = litellm.Router(model_list=[], num_retries=0)
        self.settings = DisaggSettings(
            registry=FileRegistrySettings(path=str(registry_dir), poll_interval_s=0.05),
            sync_interval_s=0.05,
            tracing={"enabled": tracing},
        )

    async def __aenter__(self) -> Traced:
        self.controller = await self.plugin.attach(self.router, self.settings)
        for _ in range(200):
            if self.controller.pool.decode_candidates("sim-model"):
                break
            await asyncio.sleep(0.02)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.plugin.detach()

    async def call(self, *, stream: bool, parent=None) -> str:
        data = {"model": "sim-model", "messages": MESSAGES, "max_tokens": 9, "stream": stream}
        if parent is not None:  # what the proxy puts there when LiteLLM's otel callback is on
            data["metadata"] = {"litellm_parent_otel_span": parent}
        await self.plugin.async_pre_call_hook(None, None, data, "acompletion")
        response = await self.router.acompletion(**data)
        if stream:
            return "".join([c.choices[0].delta.content or "" async for c in response])
        return response.choices[0].message.content


async def finished_spans(exporter: InMemorySpanExporter, names: set[str]) -> dict[str, ReadableSpan]:
    """Our spans by phase once every name in ``names`` has ended (LiteLLM's success event runs in the background)."""
    for _ in range(300):
        spans = {s.name.removeprefix(P): s for s in exporter.get_finished_spans() if s.name.startswith(P)}
        if names <= set(spans):
            return spans
        await asyncio.sleep(0.02)
    raise AssertionError(f"spans {sorted(names)} not all ended: {sorted(spans)}")


def assert_no_prompt(spans: dict[str, ReadableSpan]) -> None:
    for span in spans.values():
        for value in (span.attributes or {}).values():
            assert SECRET not in str(value) and "simulated model" not in str(value)


async def test_a_streamed_disaggregated_request_has_route_prefill_transfer_decode(tmp_path, plugin, exporter):
    exporter.clear()
    registry_dir = tmp_path / "registry"
    async with SimCluster(registry=FileRegistry(registry_dir), settings=fast_settings(), heartbeat_interval_s=0.2) as c:
        await c.start(prefill=1, decode=1)
        prefill = c.workers_with(WorkerRole.PREFILL)[0]
        decode = c.workers_with(WorkerRole.DECODE)[0]
        async with Traced(plugin, registry_dir) as stack:
            assert isinstance(stack.controller.strategy, TracedRoutingStrategy)
            proxy_span = trace.get_tracer("test").start_span("Received Proxy Server Request")
            assert await stack.call(stream=True, parent=proxy_span)
            proxy_span.end()
            spans = await finished_spans(exporter, {"request", "route", "prefill", "transfer", "decode"})
            assert stack.controller.tracing.open_traces() == 0

    request = spans["request"]
    assert request.parent is not None and request.parent.span_id == proxy_span.get_span_context().span_id
    assert {s.context.trace_id for s in spans.values()} == {proxy_span.get_span_context().trace_id}
    for phase in ("route", "prefill", "transfer", "decode"):
        assert spans[phase].parent.span_id == request.context.span_id
        assert spans[phase].status.status_code is not StatusCode.ERROR
    order = [spans[p] for p in ("route", "prefill", "transfer", "decode")]
    for before, after in zip(order, order[1:], strict=False):
        assert before.end_time <= after.start_time
    assert request.start_time <= order[0].start_time and order[-1].end_time <= request.end_time

    route = spans["route"].attributes
    assert route[P + "decode.worker_id"] == decode.worker_id and route[P + "decode.role"] == "decode"
    assert list(route[P + "prefill.candidates"]) == [prefill.worker_id]
    assert P + "local_prefill.reason" not in route
    pre = spans["prefill"].attributes
    assert pre[P + "mode"] == "disaggregated" and pre[P + "prefill.worker_id"] == prefill.worker_id
    assert pre[P + "prefill.role"] == "prefill"
    for phase in ("transfer", "decode"):
        attrs = spans[phase].attributes
        assert attrs[P + "prefill.worker_id"] == prefill.worker_id and attrs[P + "decode.worker_id"] == decode.worker_id
    assert request.attributes[P + "mode"] == "disaggregated"
    assert_no_prompt(spans)


async def test_a_call_that_does_not_stream_has_one_decode_span(tmp_path, plugin, exporter):
    exporter.clear()
    registry_dir = tmp_path / "registry"
    async with SimCluster(registry=FileRegistry(registry_dir), settings=fast_settings(), heartbeat_interval_s=0.2) as c:
        await c.start(prefill=1, decode=1)
        async with Traced(plugin, registry_dir) as stack:
            assert await stack.call(stream=False)
            spans = await finished_spans(exporter, {"request", "route", "prefill", "decode"})
    assert "transfer" not in spans
    assert spans["request"].parent is None  # no LiteLLM span to join: our request span is the root
    assert spans["decode"].attributes[P + "streamed"] is False
    assert spans["prefill"].end_time <= spans["decode"].start_time
    assert_no_prompt(spans)


async def test_without_a_prefill_worker_the_decode_span_holds_the_first_token(tmp_path, plugin, exporter):
    exporter.clear()
    registry_dir = tmp_path / "registry"
    async with SimCluster(registry=FileRegistry(registry_dir), settings=fast_settings(), heartbeat_interval_s=0.2) as c:
        [decode] = await c.start(decode=1)
        async with Traced(plugin, registry_dir) as stack:
            assert await stack.call(stream=True)
            spans = await finished_spans(exporter, {"request", "route", "prefill", "decode"})
    assert "transfer" not in spans
    assert spans["prefill"].attributes[P + "mode"] == "aggregated"
    assert spans["prefill"].attributes[P + "fallback.reason"]
    assert spans["decode"].attributes[P + "decode.worker_id"] == decode.worker_id
    assert [e.name for e in spans["decode"].events] == ["first_token"]


async def test_off_by_default_the_plain_strategy_routes(tmp_path, plugin, exporter):
    exporter.clear()
    assert DisaggSettings().tracing.enabled is False
    registry_dir = tmp_path / "registry"
    async with SimCluster(registry=FileRegistry(registry_dir), settings=fast_settings(), heartbeat_interval_s=0.2) as c:
        await c.start(prefill=1, decode=1)
        async with Traced(plugin, registry_dir, tracing=False) as stack:
            assert type(stack.controller.strategy) is DisaggRoutingStrategy and stack.controller.tracing is None
            assert await stack.call(stream=True)
    assert not [s for s in exporter.get_finished_spans() if s.name.startswith(P)]

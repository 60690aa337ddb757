"""Per-request timing of real vLLM workers, from vLLM's own OpenTelemetry spans, for ``breakdown.py``.

vLLM (``--otlp-traces-endpoint``) exports one ``llm_request`` span per finished request from its API server: the
span starts at the request's arrival there (wall clock) and carries, in seconds, ``gen_ai.latency.time_to_first_token``
(arrival to the first token, as the API server saw it), ``time_in_queue`` (the engine's queue: queued to first
scheduled), ``time_in_model_prefill`` (first scheduled to the first token), ``e2e`` and the prompt's token count,
with ``gen_ai.request.id`` the engine's request id (``chatcmpl-<X-Request-Id>``). ``SpanCollector`` is a small
OTLP/HTTP receiver (protobuf, one path per worker, so two spans of one request, a prefill and its decode, are told
apart) that turns each span into a ``RequestTrace`` on this host's ``time.monotonic()`` clock, the clock the load
generator times its requests on:

    received     the span's start: the API server got the request
    arrived      received + TTFT - queue - prefill: the engine core queued it (after the chat template,
                 tokenization, and the wait for the engine core to take it in between two steps: ``breakdown``'s
                 ``frontend``)
    scheduled    arrived + queue
    first_token  received + TTFT
    finished     received + e2e

A decode worker's half of a remote prefill: vLLM schedules it (allocates its blocks) and the NIXL pull starts, so
``pull_started`` is ``scheduled``; the span does not say when the pull ended (``pull_ended`` None), so the pull and
the first decode step stay one part. Which traces are such halves is only known once both spans are in
(``traces``: a decode-role trace with a prefill-role trace of the same request id).

Started in a daemon thread (the benchmark's phases each run their own event loop); nothing here is on the serving
path. The vLLM workers need ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf`` (``WORKER_ENV``).
"""

from __future__ import annotations

import dataclasses
import gzip
import logging
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from litellm_disagg.sim.request_log import RequestTrace

logger = logging.getLogger(__name__)

WORKER_ENV = {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf", "OTEL_BSP_SCHEDULE_DELAY": "200"}
"""A vLLM worker that exports to a ``SpanCollector``: OTLP over HTTP (the receiver speaks no gRPC), batches sent
every 200 ms (the SDK's default is 5 s)."""

SPAN_NAME = "llm_request"
_PATH_SUFFIX = "/v1/traces"


@dataclass(frozen=True)
class EngineSpan:
    """One ``llm_request`` span, as exported (seconds; ``received_wall`` on the wall clock)."""

    worker_id: str
    request_id: str
    received_wall: float
    ttft_s: float
    queue_s: float
    prefill_s: float
    e2e_s: float
    prompt_tokens: int


def client_id_of_response(response_id: str) -> str:
    """The request id inside an engine request id or a response's ``id`` (``chatcmpl-<id>`` / ``cmpl-<id>``)."""
    for prefix in ("chatcmpl-", "cmpl-"):
        if response_id.startswith(prefix):
            return response_id[len(prefix) :]
    return response_id


def parse_export(body: bytes, worker_id: str) -> list[EngineSpan]:
    """The ``llm_request`` spans of one OTLP ``ExportTraceServiceRequest`` (protobuf); a span that lacks a timing
    attribute is skipped."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    export = ExportTraceServiceRequest()
    export.ParseFromString(body)
    out = []
    for resource in export.resource_spans:
        for scope in resource.scope_spans:
            for span in scope.spans:
                if span.name != SPAN_NAME:
                    continue
                attrs: dict[str, float | int | str] = {}
                for kv in span.attributes:
                    kind = kv.value.WhichOneof("value")
                    if kind in ("double_value", "int_value", "string_value"):
                        attrs[kv.key] = getattr(kv.value, kind)
                try:
                    out.append(EngineSpan(
                        worker_id=worker_id, request_id=str(attrs["gen_ai.request.id"]),
                        received_wall=span.start_time_unix_nano / 1e9,
                        ttft_s=float(attrs["gen_ai.latency.time_to_first_token"]),
                        queue_s=float(attrs["gen_ai.latency.time_in_queue"]),
                        prefill_s=float(attrs["gen_ai.latency.time_in_model_prefill"]),
                        e2e_s=float(attrs["gen_ai.latency.e2e"]),
                        prompt_tokens=int(attrs.get("gen_ai.usage.prompt_tokens", 0))))
                except (KeyError, TypeError, ValueError):
                    logger.warning("%s: span %s lacks a timing attribute; skipped", worker_id, span.span_id.hex())
    return out


def wall_to_monotonic() -> float:
    """What to subtract from a ``time.time()`` reading to put it on ``time.monotonic()``'s clock (read now)."""
    before = time.monotonic()
    wall = time.time()
    after = time.monotonic()
    return wall - (before + after) / 2


def to_trace(span: EngineSpan, role: str, offset: float) -> RequestTrace:
    """``span`` as a ``RequestTrace`` on the monotonic clock (``offset``: ``wall_to_monotonic()``); no pull."""
    received = span.received_wall - offset
    arrived = received + max(0.0, span.ttft_s - span.queue_s - span.prefill_s)
    return RequestTrace(
        worker_id=span.worker_id, role=role, request_id=span.request_id, client_id=client_id_of_response(span.request_id),
        user=None, prompt_tokens=span.prompt_tokens, arrived=arrived, running_at_arrival=0, waiting_at_arrival=0,
        prefill_tokens_ahead=0, scheduled=arrived + span.queue_s, first_token=received + span.ttft_s,
        finished=received + span.e2e_s, received=received)


def traces(spans: Iterable[EngineSpan], roles: Mapping[str, str], offset: float) -> list[RequestTrace]:
    """Every span as a ``RequestTrace`` (``roles``: worker id to role, ``both`` if unnamed). A decode worker's
    trace of a request some prefill worker also traced is the second half of a remote prefill: its pull started when
    it was scheduled (``pull_started``), its end unknown."""
    out = [to_trace(s, roles.get(s.worker_id, "both"), offset) for s in spans]
    prefilled = {t.client_id for t in out if t.role == "prefill"}
    return [dataclasses.replace(t, pull_started=t.scheduled) if t.role == "decode" and t.client_id in prefilled
            else t for t in out]


class SpanCollector:
    """An OTLP/HTTP trace receiver on 127.0.0.1: worker ``W`` exports to ``endpoint(W)``."""

    def __init__(self) -> None:
        self._spans: list[EngineSpan] = []
        self._lock = threading.Lock()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                worker = self.path.removesuffix(_PATH_SUFFIX).strip("/")
                try:
                    spans = parse_export(body, worker)
                except Exception:  # noqa: BLE001 (a bad export is logged and answered 400)
                    logger.warning("%s: unreadable OTLP export", worker, exc_info=True)
                    self.send_response(400)
                    self.end_headers()
                    return
                with collector._lock:
                    collector._spans.extend(spans)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (http.server's name)
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="otlp-collector", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def endpoint(self, worker_id: str) -> str:
        return f"http://127.0.0.1:{self.port}/{worker_id}{_PATH_SUFFIX}"

    def spans(self) -> list[EngineSpan]:
        with self._lock:
            return list(self._spans)

    def count(self) -> int:
        with self._lock:
            return len(self._spans)

    def settle(self, *, quiet_s: float = 1.0, timeout_s: float = 15.0) -> list[EngineSpan]:
        """The spans, once none came in for ``quiet_s`` (the workers export every 200 ms) or ``timeout_s`` passed."""
        deadline = time.monotonic() + timeout_s
        seen, since = self.count(), time.monotonic()
        while time.monotonic() < deadline and time.monotonic() - since < quiet_s:
            time.sleep(0.1)
            if (now := self.count()) != seen:
                seen, since = now, time.monotonic()
        return self.spans()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

"""The HTTP surface of one simulated worker: the subset of vLLM's OpenAI server that the router and wrapper use.

    POST /v1/chat/completions, /v1/completions   OpenAI shapes, stream or not, usage, kv_transfer_params
    POST /tokenize, /detokenize                   vLLM's shapes
    GET  /health                                  200, or 503 while ``ServerState.healthy`` is False
    GET  /v1/models, /version, /metrics
    POST /reset_prefix_cache                      (vLLM's dev-mode endpoint, to reset caches between benchmark arms)
    POST /abort_request                           SGLang's: ``{"rid"}`` ends that request (always 200)
    GET  /prometheus/metrics                      the same page, where ``trtllm-serve`` serves it

The transfer fields of a generation request are read per ``settings.engine_name`` (``disagg_input``); a request
whose KV never arrives fails with 500 under SGLang and TensorRT-LLM (vLLM recomputes).

Errors are vLLM's JSON: ``{"error": {"message", "type", "param", "code"}}`` with 400 for bad input (invalid JSON,
wrong types, n != 1, a prompt that does not fit ``max_model_len``), 404 for an unknown model, 503 when the engine is
not running. ``X-Request-Id`` names the request (``chatcmpl-<id>`` / ``cmpl-<id>``) and is echoed back.

This module routes and handles (``SimApi``, one method per endpoint); ``api_input`` parses and validates what comes
in, ``api_output`` builds what goes out (SSE chunks, full responses).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from litellm_disagg.sim import tokenizer
from litellm_disagg.sim.api_input import (
    ApiError,
    budget,
    check_model,
    prepare,
    read_json,
    tokenize_text,
    validate,
)
from litellm_disagg.sim.api_output import collect_or_abort, full_response, sse_events
from litellm_disagg.sim.disagg_input import transfer_request
from litellm_disagg.sim.engine import EngineDead, SimEngine
from litellm_disagg.sim.metrics import CONTENT_TYPE, registry_for, render
from litellm_disagg.sim.protocol import DetokenizeRequest, TokenizeRequest
from litellm_disagg.sim.rejection import release_rejected
from litellm_disagg.sim.request import SimRequest
from litellm_disagg.version import __version__


@dataclass
class ServerState:
    healthy: bool = True


def build_app(engine: SimEngine, state: ServerState | None = None) -> Starlette:
    api = SimApi(engine, state or ServerState())
    app = Starlette(
        routes=[
            Route("/health", api.health, methods=["GET"]),
            Route("/v1/models", api.models, methods=["GET"]),
            Route("/version", api.version, methods=["GET"]),
            Route("/metrics", api.metrics, methods=["GET"]),
            Route("/prometheus/metrics", api.metrics, methods=["GET"]),
            Route("/abort_request", api.abort_request, methods=["POST"]),
            Route("/tokenize", api.tokenize, methods=["POST"]),
            Route("/detokenize", api.detokenize, methods=["POST"]),
            Route("/reset_prefix_cache", api.reset_prefix_cache, methods=["POST"]),
            Route("/v1/chat/completions", api.chat_completions, methods=["POST"]),
            Route("/v1/completions", api.completions, methods=["POST"]),
        ]
    )
    app.state.sim_engine = engine
    app.state.sim_state = api.state
    return app


class SimApi:
    """The endpoints of one simulated worker, over its engine."""

    def __init__(self, engine: SimEngine, state: ServerState):
        self.engine = engine
        self.state = state
        self.model = engine.settings.model
        self.max_model_len = engine.settings.engine.max_model_len
        self._metrics_registry = registry_for(engine)

    async def health(self, _: Request) -> Response:
        ok = self.state.healthy and self.engine.alive
        return Response(status_code=200 if ok else 503)

    async def models(self, _: Request) -> Response:
        card = {
            "id": self.model,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "vllm",
            "root": self.model,
            "parent": None,
            "max_model_len": self.max_model_len,
            "permission": [],
        }
        return JSONResponse({"object": "list", "data": [card]})

    async def version(self, _: Request) -> Response:
        return JSONResponse({"version": f"litellm-disagg-sim {__version__}"})

    async def metrics(self, _: Request) -> Response:
        return Response(render(self._metrics_registry), media_type=CONTENT_TYPE)

    async def reset_prefix_cache(self, _: Request) -> Response:
        if not self.engine.pool.reset_prefix_cache():
            return ApiError(400, "cannot reset the prefix cache while blocks are in use").response()
        self.engine.publish_pending_events()
        return Response(status_code=200)

    async def abort_request(self, request: Request) -> Response:
        try:
            body = await read_json(request)
        except ApiError as exc:
            return exc.response()
        rid = body.get("rid")
        if isinstance(rid, str):
            self.engine.abort_rid(rid)
        return Response(status_code=200)

    async def tokenize(self, request: Request) -> Response:
        try:
            body = validate(TokenizeRequest, await read_json(request))
            check_model(body.model, self.model)
            text = tokenize_text(body)
        except ApiError as exc:
            return exc.response()
        ids = tokenizer.encode(text)
        return JSONResponse({"count": len(ids), "max_model_len": self.max_model_len, "tokens": ids, "token_strs": None})

    async def detokenize(self, request: Request) -> Response:
        try:
            body = validate(DetokenizeRequest, await read_json(request))
            check_model(body.model, self.model)
            if not all(tokenizer.is_valid_token(t) for t in body.tokens):
                raise ApiError(400, "token id out of vocabulary")
        except ApiError as exc:
            return exc.response()
        return JSONResponse({"prompt": tokenizer.decode(body.tokens)})

    async def chat_completions(self, request: Request) -> Response:
        return await self._generate(request, chat=True)

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, chat=False)

    async def _generate(self, request: Request, *, chat: bool) -> Response:
        base_id = request.headers.get("x-request-id") or uuid.uuid4().hex
        headers = {"X-Request-Id": base_id}
        raw: Any = None
        try:
            raw = await read_json(request)
            prepared = prepare(raw, chat=chat, base_id=base_id, model=self.model)
            limit, reason, natural_stop_mean = budget(prepared, self.engine.settings.engine)
            transfer = transfer_request(self.engine.settings.engine_name, self.engine.role, prepared.body)
            if transfer.one_token:
                limit, reason, natural_stop_mean = 1, "length", None
            sim = SimRequest(
                request_id=self.engine.new_request_id(prepared.request_id),
                prompt_token_ids=prepared.prompt_ids,
                max_output_tokens=limit,
                limit_reason=reason,
                natural_stop_mean=natural_stop_mean,
                do_remote_decode=transfer.do_remote_decode,
                remote=transfer.remote,
                push_room=transfer.push_room,
                rid=prepared.body.rid,
            )
            try:
                stream = self.engine.add_request(sim, user=prepared.body.user)
            except EngineDead as exc:
                raise ApiError(503, str(exc), "ServiceUnavailableError") from exc
        except ApiError as exc:
            release_rejected(self.engine, raw)  # as vLLM: a refused decode frees its remote prefill's blocks
            return exc.response(headers)
        if prepared.body.stream:
            events = sse_events(prepared, stream, chat=chat)
            return StreamingResponse(events, media_type="text/event-stream", headers=headers)
        try:
            deltas = await collect_or_abort(request, stream)
        except EngineDead as exc:  # TransferFailed: 500, as SGLang and TensorRT-LLM fail such a request
            return ApiError(exc.status, str(exc), exc.error_type).response(headers)
        if deltas is None:
            return Response(status_code=499)  # the client went away; nobody reads this
        answer = full_response(prepared, stream.request, deltas, chat=chat)
        params = answer.pop("kv_transfer_params", None)
        if self.engine.settings.engine_name == "vllm":
            answer["kv_transfer_params"] = params
        elif params is not None:  # TensorRT-LLM puts its disaggregated_params in the choice
            answer["choices"][0]["disaggregated_params"] = params
        return JSONResponse(answer, headers=headers)

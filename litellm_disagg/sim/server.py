"""The HTTP surface of one simulated worker: the subset of vLLM's OpenAI server that the router and wrapper use.

    POST /v1/chat/completions, /v1/completions   OpenAI shapes, stream or not, usage, kv_transfer_params
    POST /tokenize, /detokenize                   vLLM's shapes
    GET  /health                                  200, or 503 while ``ServerState.healthy`` is False
    GET  /v1/models, /version, /metrics
    POST /reset_prefix_cache                      (vLLM's dev-mode endpoint, to reset caches between benchmark arms)

Errors are vLLM's JSON: ``{"error": {"message", "type", "param", "code"}}`` with 400 for bad input (invalid JSON,
wrong types, n != 1, a prompt that does not fit ``max_model_len``), 404 for an unknown model, 503 when the engine is
not running. ``X-Request-Id`` names the request (``chatcmpl-<id>`` / ``cmpl-<id>``) and is echoed back.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from litellm_disagg.sim import tokenizer
from litellm_disagg.sim.chat_template import render_chat
from litellm_disagg.sim.engine import Delta, EngineDead, RequestStream, SimEngine
from litellm_disagg.sim.metrics import CONTENT_TYPE, registry_for, render
from litellm_disagg.sim.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
    _Request,
    describe,
    remote_prefill,
    wants_remote_decode,
)
from litellm_disagg.sim.request import SimRequest, output_budget
from litellm_disagg.version import __version__


@dataclass
class ServerState:
    healthy: bool = True


class ApiError(Exception):
    def __init__(self, status: int, message: str, type_: str = "BadRequestError", param: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param

    def response(self, headers: dict[str, str] | None = None) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.status}}
        return JSONResponse(body, status_code=self.status, headers=headers)


@dataclass(frozen=True)
class _Prepared:
    """A validated generation request, ready for the engine."""

    body: _Request
    request_id: str
    prompt_ids: list[int]
    prompt_text: str
    model: str
    """The served model name, as responses report it."""


def build_app(engine: SimEngine, state: ServerState | None = None) -> Starlette:
    state = state or ServerState()
    metrics_registry = registry_for(engine)
    model = engine.settings.model
    max_model_len = engine.settings.engine.max_model_len

    async def health(_: Request) -> Response:
        ok = state.healthy and engine.alive
        return Response(status_code=200 if ok else 503)

    async def models(_: Request) -> Response:
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {
                        "id": model,
                        "object": "model",
                        "created": int(time.time()),
                        "owned_by": "vllm",
                        "root": model,
                        "parent": None,
                        "max_model_len": max_model_len,
                        "permission": [],
                    }
                ],
            }
        )

    async def version(_: Request) -> Response:
        return JSONResponse({"version": f"litellm-disagg-sim {__version__}"})

    async def metrics(_: Request) -> Response:
        return Response(render(metrics_registry), media_type=CONTENT_TYPE)

    async def reset_prefix_cache(_: Request) -> Response:
        if not engine.pool.reset_prefix_cache():
            return ApiError(400, "cannot reset the prefix cache while blocks are in use").response()
        engine.publish_pending_events()
        return Response(status_code=200)

    async def tokenize(request: Request) -> Response:
        try:
            body = _validate(TokenizeRequest, await _json(request))
            _check_model(body.model, model)
            if body.messages is not None:
                text = render_chat(
                    body.messages,
                    add_generation_prompt=body.add_generation_prompt,
                    continue_final_message=body.continue_final_message,
                    tools=body.tools,
                )
            elif body.prompt is not None:
                text = body.prompt
            else:
                raise ApiError(400, "either prompt or messages is required")
        except ApiError as exc:
            return exc.response()
        ids = tokenizer.encode(text)
        return JSONResponse({"count": len(ids), "max_model_len": max_model_len, "tokens": ids, "token_strs": None})

    async def detokenize(request: Request) -> Response:
        try:
            body = _validate(DetokenizeRequest, await _json(request))
            _check_model(body.model, model)
            if not all(tokenizer.is_valid_token(t) for t in body.tokens):
                raise ApiError(400, "token id out of vocabulary")
        except ApiError as exc:
            return exc.response()
        return JSONResponse({"prompt": tokenizer.decode(body.tokens)})

    async def chat_completions(request: Request) -> Response:
        return await _generate(request, chat=True)

    async def completions(request: Request) -> Response:
        return await _generate(request, chat=False)

    async def _generate(request: Request, *, chat: bool) -> Response:
        base_id = request.headers.get("x-request-id") or uuid.uuid4().hex
        headers = {"X-Request-Id": base_id}
        try:
            prepared = _prepare(await _json(request), chat=chat, base_id=base_id)
            limit, reason = _budget(prepared)
            sim = SimRequest(
                request_id=engine.new_request_id(prepared.request_id),
                prompt_token_ids=prepared.prompt_ids,
                max_output_tokens=limit,
                limit_reason=reason,
                do_remote_decode=wants_remote_decode(prepared.body.kv_transfer_params),
                remote=remote_prefill(prepared.body.kv_transfer_params),
            )
            try:
                stream = engine.add_request(sim)
            except EngineDead as exc:
                raise ApiError(503, str(exc), "ServiceUnavailableError") from exc
        except ApiError as exc:
            return exc.response(headers)
        if prepared.body.stream:
            return StreamingResponse(_sse(prepared, stream, chat=chat), media_type="text/event-stream", headers=headers)
        try:
            deltas = await _collect_or_abort(request, stream)
        except EngineDead as exc:
            return ApiError(503, str(exc), "ServiceUnavailableError").response(headers)
        if deltas is None:
            return Response(status_code=499)  # the client went away; nobody reads this
        return JSONResponse(_full_response(prepared, stream.request, deltas, chat=chat), headers=headers)

    def _prepare(raw: Any, *, chat: bool, base_id: str) -> _Prepared:
        if chat:
            body: _Request = _validate(ChatCompletionRequest, raw)
            assert isinstance(body, ChatCompletionRequest)
            try:
                text = render_chat(
                    body.messages,
                    add_generation_prompt=bool(body.add_generation_prompt),
                    continue_final_message=bool(body.continue_final_message),
                    tools=body.tools,
                )
            except ValueError as exc:
                raise ApiError(400, str(exc)) from exc
            ids = tokenizer.encode(text)
            request_id = f"chatcmpl-{base_id}"
        else:
            body = _validate(CompletionRequest, raw)
            assert isinstance(body, CompletionRequest)
            if isinstance(body.prompt, str):
                text, ids = body.prompt, tokenizer.encode(body.prompt)
            else:
                ids = list(body.prompt)
                if not all(tokenizer.is_valid_token(t) for t in ids):
                    raise ApiError(400, f"prompt token ids must lie in [0, {tokenizer.VOCAB_SIZE})", param="prompt")
                text = tokenizer.decode(ids)
            request_id = f"cmpl-{base_id}"
        _check_model(body.model, model)
        if not ids:
            raise ApiError(400, "the prompt is empty", param="prompt")
        return _Prepared(body, request_id, ids, text, model)

    def _budget(prepared: _Prepared) -> tuple[int, Any]:
        n_prompt = len(prepared.prompt_ids)
        limit = prepared.body.output_limit()
        if limit is not None and n_prompt + limit > max_model_len:
            raise ApiError(
                400,
                f"This model's maximum context length is {max_model_len} tokens. However, you requested "
                f"{n_prompt + limit} tokens ({n_prompt} in the messages, {limit} in the completion). "
                "Please reduce the length of the messages or completion.",
            )
        if n_prompt >= max_model_len:
            raise ApiError(
                400,
                f"This model's maximum context length is {max_model_len} tokens. However, your request "
                f"has {n_prompt} input tokens. Please reduce the length of the input messages.",
            )
        return output_budget(
            n_prompt,
            max_tokens=limit,
            ignore_eos=bool(prepared.body.ignore_eos),
            max_model_len=max_model_len,
            mean_output_tokens=engine.settings.engine.default_output_tokens,
            prompt_token_ids=prepared.prompt_ids,
        )

    async def _sse(prepared: _Prepared, stream: RequestStream, *, chat: bool) -> AsyncIterator[str]:
        body = prepared.body
        created = int(time.time())
        n_prompt = len(prepared.prompt_ids)
        generated = 0
        finished = False
        try:
            if chat:
                yield _event(_chunk(prepared, created, {"delta": {"role": "assistant", "content": ""}}, chat=True))
            async for delta in stream:
                generated += len(delta.token_ids)
                text = tokenizer.decode(delta.token_ids)
                choice: dict[str, Any] = {"delta": {"content": text}} if chat else {"text": text}
                choice["finish_reason"] = delta.finish_reason
                chunk = _chunk(prepared, created, choice, chat=chat)
                if body.include_usage and body.continuous_usage:
                    chunk["usage"] = _usage(n_prompt, generated, stream.request.num_cached_prompt_tokens)
                if delta.kv_transfer_params is not None:
                    chunk["kv_transfer_params"] = delta.kv_transfer_params
                yield _event(chunk)
                finished = delta.finished
            if body.include_usage:
                final = _chunk(prepared, created, None, chat=chat)
                final["choices"] = []
                final["usage"] = _usage(n_prompt, generated, stream.request.num_cached_prompt_tokens)
                yield _event(final)
            yield "data: [DONE]\n\n"
        except EngineDead as exc:
            # As vLLM reports an engine failure mid-stream. After a crash the connection is already reset and
            # nothing of this reaches the client.
            error = {"message": str(exc), "type": "ServiceUnavailableError", "param": None, "code": 503}
            yield _event({"error": error})
            yield "data: [DONE]\n\n"
        finally:
            if not finished:
                stream.abort()

    app = Starlette(
        routes=[
            Route("/health", health, methods=["GET"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/version", version, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
            Route("/tokenize", tokenize, methods=["POST"]),
            Route("/detokenize", detokenize, methods=["POST"]),
            Route("/reset_prefix_cache", reset_prefix_cache, methods=["POST"]),
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/completions", completions, methods=["POST"]),
        ]
    )
    app.state.sim_engine = engine
    app.state.sim_state = state
    return app


# -- helpers ---------------------------------------------------------------------------------------------------------


async def _json(request: Request) -> Any:
    try:
        raw = await request.body()
        value = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"invalid JSON body: {exc}") from exc
    if not isinstance(value, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return value


M = TypeVar("M", bound=BaseModel)


def _validate(cls: type[M], raw: Any) -> M:
    try:
        return cls.model_validate(raw)
    except ValidationError as exc:
        raise ApiError(400, describe(exc)) from exc


def _check_model(requested: str | None, served: str) -> None:
    if requested is not None and requested != served:
        raise ApiError(404, f"The model `{requested}` does not exist.", "NotFoundError", "model")


async def _collect_or_abort(request: Request, stream: RequestStream) -> list[Delta] | None:
    """All of a request's output; None (and the request aborted) if the client disconnects first."""

    async def collect() -> list[Delta]:
        return [delta async for delta in stream]

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    work = asyncio.ensure_future(collect())
    watch = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watch
    if work.done():
        return work.result()  # raises EngineDead if the engine died
    work.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await work
    stream.abort()
    return None


def _usage(prompt: int, completion: int, cached: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def _chunk(prepared: _Prepared, created: int, choice: dict[str, Any] | None, *, chat: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": prepared.request_id,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": created,
        "model": prepared.model,
    }
    if choice is not None:
        full = {"index": 0, **choice, "logprobs": None}
        full.setdefault("finish_reason", None)
        if not chat:
            full["stop_reason"] = None
        out["choices"] = [full]
    return out


def _event(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


def _full_response(prepared: _Prepared, req: SimRequest, deltas: list[Delta], *, chat: bool) -> dict[str, Any]:
    tokens = [t for d in deltas for t in d.token_ids]
    text = tokenizer.decode(tokens)
    last = deltas[-1] if deltas else Delta([], True, "abort")
    usage = _usage(len(prepared.prompt_ids), len(tokens), req.num_cached_prompt_tokens)
    common = {"id": prepared.request_id, "created": int(time.time()), "model": prepared.model}
    if chat:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": text,
            "refusal": None,
            "tool_calls": [],
            "reasoning_content": None,
        }
        choice = {
            "index": 0,
            "message": message,
            "logprobs": None,
            "finish_reason": last.finish_reason,
            "stop_reason": None,
        }
        return {
            **common,
            "object": "chat.completion",
            "choices": [choice],
            "usage": usage,
            "prompt_logprobs": None,
            "kv_transfer_params": last.kv_transfer_params,
        }
    body = prepared.body
    if isinstance(body, CompletionRequest) and body.echo:
        text = prepared.prompt_text + text
    choice = {
        "index": 0,
        "text": text,
        "logprobs": None,
        "finish_reason": last.finish_reason,
        "stop_reason": None,
        "prompt_logprobs": None,
    }
    return {
        **common,
        "object": "text_completion",
        "choices": [choice],
        "usage": usage,
        "kv_transfer_params": last.kv_transfer_params,
    }

"""What the simulated worker's HTTP server answers to a generation request, in OpenAI's shapes as vLLM writes them.

``sse_events`` streams a request's deltas as server-sent events (chunks, optional usage, ``kv_transfer_params`` on
the chunk that carries them, ``[DONE]``); ``collect_or_abort`` gathers a non-streamed request's deltas while watching
for the client to leave; ``full_response`` builds the one JSON answer from them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request

from litellm_disagg.sim import tokenizer
from litellm_disagg.sim.api_input import Prepared
from litellm_disagg.sim.engine import Delta, EngineDead, RequestStream
from litellm_disagg.sim.protocol import CompletionRequest
from litellm_disagg.sim.request import SimRequest


async def sse_events(prepared: Prepared, stream: RequestStream, *, chat: bool) -> AsyncIterator[str]:
    """The streamed answer. The request is aborted if the stream ends (client gone) before the engine finished it."""
    body = prepared.body
    created = int(time.time())
    n_prompt = len(prepared.prompt_ids)
    generated = 0
    finished = False
    try:
        ids = bool(body.return_token_ids)
        opened = not chat
        async for delta in stream:
            if not opened:
                # vLLM opens a chat stream with the role-only chunk when the first output arrives (its
                # ``first_iteration``), not when it admits the request: a client (the router's accounting, a TTFT)
                # that takes a stream's first chunk for its first token must see it no earlier than that
                first = chunk(prepared, created, {"delta": {"role": "assistant", "content": ""}}, chat=True)
                if ids:
                    first["prompt_token_ids"] = prepared.prompt_ids
                yield event(first)
                opened = True
            text = tokenizer.decode(delta.token_ids)
            choice: dict[str, Any] = {"delta": {"content": text}} if chat else {"text": text}
            choice["finish_reason"] = delta.finish_reason
            if ids:
                if not chat and generated == 0:
                    choice["prompt_token_ids"] = prepared.prompt_ids
                choice["token_ids"] = list(delta.token_ids)
            generated += len(delta.token_ids)
            piece = chunk(prepared, created, choice, chat=chat)
            if body.include_usage and body.continuous_usage:
                piece["usage"] = usage(n_prompt, generated, stream.request.num_cached_prompt_tokens)
            if delta.kv_transfer_params is not None:
                piece["kv_transfer_params"] = delta.kv_transfer_params
            yield event(piece)
            finished = delta.finished
        if body.include_usage:
            final = chunk(prepared, created, None, chat=chat)
            final["choices"] = []
            final["usage"] = usage(n_prompt, generated, stream.request.num_cached_prompt_tokens)
            yield event(final)
        yield "data: [DONE]\n\n"
    except EngineDead as exc:
        # As vLLM reports an engine failure mid-stream. After a crash the connection is already reset and
        # nothing of this reaches the client.
        error = {"message": str(exc), "type": exc.error_type, "param": None, "code": exc.status}
        yield event({"error": error})
        yield "data: [DONE]\n\n"
    finally:
        if not finished:
            stream.abort()


async def collect_or_abort(request: Request, stream: RequestStream) -> list[Delta] | None:
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


def usage(prompt: int, completion: int, cached: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def chunk(prepared: Prepared, created: int, choice: dict[str, Any] | None, *, chat: bool) -> dict[str, Any]:
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


def event(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


def full_response(prepared: Prepared, req: SimRequest, deltas: list[Delta], *, chat: bool) -> dict[str, Any]:
    """The non-streamed answer: the whole text, usage, and the last delta's ``kv_transfer_params``."""
    tokens = [t for d in deltas for t in d.token_ids]
    text = tokenizer.decode(tokens)
    last = deltas[-1] if deltas else Delta([], True, "abort")
    counts = usage(len(prepared.prompt_ids), len(tokens), req.num_cached_prompt_tokens)
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
        answer = {
            **common,
            "object": "chat.completion",
            "choices": [choice],
            "usage": counts,
            "prompt_logprobs": None,
            "kv_transfer_params": last.kv_transfer_params,
        }
        if prepared.body.return_token_ids:
            answer["prompt_token_ids"] = prepared.prompt_ids
            choice["token_ids"] = tokens
        return answer
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
    if body.return_token_ids:
        choice["prompt_token_ids"] = prepared.prompt_ids
        choice["token_ids"] = tokens
    return {
        **common,
        "object": "text_completion",
        "choices": [choice],
        "usage": counts,
        "kv_transfer_params": last.kv_transfer_params,
    }

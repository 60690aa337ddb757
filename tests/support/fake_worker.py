"""A recording fake of a vLLM worker's OpenAI surface, for tests of the plugin's plumbing (not of vLLM).

It answers chat and text completions (streaming or not) with a fixed text, answers prefill requests
(``kv_transfer_params.do_remote_decode``) with made-up transfer params naming itself (engine ``engine-NAME``, side
channel 127.0.0.1:``nixl_port``: what ``FakeWorker.transfer`` publishes), records every request body and
header it receives (``GET /_requests``), and can be told to fail prefills or decodes with a status (``POST /_behaviour``:
``prefill_status``, ``decode_status``; ``decode_delay_s`` stalls each decode that long before it answers;
``requests: []`` forgets what it recorded). ``/v1/responses`` answers a minimal
Responses object.
Run in-process (``FakeWorker``) or as a process: ``python -m tests.support.fake_worker --port N``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
import uuid
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from litellm_disagg.runtime_config import VllmNixlTransfer

ANSWER = "fake answer"


def make_app(name: str, nixl_port: int = 1) -> Starlette:
    state: dict[str, Any] = {"requests": [], "prefill_status": 200}

    async def record(request: Request) -> dict[str, Any]:
        body = await request.json()
        state["requests"].append({"path": request.url.path, "body": body, "headers": dict(request.headers)})
        return body

    async def completion(request: Request) -> Response:
        body = await record(request)
        chat = request.url.path.endswith("chat/completions")
        params = body.get("kv_transfer_params") or {}
        if params.get("do_remote_decode"):
            if state["prefill_status"] != 200:
                return JSONResponse({"error": {"message": f"{name} told to fail", "code": state["prefill_status"]}}, status_code=state["prefill_status"])
            transfer = {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": f"engine-{name}",
                        "remote_request_id": request.headers.get("x-request-id", ""), "remote_block_ids": [[1, 2]],
                        "remote_host": "127.0.0.1", "remote_port": nixl_port, "tp_size": 1}
            return JSONResponse(_response(body, chat, "x") | {"kv_transfer_params": transfer})
        if state.get("decode_delay_s"):
            await asyncio.sleep(float(state["decode_delay_s"]))
        if state.get("decode_status", 200) != 200:
            return JSONResponse({"error": {"message": f"{name} told to fail"}}, status_code=state["decode_status"])
        if body.get("stream"):
            return StreamingResponse(_stream(body, chat), media_type="text/event-stream")
        return JSONResponse(_response(body, chat, ANSWER))

    async def responses(request: Request) -> Response:
        body = await record(request)
        message = {"type": "message", "id": "msg_fake", "status": "completed", "role": "assistant",
                   "content": [{"type": "output_text", "text": ANSWER, "annotations": []}]}
        return JSONResponse({"id": f"resp_{uuid.uuid4().hex}", "object": "response", "created_at": int(time.time()),
                             "status": "completed", "model": body.get("model", "fake"), "output": [message],
                             "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
                             "usage": {"input_tokens": 3, "output_tokens": 1, "total_tokens": 4}})

    async def requests_(request: Request) -> Response:
        return JSONResponse(state["requests"])

    async def behaviour(request: Request) -> Response:
        state.update(await request.json())
        return JSONResponse({"ok": True})

    async def health(request: Request) -> Response:
        return Response(status_code=200)

    async def metrics(request: Request) -> Response:
        text = (
            "# TYPE vllm:cache_config_info gauge\n"
            f'vllm:cache_config_info{{block_size="16",num_gpu_blocks="1000",model_name="{name}"}} 1.0\n'
            "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0.0\n"
            "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 0.0\n"
        )
        return Response(text, media_type="text/plain")

    return Starlette(routes=[
        Route("/v1/chat/completions", completion, methods=["POST"]),
        Route("/v1/completions", completion, methods=["POST"]),
        Route("/v1/responses", responses, methods=["POST"]),
        Route("/_requests", requests_, methods=["GET"]),
        Route("/_behaviour", behaviour, methods=["POST"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ])


def _response(body: dict[str, Any], chat: bool, text: str) -> dict[str, Any]:
    usage = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
    base = {"id": f"cmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": body.get("model", "fake"), "usage": usage}
    if chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        return base | {"object": "chat.completion", "choices": [choice]}
    return base | {"object": "text_completion", "choices": [{"index": 0, "text": text, "finish_reason": "stop"}]}


async def _stream(body: dict[str, Any], chat: bool):  # type: ignore[no-untyped-def]
    rid = f"cmpl-{uuid.uuid4().hex}"
    for i, word in enumerate(ANSWER.split(" ")):
        piece = word if i == 0 else " " + word
        if chat:
            chunk = {"id": rid, "object": "chat.completion.chunk", "created": 0, "model": body.get("model"),
                     "choices": [{"index": 0, "delta": {"role": "assistant", "content": piece} if i == 0 else {"content": piece}, "finish_reason": None}]}
        else:
            chunk = {"id": rid, "object": "text_completion", "created": 0, "model": body.get("model"),
                     "choices": [{"index": 0, "text": piece, "finish_reason": None}]}
        yield f"data: {json.dumps(chunk)}\n\n"
    yield "data: [DONE]\n\n"


class FakeWorker:
    """An in-process fake worker on 127.0.0.1:port, started and stopped in the running event loop."""

    def __init__(self, name: str, port: int, nixl_port: int = 1):
        self.name = name
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.transfer = VllmNixlTransfer(host="127.0.0.1", port=nixl_port, engine_id=f"engine-{name}")
        """What this worker's discovery entry publishes; its prefill answers name exactly this."""
        self._server = uvicorn.Server(uvicorn.Config(make_app(name, nixl_port), host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._server.serve())
        while not self._server.started:
            await asyncio.sleep(0.02)

    async def stop(self) -> None:
        self._server.should_exit = True
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--name", default="fake")
    args = parser.parse_args()
    uvicorn.run(make_app(args.name), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()

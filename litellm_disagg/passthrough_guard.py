"""The proxy's provider pass-through route (``/vllm/{endpoint}``) refuses disaggregated model groups with a 400.

LiteLLM's pass-through sends the client's raw body to a path on the worker: the pre-call hook never sees it (so
client transfer metadata would reach the engine), it cannot be split into a prefill and a decode, and it reaches any
path of the engine (``/v1/v1/...`` too: our deployments' base URL ends in ``/v1``). The routing strategy refuses
such a selection for our groups, but LiteLLM then falls back to a provider-less call that ends in a 500; this guard
answers first, with a clear 400, and hands every other request (other model groups) to LiteLLM's route unchanged.

Installed by the plugin on the proxy's FastAPI app (``install``), in front of its middleware stack.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

logger = logging.getLogger(__name__)

PREFIXES = ("/vllm/",)
MAX_BODY_BYTES = 64 * 1024 * 1024

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def install(app: Any, is_ours: Callable[[str], bool]) -> bool:
    """Put the guard in front of ``app`` (a Starlette/FastAPI app; once). ``is_ours(model)``: a disaggregated model
    group. LiteLLM mounts its pass-through routes lazily, so the guard wraps the app's middleware stack (outermost:
    a refusal needs no authentication) and looks only at ``/vllm/...`` requests. Returns whether it installed (False
    also before the app serves: call again)."""
    if app is None or getattr(app, "_litellm_disagg_guarded", False):
        return False
    if getattr(app, "middleware_stack", None) is None:
        return False  # not serving yet (building it now would stop the app from adding middleware): later
    app.middleware_stack = PassthroughGuard(app.middleware_stack, is_ours)
    app._litellm_disagg_guarded = True
    return True


class PassthroughGuard:
    def __init__(self, app: ASGIApp, is_ours: Callable[[str], bool]):
        self.app = app
        self.is_ours = is_ours

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http" or not str(scope.get("path", "")).startswith(PREFIXES):
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False) and size <= MAX_BODY_BYTES
        if size > MAX_BODY_BYTES:
            await _json(send, 413, {"error": {"message": "request body too large", "type": "invalid_request_error"}})
            return
        body = b"".join(chunks)
        model = _model_of(body)
        if model is not None and self.is_ours(model):
            logger.warning("refused the pass-through route %s for disaggregated model group %r", scope.get("path"), model)
            await _json(send, 400, {"error": {
                "message": f"model group {model!r} is served disaggregated: the pass-through route is not available "
                           "for it; use /v1/chat/completions or /v1/completions",
                "type": "invalid_request_error", "param": "model", "code": "400"}})
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def _model_of(body: bytes) -> str | None:
    try:
        data = json.loads(body) if body else None
    except (ValueError, UnicodeDecodeError):
        return None
    model = data.get("model") if isinstance(data, dict) else None
    return model if isinstance(model, str) else None


async def _json(send: Send, status: int, payload: dict[str, Any]) -> None:
    body = json.dumps(payload).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})

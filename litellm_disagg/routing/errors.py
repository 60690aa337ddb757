"""Turn routing failures into LiteLLM exceptions, so the proxy answers the client with the right status."""

from __future__ import annotations

import json

import litellm

from litellm_disagg.transfer.prefill import PrefillRejected

PROVIDER = "litellm_disagg"


def client_error(exc: PrefillRejected, model: str) -> Exception:
    """A prefill worker's 4xx, passed on with the worker's own message."""
    message = _worker_message(exc.body) or str(exc)
    if exc.status_code == 404:
        return litellm.NotFoundError(message=message, model=model, llm_provider=PROVIDER)
    error = litellm.BadRequestError(message=message, model=model, llm_provider=PROVIDER)
    error.status_code = exc.status_code  # type: ignore[assignment]  # keep the worker's 4xx (422, 413, ...)
    return error


def unavailable(message: str, model: str) -> Exception:
    return litellm.ServiceUnavailableError(message=message, llm_provider=PROVIDER, model=model)


def _worker_message(body: str) -> str:
    try:
        data = json.loads(body)
    except ValueError:
        return body.strip()
    if isinstance(data, dict):
        error = data.get("error", data)
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error["message"]
        if isinstance(data.get("message"), str):
            return data["message"]
    return body.strip()


def passthrough_refused(model: str) -> Exception:
    """The provider pass-through route (``/vllm/...``) asked for a disaggregated model group: refused (400)."""
    return litellm.BadRequestError(
        message=(
            f"model group {model!r} is served disaggregated: the pass-through route is not available for it; "
            "use /v1/chat/completions or /v1/completions"
        ),
        model=model,
        llm_provider=PROVIDER,
    )

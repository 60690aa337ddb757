"""How a simulated engine ends a request it cannot serve; the server answers each with its status and type."""

from __future__ import annotations


class EngineDead(Exception):
    """The engine stopped or crashed while the request was in flight."""

    status = 503
    error_type = "ServiceUnavailableError"


class TransferFailed(EngineDead):
    """The request's KV never arrived (or it was aborted while waiting): SGLang and TensorRT-LLM fail it."""

    status = 500
    error_type = "InternalServerError"

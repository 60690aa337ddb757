"""What the simulated worker's HTTP server accepts: JSON bodies, validation, and vLLM's error shape for what it refuses.

Every refusal is an ``ApiError`` (status, message, type, param), answered as vLLM does:
``{"error": {"message", "type", "param", "code"}}``. A generation request becomes a ``Prepared`` (the validated body,
the prompt's token ids and text, the request id) and then an output budget; both raise ``ApiError`` for input vLLM
would refuse (invalid JSON or types, an unknown model, an empty prompt, a prompt that does not fit ``max_model_len``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse

from litellm_disagg.sim import tokenizer
from litellm_disagg.sim.chat_template import render_chat
from litellm_disagg.sim.protocol import ChatCompletionRequest, CompletionRequest, TokenizeRequest, _Request, describe
from litellm_disagg.sim.request import FinishReason, output_budget
from litellm_disagg.sim.settings import EngineSettings


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
class Prepared:
    """A validated generation request, ready for the engine."""

    body: _Request
    request_id: str
    prompt_ids: list[int]
    prompt_text: str
    model: str
    """The served model name, as responses report it."""


async def read_json(request: Request) -> Any:
    """The request's body as a JSON object."""
    try:
        raw = await request.body()
        value = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"invalid JSON body: {exc}") from exc
    if not isinstance(value, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return value


M = TypeVar("M", bound=BaseModel)


def validate(cls: type[M], raw: Any) -> M:
    try:
        return cls.model_validate(raw)
    except ValidationError as exc:
        raise ApiError(400, describe(exc)) from exc


def check_model(requested: str | None, served: str) -> None:
    if requested is not None and requested != served:
        raise ApiError(404, f"The model `{requested}` does not exist.", "NotFoundError", "model")


def tokenize_text(body: TokenizeRequest) -> str:
    """The text ``/tokenize`` encodes: the rendered chat, or the prompt."""
    if body.messages is not None:
        return render_chat(
            body.messages,
            add_generation_prompt=body.add_generation_prompt,
            continue_final_message=body.continue_final_message,
            tools=body.tools,
        )
    if body.prompt is not None:
        return body.prompt
    raise ApiError(400, "either prompt or messages is required")


def prepare(raw: Any, *, chat: bool, base_id: str, model: str) -> Prepared:
    """A chat or text completion body -> its prompt tokens and request id (``chatcmpl-<id>`` / ``cmpl-<id>``)."""
    if chat:
        body: _Request = validate(ChatCompletionRequest, raw)
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
        body = validate(CompletionRequest, raw)
        assert isinstance(body, CompletionRequest)
        if isinstance(body.prompt, str):
            text, ids = body.prompt, tokenizer.encode(body.prompt)
        else:
            ids = list(body.prompt)
            if not all(tokenizer.is_valid_token(t) for t in ids):
                raise ApiError(400, f"prompt token ids must lie in [0, {tokenizer.VOCAB_SIZE})", param="prompt")
            text = tokenizer.decode(ids)
        request_id = f"cmpl-{base_id}"
    check_model(body.model, model)
    if not ids:
        raise ApiError(400, "the prompt is empty", param="prompt")
    return Prepared(body, request_id, ids, text, model)


def budget(prepared: Prepared, engine: EngineSettings) -> tuple[int, FinishReason, int | None]:
    """How many tokens the request may generate, why it stops there, and whether the model may stop earlier by itself
    (``output_budget``); refuses a request that does not fit the context."""
    max_model_len = engine.max_model_len
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
        mean_output_tokens=engine.default_output_tokens,
    )

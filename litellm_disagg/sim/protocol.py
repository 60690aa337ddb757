"""The OpenAI request bodies the simulator accepts, validated strictly (wrong types are a 400, as in vLLM), and the
NixlConnector ``kv_transfer_params`` it reads. Fields the simulator does not use (temperature, top_p, seed, stop,
logprobs, ...) are accepted and ignored.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from litellm_disagg.sim.request import RemotePrefill

_REQUEST_CONFIG = ConfigDict(extra="allow", strict=True)


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    type: str
    text: str | None = None

    @field_validator("type")
    @classmethod
    def _text_only(cls, value: str) -> str:
        if value != "text":
            raise ValueError(f"content part type {value!r} is not supported by this model (text only)")
        return value


class ChatMessage(BaseModel):
    model_config = _REQUEST_CONFIG

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part.text or "" for part in self.content)  # as vLLM joins text parts


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    include_usage: bool = False
    continuous_usage_stats: bool = False


class _Request(BaseModel):
    model_config = _REQUEST_CONFIG

    model: str | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    n: int | None = 1
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool | None = False
    return_token_ids: bool | None = False
    """As vLLM: the prompt's token ids (chat: top level of the first chunk or the answer; completions: in the first
    choice) and each choice's output token ids (``token_ids``)."""
    kv_transfer_params: dict[str, Any] | None = None
    bootstrap_host: str | None = None
    """SGLang: the prefill worker's bootstrap server (with ``bootstrap_port`` and ``bootstrap_room``)."""
    bootstrap_port: int | None = None
    bootstrap_room: Annotated[int, Field(ge=0, le=2**63 - 1)] | None = None
    rid: str | None = None
    """SGLang: the request's name, for ``/abort_request``."""
    disaggregated_params: dict[str, Any] | None = None
    """TensorRT-LLM: ``request_type`` context_only / generation_only and the context server's state."""
    user: str | None = None
    """OpenAI's end-user id; accepted, and kept in the request's trace (``request_log.py``)."""

    @field_validator("n")
    @classmethod
    def _one_choice(cls, value: int | None) -> int | None:
        if value not in (1, None):
            raise ValueError("only n=1 is supported")
        return value

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.continuous_usage_stats)

    def output_limit(self) -> int | None:
        return self.max_tokens


class ChatCompletionRequest(_Request):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    tools: list[dict[str, Any]] | None = None
    add_generation_prompt: bool | None = True
    continue_final_message: bool | None = False

    def output_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(_Request):
    prompt: str | Annotated[list[int], Field(min_length=1)]
    """One prompt: text, or token ids. A list of one string is taken as that string; more prompts are refused."""
    echo: bool | None = False

    @field_validator("prompt", mode="before")
    @classmethod
    def _single_prompt(cls, value: object) -> object:
        if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            if len(value) != 1:
                raise ValueError("only one prompt per request is supported")
            return value[0]
        return value


class TokenizeRequest(BaseModel):
    model_config = _REQUEST_CONFIG

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    tools: list[dict[str, Any]] | None = None


class DetokenizeRequest(BaseModel):
    model_config = _REQUEST_CONFIG

    model: str | None = None
    tokens: list[int]


def describe(exc: ValidationError) -> str:
    """A one-line message for a 400 (field path and what is wrong, for each error)."""
    parts = []
    for err in exc.errors(include_url=False):
        loc = ".".join(str(p) for p in err.get("loc", ()))
        parts.append(f"{loc}: {err.get('msg', 'invalid')}" if loc else str(err.get("msg", "invalid")))
    return "; ".join(parts)[:2000]


def wants_remote_decode(params: dict[str, Any] | None) -> bool:
    """Prefill side: the request asks this engine to keep its KV for a decode elsewhere."""
    return bool(params) and params.get("do_remote_decode") is True  # type: ignore[union-attr]


def remote_prefill(params: dict[str, Any] | None) -> RemotePrefill | None:
    """Decode side: where to pull the prompt's KV from, or None when the params do not ask for a pull."""
    if not params or params.get("do_remote_prefill") is not True:
        return None
    engine_id, request_id = params.get("remote_engine_id"), params.get("remote_request_id")
    if not isinstance(engine_id, str) or not isinstance(request_id, str):
        return None
    raw_blocks = params.get("remote_block_ids")
    blocks: tuple[int, ...] | None = None
    if isinstance(raw_blocks, list):
        flat = raw_blocks[0] if len(raw_blocks) == 1 and isinstance(raw_blocks[0], list) else raw_blocks
        if all(isinstance(b, int) and not isinstance(b, bool) for b in flat):
            blocks = tuple(flat)
    host, port = params.get("remote_host"), params.get("remote_port")
    return RemotePrefill(
        engine_id=engine_id,
        request_id=request_id,
        block_ids=blocks,
        host=host if isinstance(host, str) else None,
        port=port if isinstance(port, int) else None,
    )

"""vLLM NixlConnector transfer metadata.

The protocol (vLLM v1 ``NixlConnector``):

1. The prefill request is the client's request with ``max_tokens=1`` (and ``max_completion_tokens=1`` where given),
   ``stream=false``, no ``stream_options``/``min_tokens``/``n``, and ``kv_transfer_params={"do_remote_decode": true}``.
2. The prefill response carries ``kv_transfer_params`` (``do_remote_prefill``, ``remote_block_ids``,
   ``remote_engine_id``, ``remote_request_id``, ``remote_host``, ``remote_port``, ``tp_size``, ...).
3. The decode request is the client's request unchanged, plus those ``kv_transfer_params`` verbatim at the top level.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict


class Endpoint(StrEnum):
    """The OpenAI endpoint a request uses; the prefill must use the same one so both halves see the same tokens."""

    CHAT = "chat/completions"
    COMPLETIONS = "completions"


PREFILL_MARKER: dict[str, Any] = {"do_remote_decode": True}

# Fields of an OpenAI request that decide which tokens the engine sees (and so which KV the prefill computes).
_PROMPT_FIELDS: dict[Endpoint, tuple[str, ...]] = {
    Endpoint.CHAT: (
        "messages",
        "tools",
        "tool_choice",
        "functions",
        "function_call",
        "response_format",
        "chat_template",
        "chat_template_kwargs",
        "add_generation_prompt",
        "continue_final_message",
        "documents",
        "add_special_tokens",
        "mm_processor_kwargs",
        "reasoning_effort",
        "truncate_prompt_tokens",
        "lora_request",
    ),
    Endpoint.COMPLETIONS: (
        "prompt",
        "suffix",
        "echo",
        "add_special_tokens",
        "truncate_prompt_tokens",
        "response_format",
    ),
}


class KVTransferParams(BaseModel):
    """What a vLLM prefill returns for its decode. Known fields are typed; the whole object is passed on verbatim."""

    model_config = ConfigDict(extra="allow", frozen=True)

    do_remote_prefill: bool = False
    do_remote_decode: bool = False
    remote_engine_id: str | None = None
    remote_request_id: str | None = None
    remote_block_ids: list[Any] | None = None
    remote_host: str | None = None
    remote_port: int | None = None
    tp_size: int | None = None

    def for_decode(self) -> dict[str, Any]:
        """The dict to send as the decode request's top-level ``kv_transfer_params``, exactly as received."""
        return self.model_dump(mode="json", exclude_unset=True)

    @property
    def usable(self) -> bool:
        """True when the decode worker can pull this prompt's KV (the prefill computed and kept it)."""
        return self.do_remote_prefill and bool(self.remote_engine_id)


def build_prefill_body(endpoint: Endpoint, model: str, request: dict[str, Any]) -> dict[str, Any]:
    """The prefill request for ``request`` (the client's OpenAI fields), addressed to ``model`` on the worker."""
    body: dict[str, Any] = {key: request[key] for key in _PROMPT_FIELDS[endpoint] if request.get(key) is not None}
    body["model"] = model
    body["max_tokens"] = 1
    if endpoint is Endpoint.CHAT and request.get("max_completion_tokens") is not None:
        body["max_completion_tokens"] = 1
    body["stream"] = False
    body["kv_transfer_params"] = dict(PREFILL_MARKER)
    return body

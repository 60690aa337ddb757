"""What the router needs to know about one client request, taken from LiteLLM's call arguments.

Also the one place that removes client-supplied transfer metadata: a client must never choose which remote KV blocks
a decode worker loads.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Any

from litellm_disagg.engines import client_transfer_keys
from litellm_disagg.engines.base import Endpoint

logger = logging.getLogger(__name__)

CALL_TYPE_KEY = "litellm_disagg_call_type"
"""Key in the request's metadata where the proxy hook records the call type (chat or text completion)."""

_TEXT_COMPLETION_CALL_TYPES = frozenset({"text_completion", "atext_completion"})
_ANTHROPIC_CALL_TYPES = frozenset({"anthropic_messages", "aanthropic_messages"})
_ANTHROPIC_PROMPT_KEYS = ("messages", "system", "tools", "tool_choice", "thinking", "output_format", "output_config")


def strip_transfer_params(data: dict[str, Any]) -> list[str]:
    """Remove client-supplied transfer metadata from a request dict in place; returns where any was found.

    Every place a key can reach an engine: the top level, ``extra_body`` (which LiteLLM merges into the body), and
    ``vllm_xargs`` at either level (vLLM copies it into the request's ``extra_args``, where its connector reads
    ``kv_transfer_params``: a client could otherwise hand the decode worker block ids of its own choosing, or crash
    the engine with a value of the wrong type).
    """
    found: list[str] = []
    keys = sorted(client_transfer_keys())
    extra_body = data.get("extra_body")
    places: list[tuple[str, Any]] = [("", data)]
    if isinstance(extra_body, dict):
        places.append(("extra_body.", extra_body))
    for prefix, place in list(places):
        xargs = place.get("vllm_xargs")
        if isinstance(xargs, dict):
            places.append((f"{prefix}vllm_xargs.", xargs))
    for prefix, place in places:
        for key in keys:
            if place.pop(key, None) is not None:
                found.append(prefix + key)
    return found


CLIENT_TIMEOUT_KEY = "litellm_disagg_client_timeout"
"""Key in the request's metadata set when the client gave its own deadline (``timeout``/``request_timeout``)."""


def is_passthrough(request_kwargs: dict[str, Any]) -> bool:
    """Whether LiteLLM selects for its provider pass-through route (``/vllm/{endpoint}``): a raw request to a path on
    the worker, which bypasses the pre-call hook and cannot be disaggregated."""
    return isinstance(request_kwargs.get("endpoint"), str) and "method" in request_kwargs and "messages" not in request_kwargs


def record_client_timeout(data: dict[str, Any]) -> None:
    """Note in the request's metadata that the client set its own deadline: a call that runs past it failed because
    of the client's choice, not the worker's (no failure cooldown)."""
    if any(data.get(key) is not None for key in ("timeout", "request_timeout", "stream_timeout")):
        _metadata(data)[CLIENT_TIMEOUT_KEY] = True


def client_set_timeout(event_kwargs: dict[str, Any]) -> bool:
    """Whether LiteLLM's call event belongs to a call whose client set its own deadline."""
    places = [event_kwargs.get("metadata"), event_kwargs.get("litellm_metadata")]
    litellm_params = event_kwargs.get("litellm_params")
    if isinstance(litellm_params, dict):
        places += [litellm_params.get("metadata"), litellm_params.get("litellm_metadata")]
    return any(isinstance(m, dict) and m.get(CLIENT_TIMEOUT_KEY) is True for m in places)


def _metadata(data: dict[str, Any]) -> dict[str, Any]:
    for key in ("metadata", "litellm_metadata"):
        metadata = data.get(key)
        if isinstance(metadata, dict):
            return metadata
    data["metadata"] = {}
    return data["metadata"]


def record_call_type(data: dict[str, Any], call_type: str) -> None:
    """Note the call type in the request's metadata (which LiteLLM never sends to a backend)."""
    for key in ("metadata", "litellm_metadata"):
        metadata = data.get(key)
        if isinstance(metadata, dict):
            metadata[CALL_TYPE_KEY] = call_type
            return
    data["metadata"] = {CALL_TYPE_KEY: call_type}


def endpoint_of(request_kwargs: dict[str, Any]) -> Endpoint:
    """Chat or text completion, as recorded by the proxy hook; else from the proxy's request URL; else chat."""
    for key in ("metadata", "litellm_metadata"):
        metadata = request_kwargs.get(key)
        if isinstance(metadata, dict) and CALL_TYPE_KEY in metadata:
            return Endpoint.COMPLETIONS if metadata[CALL_TYPE_KEY] in _TEXT_COMPLETION_CALL_TYPES else Endpoint.CHAT
    proxy_request = request_kwargs.get("proxy_server_request")
    if isinstance(proxy_request, dict):
        url = str(proxy_request.get("url") or "").split("?", 1)[0].rstrip("/")
        if url.endswith("/completions") and not url.endswith("/chat/completions"):
            return Endpoint.COMPLETIONS
    return Endpoint.CHAT


@dataclass(frozen=True)
class DisaggRequest:
    """One request as the orchestrator sees it."""

    endpoint: Endpoint
    fields: dict[str, Any]
    """The OpenAI request fields that define the prompt (``messages`` or ``prompt``, tools, template options)."""
    request_id: str

    @property
    def splittable(self) -> bool:
        """Whether this request can be prefilled remotely: exactly one prompt, one completion."""
        if (self.fields.get("n") or 1) != 1:
            return False
        if self.endpoint is Endpoint.COMPLETIONS:
            prompt = self.fields.get("prompt")
            return isinstance(prompt, str) or (isinstance(prompt, list) and all(isinstance(t, int) for t in prompt) and bool(prompt))
        return bool(self.fields.get("messages"))

    @classmethod
    def from_router_call(cls, *, messages: list[dict[str, Any]] | None, request_kwargs: dict[str, Any]) -> DisaggRequest:
        endpoint = endpoint_of(request_kwargs)
        fields = {k: v for k, v in request_kwargs.items() if not k.startswith("litellm") and k not in ("metadata", "proxy_server_request")}
        if _call_type(request_kwargs) in _ANTHROPIC_CALL_TYPES:
            # /v1/messages: LiteLLM selects with the Anthropic request and translates it for the decode call afterwards;
            # the prefill must see the decode's prompt (system prompt, tools in OpenAI form), so translate the same way.
            return cls(endpoint=Endpoint.CHAT, fields=anthropic_as_chat(messages, request_kwargs), request_id=_new_id())
        if endpoint is Endpoint.COMPLETIONS:
            # LiteLLM's router passes a text prompt to the selection as a single user message.
            prompt = request_kwargs.get("prompt")
            if prompt is None and messages:
                prompt = messages[0].get("content")
            fields["prompt"] = prompt
        else:
            fields["messages"] = messages if messages is not None else request_kwargs.get("messages")
        return cls(endpoint=endpoint, fields=fields, request_id=_new_id())


def _new_id() -> str:
    return f"disagg-{uuid.uuid4().hex}"


def _call_type(request_kwargs: dict[str, Any]) -> str | None:
    for key in ("metadata", "litellm_metadata"):
        metadata = request_kwargs.get(key)
        if isinstance(metadata, dict) and CALL_TYPE_KEY in metadata:
            return str(metadata[CALL_TYPE_KEY])
    return None


def anthropic_as_chat(messages: list[dict[str, Any]] | None, request_kwargs: dict[str, Any]) -> dict[str, Any]:
    """The OpenAI chat fields of an Anthropic Messages request, translated by LiteLLM's own adapter (the one its
    ``/v1/messages`` route uses for an OpenAI-compatible backend). Empty (not splittable: served aggregated) when the
    request cannot be translated."""
    from litellm.llms.anthropic.pass_through.adapters.transformation import AnthropicAdapter

    request = {k: request_kwargs[k] for k in _ANTHROPIC_PROMPT_KEYS if request_kwargs.get(k) is not None}
    request["messages"] = messages if messages is not None else request_kwargs.get("messages")
    request["model"] = request_kwargs.get("model") or "model"
    request["max_tokens"] = request_kwargs.get("max_tokens") or 1
    try:
        translated, _ = AnthropicAdapter().translate_completion_input_params_with_tool_mapping(
            request, custom_llm_provider="hosted_vllm"
        )
    except Exception as exc:  # a request LiteLLM will refuse itself; never route it on a guess
        logger.debug("an Anthropic request not translatable for its prefill: %s", exc)
        return {}
    return dict(translated or {})

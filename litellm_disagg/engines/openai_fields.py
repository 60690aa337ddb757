"""Which fields of an OpenAI request a prefill request may carry (LiteLLM's call kwargs hold much else: clients,
headers, its own bookkeeping). Shared by the engines' transfer protocols.

- ``PROMPT_FIELDS``: what decides which tokens the engine sees, so both halves compute the same KV (``cache_salt``
  too: vLLM salts the prompt's block hashes with it, so a prefill without it would cache under another tenant's key).
- ``SAMPLING_FIELDS``: what decides how a token is sampled. An engine whose prefill samples the first output token
  (SGLang sends it to the decode with the KV; TensorRT-LLM returns it as ``first_gen_tokens``) needs these too.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

from litellm_disagg.engines.base import Endpoint

PROMPT_FIELDS: Final[Mapping[Endpoint, tuple[str, ...]]] = MappingProxyType({
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
        "cache_salt",
    ),
    Endpoint.COMPLETIONS: (
        "prompt",
        "suffix",
        "echo",
        "add_special_tokens",
        "truncate_prompt_tokens",
        "response_format",
        "cache_salt",
    ),
})

SAMPLING_FIELDS: Final = (
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "n",
    "stop",
    "stop_token_ids",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "logit_bias",
    "logprobs",
    "top_logprobs",
    "ignore_eos",
    "min_tokens",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "regex",
    "ebnf",
    "json_schema",
)


def prefill_fields(endpoint: Endpoint, request: Mapping[str, Any], *, sampling: bool) -> dict[str, Any]:
    """The set (not None) prompt fields of ``request`` (and its sampling fields when ``sampling``)."""
    names = PROMPT_FIELDS[endpoint] + (SAMPLING_FIELDS if sampling else ())
    return {key: request[key] for key in names if request.get(key) is not None}

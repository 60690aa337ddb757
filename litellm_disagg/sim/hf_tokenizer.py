"""The simulated worker's tokenizer and chat template behind the Hugging Face interface the router's local
tokenization uses, so a proxy can tokenize for simulated workers itself instead of asking their ``/tokenize``::

    kv_routing:
      tokenizer:
        model_dirs: {sim-model: "python:litellm_disagg.sim.hf_tokenizer:load"}

Same ids as the simulated worker's ``/tokenize`` and its engine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from litellm_disagg.sim import tokenizer
from litellm_disagg.sim.chat_template import render_chat
from litellm_disagg.sim.protocol import ChatMessage


class SimHFTokenizer:
    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tokenize: bool = False,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: Sequence[dict[str, Any]] | None = None,
        **_: Any,
    ) -> str | list[int]:
        text = render_chat(
            [ChatMessage.model_validate(m) for m in messages],
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            tools=tools,
        )
        return tokenizer.encode(text) if tokenize else text

    def __call__(self, text: str, *, add_special_tokens: bool = False) -> dict[str, list[int]]:
        # The simulator has no BOS token: add_special_tokens changes nothing, as on its /tokenize.
        return {"input_ids": tokenizer.encode(text)}


def load() -> SimHFTokenizer:
    return SimHFTokenizer()

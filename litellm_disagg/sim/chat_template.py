"""The fixed chat template: ChatML, so chat and completions agree on tokens (a chat request and a completion whose
prompt is the rendered text are the same prompt)::

    <|im_start|>system
    # Tools
    [tool schemas as JSON]<|im_end|>          (only when tools are given)
    <|im_start|>{role}
    {content}[<tool_call>{tool calls as JSON}</tool_call>]<|im_end|>
    ...
    <|im_start|>assistant                      (add_generation_prompt, the default)

With ``continue_final_message`` the last message is left open (no ``<|im_end|>``) and no generation prompt follows.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from litellm_disagg.sim.protocol import ChatMessage


def render_chat(
    messages: Sequence[ChatMessage],
    *,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    tools: Sequence[dict[str, Any]] | None = None,
) -> str:
    parts: list[str] = []
    if tools:
        parts.append(f"<|im_start|>system\n# Tools\n{json.dumps(list(tools), sort_keys=True)}<|im_end|>\n")
    for i, message in enumerate(messages):
        body = message.text()
        if message.tool_calls:
            body += f"<tool_call>{json.dumps(message.tool_calls, sort_keys=True)}</tool_call>"
        last_open = continue_final_message and i == len(messages) - 1
        parts.append(f"<|im_start|>{message.role}\n{body}" + ("" if last_open else "<|im_end|>\n"))
    if add_generation_prompt and not continue_final_message:
        parts.append("<|im_start|>assistant\n")
    return "".join(parts)

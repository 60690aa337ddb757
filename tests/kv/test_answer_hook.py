"""The plugin's success hook hands a completed chat answer to the KV router's token cache (``KVRouter.answered``)."""

from __future__ import annotations

from typing import Any

import litellm

from litellm_disagg.plugin import DisaggPlugin
from litellm_disagg.routing.deployments import ID_PREFIX
from litellm_disagg.routing.request import CALL_TYPE_KEY


class FakeKV:
    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[str | None, dict[str, Any], str]] = []
        self.fail = fail

    async def answered(self, worker_id: str | None, fields: dict[str, Any], answer: str) -> int:
        self.calls.append((worker_id, fields, answer))
        if self.fail:
            raise RuntimeError("boom")
        return 1


class FakeController:
    def __init__(self, kv: FakeKV | None) -> None:
        self.kv = kv
        self.ended: list[str] = []

    def finished(self, call_id: str, *, worker_id: str | None, failed: bool) -> None:
        pass

    def call_ended(self, call_id: str, *, worker_id: str | None, failed: bool) -> None:
        self.ended.append(call_id)


def response(*contents: str | None) -> litellm.ModelResponse:
    return litellm.ModelResponse(
        choices=[{"index": i, "message": {"role": "assistant", "content": c}} for i, c in enumerate(contents)]
    )


def kwargs_of(messages: Any, worker: str | None = "w1", **optional: Any) -> dict[str, Any]:
    info = {"id": f"{ID_PREFIX}{worker}"} if worker else {"id": "someone-else"}
    return {
        "litellm_call_id": "c1",
        "messages": messages,
        "litellm_params": {"model_info": info},
        "optional_params": {"max_tokens": 8, **optional},
    }


async def test_a_completed_answer_reaches_the_token_cache() -> None:
    plugin = DisaggPlugin()
    kv, broken = FakeKV(), FakeKV(fail=True)
    controllers = [FakeController(kv), FakeController(broken), FakeController(None)]
    for c in controllers:
        DisaggPlugin._controllers.add(c)  # type: ignore[arg-type]
    try:
        messages = [{"role": "user", "content": "hello"}]
        tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
        await plugin.async_log_success_event(kwargs_of(messages, tools=tools), response("hi there"), None, None)
        assert kv.calls == [("w1", {"messages": messages, "tools": tools}, "hi there")]
        assert len(broken.calls) == 1  # its failure is swallowed; the others still ran
        assert all(c.ended == ["c1"] for c in controllers)  # the end of the call is noted first, as before
        # nothing to cache: no text, several choices, not our worker, no messages
        for kwargs, answer in (
            (kwargs_of(messages), response(None)),
            (kwargs_of(messages), response("a", "b")),
            (kwargs_of(messages, worker=None), response("a")),
            (kwargs_of(None), response("a")),
            (kwargs_of(messages), None),
            ({**kwargs_of(messages), "call_type": "atext_completion"}, response("a")),
            (
                {**kwargs_of(messages), "litellm_params": {
                    "model_info": {"id": f"{ID_PREFIX}w1"}, "metadata": {CALL_TYPE_KEY: "text_completion"}
                }},
                response("a"),
            ),
        ):
            await plugin.async_log_success_event(kwargs, answer, None, None)
        assert len(kv.calls) == 1
    finally:
        for c in controllers:
            DisaggPlugin._controllers.discard(c)  # type: ignore[arg-type]

"""The plugin's stream hook follows the streams of the requests it routed (each chunk ends the prompt's queued
tokens, times the tokens, feeds migration) and hands every other stream back as it came: another model group served
by LiteLLM's own strategy pays no layer and no work per chunk."""

from __future__ import annotations

from collections.abc import AsyncIterator

from litellm_disagg.plugin import DisaggPlugin


class FakeController:
    def __init__(self, routed: set[str]) -> None:
        self._routed = routed
        self.chunks: list[tuple[str, bool]] = []

    def routed(self, call_id: str) -> bool:
        return call_id in self._routed

    def streamed(self, call_id: str, *, last: bool) -> None:
        self.chunks.append((call_id, last))


async def chunks(n: int) -> AsyncIterator[int]:
    for i in range(n):
        yield i


async def test_a_stream_the_plugin_did_not_route_is_handed_back_untouched() -> None:
    plugin = DisaggPlugin()
    controller = FakeController(routed={"ours"})
    DisaggPlugin._controllers.add(controller)  # type: ignore[arg-type]
    try:
        for request_data in ({"litellm_call_id": "theirs", "model": "other-group"}, {"model": "no-call-id"}, None):
            stream = chunks(3)
            assert plugin.async_post_call_streaming_iterator_hook(None, stream, request_data) is stream  # type: ignore[arg-type]
        assert controller.chunks == []
        followed = plugin.async_post_call_streaming_iterator_hook(None, chunks(3), {"litellm_call_id": "ours"})
        assert [c async for c in followed] == [0, 1, 2]
        assert controller.chunks == [("ours", False)] * 3
    finally:
        DisaggPlugin._controllers.discard(controller)  # type: ignore[arg-type]

"""The controller's view of a stream's chunks: the first ends the prompt's prefill, the last ends the request."""

from __future__ import annotations

from unittest.mock import MagicMock

from litellm_disagg.routing.controller import DisaggController
from litellm_disagg.routing.strategy import DECODE_KEY_PREFIX
from litellm_disagg.settings import DisaggSettings


async def test_first_chunk_ends_the_local_prefill_and_the_last_ends_the_request():
    controller = DisaggController(MagicMock(), DisaggSettings(kv_routing={"enabled": True}), MagicMock())
    try:
        kv = controller.kv
        assert kv is not None
        key = DECODE_KEY_PREFIX + "call-1"
        controller.load.start(key, "w1")
        kv.tokens.start(key, "w1", prefill_tokens=900, decode_blocks=60)
        assert kv.tokens.counts("w1") == (900, 60)

        controller.streamed("call-1", last=False)
        assert kv.tokens.counts("w1") == (0, 60)  # computed: no longer queued prefill work
        assert controller.load.count("w1") == 1

        controller.streamed("call-1", last=True)
        assert kv.tokens.counts("w1") == (0, 0)
        assert controller.load.count("w1") == 0

        controller.streamed("call-1", last=True)  # the success event or a late chunk after the end: harmless
        controller.finished("call-1")
        assert controller.load.count("w1") == 0
    finally:
        await controller.prefill_client.aclose()

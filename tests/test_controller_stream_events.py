"""The controller's view of a stream's chunks: the first ends the prompt's prefill, the last ends the request."""

from __future__ import annotations

from unittest.mock import MagicMock

from litellm_disagg.routing.accounting import FlightKey
from litellm_disagg.routing.controller import DisaggController
from litellm_disagg.settings import DisaggSettings


async def test_first_chunk_ends_the_local_prefill_and_the_last_ends_the_request():
    controller = DisaggController(MagicMock(), DisaggSettings(kv_routing={"enabled": True}), MagicMock())
    try:
        accounting = controller.accounting
        assert controller.kv is not None and controller.kv.accounting is accounting  # one owner
        accounting.start(FlightKey.decode("call-1"), "w1", prefill_tokens=900, decode_blocks=60)
        assert (accounting.requests("w1"), accounting.prefill_tokens("w1"), accounting.decode_blocks("w1")) == (1, 900, 60)

        controller.streamed("call-1", last=False)
        assert (accounting.prefill_tokens("w1"), accounting.decode_blocks("w1")) == (0, 60)  # computed: not queued
        assert accounting.requests("w1") == 1

        controller.streamed("call-1", last=True)
        assert (accounting.requests("w1"), accounting.prefill_tokens("w1"), accounting.decode_blocks("w1")) == (0, 0, 0)

        controller.streamed("call-1", last=True)  # the success event or a late chunk after the end: harmless
        controller.finished("call-1")
        assert accounting.requests("w1") == 0
    finally:
        await controller.prefill_client.aclose()


async def test_a_finished_call_marks_its_session_answered_so_its_next_turn_can_be_expected():
    """``finished`` tells the live sessions the answer ended (``sessions.ended``): the gap to the next turn is
    measured from there, and a session whose answer ended is counted as a next turn soon (``expect: next_turns``).
    Without the hook no gap is ever measured and nothing is expected."""
    controller = DisaggController(MagicMock(), DisaggSettings(kv_routing={"enabled": True}), MagicMock())
    try:
        assert controller.kv is not None
        sessions = controller.kv.sessions
        now = [100.0]
        sessions._clock = lambda: now[0]
        sessions.routed("w1", [1, 2], call_id="a")
        controller.finished("a")
        now[0] = 102.0
        sessions.routed("w1", [1, 2, 3], call_id="b")  # the next turn, 2 s after the answer ended
        sessions.routed("w2", [7, 8], call_id="c")
        controller.finished("c")
        now[0] = 103.0
        assert sessions.next_turns(5.0) == {"w2": 1.0}  # c's answer ended 1 s ago; the one gap seen was 2 s
    finally:
        await controller.prefill_client.aclose()

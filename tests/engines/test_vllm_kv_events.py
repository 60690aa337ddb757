"""The vLLM adapter's KV event decoder (the wire format itself: tests/kv/test_kv_events.py)."""

from __future__ import annotations

import pytest

from litellm_disagg.engines import get_engine
from litellm_disagg.engines.base import AllBlocksCleared, BlockRemoved, BlockStored, MalformedBatch
from tests.kv import vllm_wire as wire


def test_the_adapter_decodes_a_message_into_neutral_events():
    frames = wire.message(7, [wire.stored([1, 2], None, [5, 6, 7, 8], 2), wire.removed([1]), wire.cleared()])
    batch = get_engine("vllm").adapter.decode_kv_events(frames)
    assert batch.seq == 7 and batch.ts == 1.5
    assert batch.events == [
        BlockStored([1, 2], None, [5, 6, 7, 8], 2, "GPU", None, 0, None),
        BlockRemoved([1], "GPU", 0),
        AllBlocksCleared(),
    ]


@pytest.mark.parametrize(
    ("frames", "seq"),
    [
        ([b"kv", (9).to_bytes(8, "big"), b"\xc1not msgpack"], 9),  # the sequence number is known: a gap at 9
        ([b"kv", (9).to_bytes(8, "big"), b"\x91\x01"], 9),  # msgpack, but not a batch
        ([b"kv", b"\x00" * 3, b""], None),
        ([b"kv"], None),
    ],
)
def test_a_malformed_message_says_which_batch_it_was(frames, seq):
    with pytest.raises(MalformedBatch) as info:
        get_engine("vllm").adapter.decode_kv_events(frames)
    assert info.value.seq == seq

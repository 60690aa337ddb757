"""KV event wire decoding (vLLM's exact bytes) and the per-worker applier (hash rebuild, sequence handling)."""

from __future__ import annotations

import dataclasses
import importlib.util
import random
from typing import Any

import msgpack
import pytest

from litellm_disagg.engines.vllm import kv_events
from litellm_disagg.engines.vllm.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    MalformedBatch,
    decode_message,
    decode_payload,
)
from litellm_disagg.routing.kv.block_hash import chain_hashes, root_hash
from litellm_disagg.routing.kv.event_applier import EventApplier
from litellm_disagg.routing.kv.prefix_index import PrefixIndex
from tests.kv import vllm_wire as wire

# Recorded from vLLM 0.32's own encoder (msgspec.msgpack.Encoder().encode(KVEventBatch(...))):
#   KVEventBatch(ts=1.5, events=[
#       BlockStored(block_hashes=[2**64-1, 7], parent_block_hash=12345678901234567890, token_ids=[1,2,3,4],
#                   block_size=2, lora_id=None, medium="GPU", lora_name=None, extra_keys=[None,None], group_idx=0),
#       BlockRemoved(block_hashes=[7], medium="GPU", group_idx=0), AllBlocksCleared()], data_parallel_rank=0)
GOLDEN_1 = bytes.fromhex(
    "93cb3ff8000000000000938aa474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657392cfffffffffffffffff07b170"
    "6172656e745f626c6f636b5f68617368cfab54a98ceb1f0ad2a9746f6b656e5f6964739401020304aa626c6f636b5f73697a6502a76c6f"
    "72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0aa65787472615f6b65797392c0c0a967726f75705f696478008"
    "4a474797065ac426c6f636b52656d6f766564ac626c6f636b5f6861736865739107a66d656469756da3475055a967726f75705f69647"
    "80081a474797065b0416c6c426c6f636b73436c656172656400"
)
#   KVEventBatch(ts=2.0, events=[BlockStored(block_hashes=[b"\x01"*32], parent_block_hash=None, token_ids=[5,6],
#                block_size=2, lora_id=None, medium="GPU", lora_name=None)])   (bytes hashes, rank left None)
GOLDEN_2 = bytes.fromhex(
    "93cb40000000000000009188a474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657391c420010101010101010101"
    "0101010101010101010101010101010101010101010101b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f6964739205"
    "06aa626c6f636b5f73697a6502a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0c0"
)


def golden_1_events() -> list[wire.Event]:
    return [
        wire.stored([2**64 - 1, 7], 12345678901234567890, [1, 2, 3, 4], 2, extra_keys=[None, None]),
        wire.removed([7]),
        wire.cleared(),
    ]


def test_test_encoder_matches_recorded_vllm_bytes() -> None:
    assert wire.payload(golden_1_events(), ts=1.5, rank=0) == GOLDEN_1
    golden_2 = [wire.stored([b"\x01" * 32], None, [5, 6], 2, group_idx=None)]
    assert wire.payload(golden_2, ts=2.0, rank=None) == GOLDEN_2


@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
def test_recorded_bytes_still_match_the_installed_vllm() -> None:
    import msgspec
    from vllm.distributed import kv_events as v

    batch = v.KVEventBatch(
        ts=1.5,
        events=[
            v.BlockStored(
                block_hashes=[2**64 - 1, 7],
                parent_block_hash=12345678901234567890,
                token_ids=[1, 2, 3, 4],
                block_size=2,
                lora_id=None,
                medium="GPU",
                lora_name=None,
                extra_keys=[None, None],
                group_idx=0,
            ),
            v.BlockRemoved(block_hashes=[7], medium="GPU", group_idx=0),
            v.AllBlocksCleared(),
        ],
        data_parallel_rank=0,
    )
    assert msgspec.msgpack.Encoder().encode(batch) == GOLDEN_1


def test_decode_vllm_bytes() -> None:
    batch = decode_message([b"kv", (41).to_bytes(8, "big"), GOLDEN_1])
    assert batch.seq == 41 and batch.ts == 1.5 and batch.data_parallel_rank == 0
    assert batch.events == [
        BlockStored(
            [2**64 - 1, 7], 12345678901234567890, [1, 2, 3, 4], 2, medium="GPU", group_idx=0, extra_keys=[None, None]
        ),
        BlockRemoved([7], medium="GPU", group_idx=0),
        AllBlocksCleared(),
    ]
    second = decode_payload(0, GOLDEN_2)
    assert second.data_parallel_rank is None
    assert second.events == [BlockStored([b"\x01" * 32], None, [5, 6], 2, medium="GPU")]


def test_decode_older_array_like_events_and_lora_id() -> None:
    raw = msgpack.packb(
        [
            3.0,
            [
                ["BlockStored", [5, 6], None, [1, 2, 3, 4], 2, 7, "GPU"],
                ["BlockRemoved", [5], "GPU"],
                ["AllBlocksCleared"],
                ["SomethingNew", 1],
            ],
        ]
    )
    batch = decode_payload(0, raw)
    assert batch.data_parallel_rank is None
    assert batch.events == [
        BlockStored([5, 6], None, [1, 2, 3, 4], 2, medium="GPU", lora_name="7"),
        BlockRemoved([5], medium="GPU"),
        AllBlocksCleared(),
    ]


@pytest.mark.parametrize(
    "frames",
    [
        [b"kv", b"\x00" * 8],
        [b"kv", b"\x00" * 7, wire.payload([])],
        [b"kv", b"\x00" * 8, b"\xc1"],
        [b"kv", b"\x00" * 8, msgpack.packb({"ts": 1})],
        [b"kv", b"\x00" * 8, msgpack.packb([1.0, [{"type": "BlockStored", "block_hashes": [1]}]])],
        # unhashable or odd engine hashes and token ids: refused whole, before any of the batch is applied
        [b"kv", b"\x00" * 8, msgpack.packb([1.0, [{"type": "BlockRemoved", "block_hashes": [1, [2]]}]])],
        [b"kv", b"\x00" * 8, msgpack.packb([1.0, [{"type": "BlockRemoved", "block_hashes": [{"a": 1}]}]])],
        [b"kv", b"\x00" * 8, msgpack.packb([1.0, [{"type": "BlockRemoved", "block_hashes": [1.5]}]])],
        [
            b"kv",
            b"\x00" * 8,
            msgpack.packb(
                [
                    1.0,
                    [
                        {
                            "type": "BlockStored",
                            "block_hashes": [[1]],
                            "parent_block_hash": None,
                            "token_ids": [1] * 16,
                            "block_size": 16,
                        }
                    ],
                ]
            ),
        ],
        [
            b"kv",
            b"\x00" * 8,
            msgpack.packb(
                [
                    1.0,
                    [
                        {
                            "type": "BlockStored",
                            "block_hashes": [1],
                            "parent_block_hash": None,
                            "token_ids": [1] * 15 + ["x"],
                            "block_size": 16,
                        }
                    ],
                ]
            ),
        ],
        [b"kv", b"\x00" * 8, msgpack.packb([1.0, [["BlockRemoved", [[1, 2]], "GPU"]]])],
    ],
)
def test_malformed_messages(frames: list[bytes]) -> None:
    with pytest.raises(MalformedBatch):
        decode_message(frames)


# -- fast (typed msgspec) path and generic fallback -------------------------------------------------------------------


def outcome(decode: Any, payload: bytes) -> str:
    """What decoding gives, spelled strictly (``repr`` tells ``True`` from ``1`` and ``1`` from ``1.0``)."""
    try:
        return repr(decode(7, payload))
    except MalformedBatch:
        return "MalformedBatch"


def typed_shape(payload: bytes) -> str | None:
    """Which typed decoder accepts the payload (None: the generic path reads it)."""
    for shape, decode in (("map", kv_events._decode_map_batch), ("array", kv_events._decode_array_batch)):
        try:
            decode(payload)
        except Exception:
            continue
        return shape
    return None


@pytest.fixture
def no_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(seq: int, payload: bytes) -> EventBatch:
        raise AssertionError("the generic path was used")

    monkeypatch.setattr(kv_events, "_decode_generic", fail)


@pytest.fixture
def fallbacks(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    seen: list[bytes] = []
    generic = kv_events._decode_generic

    def spy(seq: int, payload: bytes) -> EventBatch:
        seen.append(payload)
        return generic(seq, payload)

    monkeypatch.setattr(kv_events, "_decode_generic", spy)
    return seen


def test_vllm_bytes_take_the_fast_path(no_fallback: None) -> None:
    assert decode_payload(41, GOLDEN_1).events[0] == BlockStored(
        [2**64 - 1, 7], 12345678901234567890, [1, 2, 3, 4], 2, medium="GPU", group_idx=0, extra_keys=[None, None]
    )
    assert decode_payload(0, GOLDEN_2).events == [BlockStored([b"\x01" * 32], None, [5, 6], 2, medium="GPU")]
    assert decode_payload(1, wire.payload([])).events == []


@pytest.mark.parametrize("hashes", [[1, 2**64 - 1], [b"\x07" * 32, b"\x08" * 32], [-5, b"\x00"]])
@pytest.mark.parametrize("shape", ["map", "array"])
def test_fast_path_reads_both_shapes_and_both_hash_kinds(no_fallback: None, shape: str, hashes: list[Any]) -> None:
    if shape == "map":
        events: list[Any] = [
            wire.stored(hashes, hashes[0], [1, 2, 3, 4], 2, lora_id=3, extra_keys=[None, ["mm", 1]]),
            wire.removed(hashes[:1], group_idx=None),
            wire.cleared(),
            {"type": "BlockStored", "block_hashes": hashes, "token_ids": [5, 6, 7, 8], "block_size": 2},  # minimal
        ]
    else:
        events = [
            ["BlockStored", hashes, hashes[0], [1, 2, 3, 4], 2, 3, "GPU", None, [None, ["mm", 1]], 0],
            ["BlockRemoved", hashes[:1], "GPU"],
            ["AllBlocksCleared"],
            ["BlockStored", hashes, None, [5, 6, 7, 8], 2],  # minimal
        ]
    batch = decode_payload(3, msgpack.packb([2, events]))  # an int ts, no rank
    assert (batch.seq, batch.ts, batch.data_parallel_rank) == (3, 2.0, None) and type(batch.ts) is float
    assert batch.events == [
        BlockStored(hashes, hashes[0], [1, 2, 3, 4], 2, "GPU", "3", 0, [None, ["mm", 1]]),
        BlockRemoved(hashes[:1], "GPU"),
        AllBlocksCleared(),
        BlockStored(hashes, None, [5, 6, 7, 8], 2),
    ]
    assert [type(e) for e in batch.events] == [BlockStored, BlockRemoved, AllBlocksCleared, BlockStored]


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        # an event type this module does not know: skipped, the rest read
        (
            [wire.cleared(), {"type": "SomethingNew", "x": 1}, wire.removed([4])],
            [AllBlocksCleared(), BlockRemoved([4], "GPU", 0)],
        ),
        ([{"no": "type"}, 5, "text", None, []], []),
        # odd values in optional fields: read as the generic path always read them
        (
            [wire.removed([4], medium=5), wire.removed([5], group_idx=True)],
            [BlockRemoved([4], None, 0), BlockRemoved([5], "GPU", None)],
        ),
        (
            [wire.stored([1], "p", [1, 2], 2, lora_id=True, group_idx="g")],
            [BlockStored([1], None, [1, 2], 2, "GPU", "True", None)],
        ),
        (
            [wire.stored([1], True, [1, 2], 2, lora_name=7, extra_keys={"a": 1})],
            [BlockStored([1], True, [1, 2], 2, "GPU", "7", 0)],
        ),
        # both shapes in one batch
        ([wire.cleared(), ["BlockRemoved", [9]]], [AllBlocksCleared(), BlockRemoved([9])]),
    ],
)
def test_what_the_typed_decoders_reject_goes_the_generic_way(
    fallbacks: list[bytes], events: list[Any], expected: list[Any]
) -> None:
    payload = msgpack.packb([1.0, events, 0])
    assert decode_payload(0, payload).events == expected
    assert fallbacks == [payload]


def test_batch_fields_of_odd_types_go_the_generic_way(fallbacks: list[bytes]) -> None:
    assert decode_payload(0, msgpack.packb(["when", []])).ts == 0.0
    assert decode_payload(0, msgpack.packb([1.0, [], "rank"])).data_parallel_rank is None
    assert len(fallbacks) == 2


@pytest.mark.parametrize(
    "payload",
    [
        b"\xc1",  # not msgpack
        msgpack.packb([1.0, []]) + b"\x00",  # trailing bytes
        msgpack.packb([1.0]),
        msgpack.packb([1.0, {"type": "BlockStored"}]),
        msgpack.packb([1.0, [wire.removed([1]) | {"block_hashes": None}]]),
        msgpack.packb([1.0, [{k: v for k, v in wire.stored([1], None, [1, 2], 2).items() if k != "token_ids"}]]),
        msgpack.packb([1.0, [wire.stored([1], None, [1, 2], 2.0)]]),  # type: ignore[arg-type]
        msgpack.packb([1.0, [["BlockStored", [1], None, [1, 2]]]]),  # array-like, no block size
        msgpack.packb([1.0, [["BlockRemoved"]]]),
    ],
)
def test_malformed_payloads_still_raise(fallbacks: list[bytes], payload: bytes) -> None:
    with pytest.raises(MalformedBatch):
        decode_payload(0, payload)
    assert fallbacks == [payload]


def random_value(rng: random.Random, usual: list[Any], odd: list[Any]) -> Any:
    return rng.choice(usual) if rng.random() < 0.85 else rng.choice(odd)


def random_event(rng: random.Random) -> Any:
    hashes = [
        rng.choice([rng.getrandbits(64), -rng.getrandbits(63), rng.randbytes(32)]) for _ in range(rng.randrange(4))
    ]
    fields: dict[str, Any] = {
        "block_hashes": random_value(rng, [hashes], [None, "h", [1.5], [True], [[1]]]),
        "parent_block_hash": random_value(rng, [None, rng.getrandbits(64), b"\x01" * 32], ["p", True, 1.0]),
        "token_ids": random_value(rng, [[rng.randrange(1000) for _ in range(2 * len(hashes))]], [None, ["t"], [True]]),
        "block_size": random_value(rng, [2, 16], [None, 2.0, True, "16"]),
        "lora_id": random_value(rng, [None, 0, 3], ["x", True, 1.5]),
        "medium": random_value(rng, ["GPU", "CPU", None], [5, b"GPU", True]),
        "lora_name": random_value(rng, [None, "sql", ""], [7, True, [1]]),
        "extra_keys": random_value(rng, [None, [None] * len(hashes), [["mm", 1]] * len(hashes)], ["x", {"a": 1}, 3]),
        "group_idx": random_value(rng, [None, 0, 1], [True, "g", 1.5]),
    }
    kind = random_value(rng, ["BlockStored", "BlockRemoved", "AllBlocksCleared"], ["Other", 3, None, ""])
    names = {
        "BlockStored": list(fields),
        "BlockRemoved": ["block_hashes", "medium", "group_idx"],
    }.get(kind, [])  # type: ignore[call-overload]
    if rng.random() < 0.5:  # map-encoded, some fields left out
        event = {"type": kind} | {n: fields[n] for n in names if rng.random() < 0.9}
        if rng.random() < 0.1:
            event["future_field"] = [1, {"x": None}]
        return event if rng.random() < 0.97 else [event, 1][rng.randrange(2)]
    return [kind, *(fields[n] for n in names)][: rng.randrange(1, len(names) + 3)]  # array-like, maybe cut short


def random_payload(rng: random.Random) -> bytes:
    events = [random_event(rng) for _ in range(rng.randrange(4))]
    if rng.random() < 0.5:  # one shape per batch, as real engines send them
        events = (
            [e for e in events if isinstance(e, dict)]
            if rng.random() < 0.5
            else [e for e in events if isinstance(e, list)]
        )
    batch: list[Any] = [random_value(rng, [1.5, 2], ["ts", True, None]), events]
    if rng.random() < 0.8:
        batch.append(random_value(rng, [0, 3, None], [True, "r"]))
        if rng.random() < 0.1:
            batch.append("extra")
    return msgpack.packb(batch if rng.random() < 0.98 else {"ts": 1.0}, use_bin_type=True)


def test_fast_path_and_generic_path_agree_on_random_payloads() -> None:
    rng = random.Random(1234)
    taken = {"map": 0, "array": 0, None: 0}
    for _ in range(4000):
        payload = random_payload(rng)
        taken[typed_shape(payload)] += 1
        assert outcome(decode_payload, payload) == outcome(kv_events._decode_generic, payload), msgpack.unpackb(payload)
    assert min(taken.values()) > 100, taken  # each path exercised


# -- applier ----------------------------------------------------------------------------------------------------------

BS = 4


def toks(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 30_000) for _ in range(n)]


class Engine:
    """Stands in for one vLLM engine's block pool: salted hashes of its own, events as vLLM shapes them."""

    def __init__(self, salt: int = 99) -> None:
        self.salt = salt

    def hashes(self, tokens: list[int]) -> list[int]:
        out, h = [], self.salt
        for i in range(0, len(tokens) - BS + 1, BS):
            h = hash((h, "engine", tuple(tokens[i : i + BS]))) & (2**64 - 1)
            out.append(h)
        return out

    def store(self, tokens: list[int], cached_blocks: int = 0, **kw: object) -> BlockStored:
        """The event for caching ``tokens``' full blocks after ``cached_blocks`` were already cached."""
        hs = self.hashes(tokens)
        parent = hs[cached_blocks - 1] if cached_blocks else None
        fields: dict[str, object] = {"medium": "GPU", "group_idx": 0} | kw
        new_tokens = tokens[cached_blocks * BS : len(hs) * BS]
        return BlockStored(hs[cached_blocks:], parent, new_tokens, BS, **fields)  # type: ignore[arg-type]


@pytest.fixture
def index() -> PrefixIndex:
    idx = PrefixIndex()
    idx.add_worker("w", capacity_blocks=1000)
    return idx


def applier(index: PrefixIndex, **kw: object) -> EventApplier:
    return EventApplier("w", index, block_size=BS, capacity_blocks=1000, **kw)  # type: ignore[arg-type]


def batch(seq: int, *events: object) -> EventBatch:
    return EventBatch(seq=seq, ts=0.0, events=list(events))  # type: ignore[arg-type]


def test_event_built_hashes_equal_request_built_hashes(index: PrefixIndex) -> None:
    engine, app = Engine(), applier(index)
    prompt = toks(30)  # 7 full blocks, 2 tokens left over
    app.apply(batch(0, engine.store(prompt[:12])))  # first request: 3 blocks
    app.apply(batch(1, engine.store(prompt, cached_blocks=3)))  # a longer one continues the cached prefix
    ours = chain_hashes(prompt, BS)
    assert len(ours) == 7
    assert index.overlap(ours) == {"w": 7}
    assert app.stats.stored_blocks == 7 and app.stats.skipped_blocks == 0


def test_removed_and_all_cleared(index: PrefixIndex) -> None:
    engine, app = Engine(), applier(index)
    prompt = toks(16)
    app.apply(batch(0, engine.store(prompt)))
    app.apply(batch(1, BlockRemoved([engine.hashes(prompt)[2]], medium="GPU", group_idx=0)))
    assert index.overlap(chain_hashes(prompt, BS)) == {"w": 2}
    app.apply(batch(2, AllBlocksCleared()))
    assert index.overlap(chain_hashes(prompt, BS)) == {}
    assert app.stats.clears == 1 and app.stats.removed_blocks == 1


def test_unknown_parent_is_skipped_router_started_late(index: PrefixIndex) -> None:
    engine, app = Engine(), applier(index)
    prompt = toks(24)
    app.apply(batch(500, engine.store(prompt, cached_blocks=2)))  # the first 2 blocks were cached before we listened
    assert app.stats.skipped_blocks == 4 and index.blocks("w") == 0
    other = toks(8, seed=5)
    app.apply(batch(501, engine.store(other)))  # a new prefix is indexed as it arrives
    assert index.overlap(chain_hashes(other, BS)) == {"w": 2}


@pytest.mark.parametrize(
    ("event", "ignored", "skipped"),
    [
        (lambda e, t: e.store(t, medium="CPU"), 1, 0),
        (lambda e, t: e.store(t, group_idx=1), 1, 0),
        (lambda e, t: BlockStored(e.hashes(t), None, t, BS * 2, medium="GPU"), 0, 4),  # another block size
        (lambda e, t: BlockStored(e.hashes(t)[:3], None, t, BS, medium="GPU"), 0, 3),  # null blocks left out
    ],
)
def test_events_that_are_not_applied(index: PrefixIndex, event: Any, ignored: int, skipped: int) -> None:
    engine, app = Engine(), applier(index)
    app.apply(batch(0, event(engine, toks(16))))
    assert (app.stats.ignored_events, app.stats.skipped_blocks, index.blocks("w")) == (ignored, skipped, 0)


def test_medium_none_counts_as_gpu_and_cpu_removal_is_ignored(index: PrefixIndex) -> None:
    engine, app = Engine(), applier(index)
    prompt = toks(8)
    app.apply(batch(0, engine.store(prompt, medium=None)))
    app.apply(batch(1, BlockRemoved(engine.hashes(prompt), medium="CPU")))
    assert index.blocks("w") == 2


def test_extra_keys_stop_the_chain(index: PrefixIndex) -> None:
    engine, app = Engine(), applier(index)
    prompt = toks(16)
    app.apply(batch(0, engine.store(prompt, extra_keys=[None, ("mm-hash", 0), None, None])))
    assert index.overlap(chain_hashes(prompt, BS)) == {"w": 1}
    assert app.stats.skipped_blocks == 3


def test_lora_blocks_chain_from_the_adapter_namespace(index: PrefixIndex) -> None:
    engine, app = Engine(), applier(index)
    prompt = toks(8)
    app.apply(batch(0, engine.store(prompt, lora_name="sql-adapter")))
    assert index.overlap(chain_hashes(prompt, BS)) == {}
    assert index.overlap(chain_hashes(prompt, BS, root_hash("sql-adapter"))) == {"w": 2}


@pytest.mark.parametrize(("policy", "blocks_after_gap"), [("keep", 2), ("clear", 0)])
def test_sequence_gap(index: PrefixIndex, policy: str, blocks_after_gap: int) -> None:
    engine, app = Engine(), applier(index, on_gap=policy)
    prompt = toks(8)
    app.apply(batch(10, engine.store(prompt)))
    app.apply(
        batch(
            13,
        )
    )  # 11 and 12 lost
    assert app.stats.gaps == 1 and index.blocks("w") == blocks_after_gap
    # translations survive a gap: an extension of the cached prefix is still rebuilt
    longer = prompt + toks(4, seed=9)
    app.apply(batch(14, engine.store(longer, cached_blocks=2)))
    assert index.holds("w", chain_hashes(longer, BS)[2])


def test_duplicate_is_ignored_and_going_back_means_a_new_engine(index: PrefixIndex) -> None:
    engine, app = Engine(), applier(index)
    prompt = toks(8)
    app.apply(batch(5, engine.store(prompt)))
    app.apply(batch(5, AllBlocksCleared()))  # duplicate of batch 5: ignored
    assert index.blocks("w") == 2 and app.stats.clears == 0
    restarted = Engine(salt=7)
    app.apply(batch(0, restarted.store(prompt[:4])))
    assert app.stats.restarts == 1 and index.blocks("w") == 1
    # the old engine's translations are gone: its hashes as parents are unknown
    app.apply(batch(1, engine.store(prompt + toks(4, 3), cached_blocks=2)))
    assert app.stats.skipped_blocks == 1


def test_undecodable_batch_counts_as_lost(index: PrefixIndex) -> None:
    engine, app = Engine(), applier(index, on_gap="clear")
    app.apply(batch(0, engine.store(toks(8))))
    app.lost(1)
    assert app.stats.malformed == 1 and app.stats.gaps == 1 and index.blocks("w") == 0
    app.apply(batch(2, engine.store(toks(4, 1))))
    assert app.stats.gaps == 1  # 1 was accounted for


def test_translation_table_is_pruned_when_removals_were_lost() -> None:
    index = PrefixIndex()
    index.add_worker("w", capacity_blocks=4)
    app = EventApplier("w", index, block_size=BS, capacity_blocks=4)
    engine = Engine()
    for i in range(400):  # 400 one-block prompts, no removal ever arrives
        app.apply(batch(i, engine.store(toks(4, seed=i))))
    assert index.blocks("w") == 4
    assert len(app._ours) <= 2 * 4 + 1024


class RecordingIndex(PrefixIndex):
    """A prefix index that notes each update call the applier makes."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, int]] = []
        self.add_worker("w", capacity_blocks=1000)

    def stored(self, worker_id: str, hashes: Any) -> None:
        hashes = list(hashes)
        self.calls.append(("stored", len(hashes)))
        super().stored(worker_id, hashes)

    def removed(self, worker_id: str, hashes: Any) -> None:
        hashes = list(hashes)
        self.calls.append(("removed", len(hashes)))
        super().removed(worker_id, hashes)


def test_one_batch_of_many_events_equals_one_batch_per_event() -> None:
    engine = Engine()
    p1, p2, p3 = toks(16, 1), toks(12, 2), toks(8, 3)
    h1, h2, h3 = engine.hashes(p1), engine.hashes(p2), engine.hashes(p3)
    events = [
        engine.store(p1[:8]),
        engine.store(p1, cached_blocks=2),  # its parent was stored by the event before, in the same batch
        engine.store(p2),
        BlockRemoved([h1[3]], medium="GPU", group_idx=0),  # vLLM evicts one block per event
        BlockRemoved([h2[2], 12345], medium="GPU", group_idx=0),  # 12345: never stored
        BlockRemoved([h2[1]], medium="CPU"),  # another tier: ignored
        engine.store(p3),
        engine.store(p2 + toks(4, 9), cached_blocks=3),  # its parent was removed earlier in the batch: skipped
        BlockRemoved([h3[0]], medium="GPU", group_idx=0),
    ]
    one = RecordingIndex()
    app = EventApplier("w", one, block_size=BS, capacity_blocks=1000)
    app.apply(batch(0, *events))
    assert one.calls == [("stored", 7), ("removed", 2), ("stored", 2), ("removed", 1)]

    many = RecordingIndex()
    each = EventApplier("w", many, block_size=BS, capacity_blocks=1000)
    for seq, event in enumerate(events):
        each.apply(batch(seq, event))
    assert len(many.calls) == 7
    for prompt in (p1, p2, p3):
        assert one.overlap(chain_hashes(prompt, BS)) == many.overlap(chain_hashes(prompt, BS))
    assert one.overlap(chain_hashes(p1, BS)) == {"w": 3} and one.blocks("w") == many.blocks("w") == 6
    assert app._ours == each._ours
    assert dataclasses.replace(app.stats, batches=0, last_seq=0, last_applied_at=None) == dataclasses.replace(
        each.stats, batches=0, last_seq=0, last_applied_at=None
    )
    assert (app.stats.stored_blocks, app.stats.removed_blocks, app.stats.skipped_blocks) == (9, 3, 1)
    assert app.stats.ignored_events == 1


def test_all_blocks_cleared_inside_a_batch(index: PrefixIndex) -> None:
    engine, app = Engine(), applier(index)
    before, after = toks(8, 1), toks(8, 2)
    app.apply(batch(0, engine.store(before), AllBlocksCleared(), engine.store(after)))
    assert index.overlap(chain_hashes(before, BS)) == {} and index.overlap(chain_hashes(after, BS)) == {"w": 2}
    assert app.stats.clears == 1 and index.blocks("w") == 2


def test_translation_table_is_pruned_with_many_events_per_batch() -> None:
    index = PrefixIndex()
    index.add_worker("w", capacity_blocks=4)
    app = EventApplier("w", index, block_size=BS, capacity_blocks=4)
    engine = Engine()
    for seq in range(40):  # 2000 one-block prompts, 50 per batch, no removal ever arrives
        app.apply(batch(seq, *(engine.store(toks(4, seed=seq * 50 + i)) for i in range(50))))
    assert index.blocks("w") == 4
    assert len(app._ours) <= 2 * 4 + 1024
    assert app.stats.stored_blocks == 2000

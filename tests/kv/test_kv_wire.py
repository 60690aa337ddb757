"""The compiled KV-event path (``routing/kv/_kvwire.pyx``: ``apply_message``) against the Python path
(``decode_message`` + ``EventApplier.apply``), on the same messages: equal index and applier state, message by
message; random streams, fuzzed messages (truncations, bit flips, insertions) and hand-made hostile payloads, which
it must refuse (leaving them to the Python path) without crashing or reading past the bytes.

Skipped in a deliberately pure-Python run (``LITELLM_DISAGG_PURE_PYTHON``); fails when the extension is not built.
"""

from __future__ import annotations

import dataclasses
import os
import random
import struct
from typing import Any

import msgpack
import pytest

from litellm_disagg.engines.base import KVEventWire, MalformedBatch
from litellm_disagg.engines.sglang import SGLANG
from litellm_disagg.engines.trtllm import TRTLLM
from litellm_disagg.engines.vllm import VLLM
from litellm_disagg.engines.vllm.kv_events import decode_message
from litellm_disagg.routing.kv import native
from litellm_disagg.routing.kv.block_hash import chain_hashes, chain_hashes_py, root_hash
from litellm_disagg.routing.kv.event_applier import EventApplier
from litellm_disagg.routing.kv.event_subscriber import compiled_path
from litellm_disagg.routing.kv.prefix_index import PrefixIndex

pytestmark = pytest.mark.skipif(
    os.environ.get(native.DISABLE_ENV, "") not in ("", "0"), reason="pure-Python run requested"
)

BS = 4
CAPACITY = 48
"""Small, so the LRU trims and the translation table is pruned (past 2 * 48 + 1024 entries) within a test."""

Frames = list[bytes]


def test_the_compiled_path_is_built_and_selected_for_vllm_wire() -> None:
    assert native.wire is not None, f"_kvwire not built or core not in use: {native.WHY} (scripts/build_native.sh)"
    assert VLLM.adapter.kv_event_wire is KVEventWire.VLLM and SGLANG.adapter.kv_event_wire is KVEventWire.VLLM
    assert TRTLLM.adapter.kv_event_wire is None
    assert compiled_path(KVEventWire.VLLM) is native.wire.apply_message
    assert compiled_path(None) is None


# -- the two paths ------------------------------------------------------------------------------------------------------


def fresh(*, pure: bool = False, **kw: Any) -> tuple[PrefixIndex, EventApplier]:
    """``pure``: the applier's translation table is a dict (the reference) instead of ``_kvwire.Translations``."""
    index = PrefixIndex(clock=lambda: 0.0)
    index.add_worker("other", capacity_blocks=CAPACITY)
    index.add_worker("w", capacity_blocks=CAPACITY)
    applier = EventApplier("w", index, block_size=BS, capacity_blocks=CAPACITY, **kw)
    assert native.wire is not None and type(applier._ours) is native.wire.Translations
    if pure:
        applier._table = dict
        applier._ours = {}
    return index, applier


def python_path(applier: EventApplier, frames: Frames) -> None:
    """What the subscriber does with a message without the compiled path."""
    try:
        batch = decode_message(frames)
    except MalformedBatch as exc:
        applier.lost(exc.seq)
        return
    try:
        applier.apply(batch)
    except Exception:  # noqa: BLE001 - as the subscriber: e.g. unhashable engine hashes the generic decoder let through
        return


def compiled(applier: EventApplier, frames: Frames) -> bool:
    """What the subscriber does with the compiled path: True when it took the message."""
    assert native.wire is not None
    if native.wire.apply_message(applier, frames):
        return True
    python_path(applier, frames)
    return False


def state(index: PrefixIndex, applier: EventApplier) -> object:
    slots = [
        None if s is None else (s.worker_id, list(s.held.items()), list(s.predicted.items())) for s in index._slots
    ]
    stats = dataclasses.replace(applier.stats, last_applied_at=None, last_batch_ts=None)
    held = list(index._held.items())
    return held, slots, dict(index._predicted), dict(applier._ours.items()), stats, repr(applier.stats.last_batch_ts)


# -- random streams -----------------------------------------------------------------------------------------------------


class Stream:
    """One engine's messages: chained stores of a few documents (some continuing a cached prefix), removals, clears,
    odd fields, sequence gaps / duplicates / restarts, and now and then a message only the Python path reads."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.seq = 0
        self.docs = [[self.token() for _ in range(BS * self.rng.randrange(2, 30))] for _ in range(8)]
        self.salt = self.rng.getrandbits(32)
        self.bytes_hashes = self.rng.random() < 0.3
        self.live: list[Any] = []

    def token(self) -> int:
        rng = self.rng
        roll = rng.random()
        if roll < 0.02:
            return rng.choice([2**64 - 1, 2**63, 2**63 - 1, -(2**63), -1, 0, 2**61 - 1, -(2**61) + 1])
        if roll < 0.05:
            return rng.randrange(-(2**63), 2**64)
        return rng.randrange(1000)

    def engine_hashes(self, doc: list[int]) -> list[Any]:
        out: list[Any] = []
        h = self.salt
        for i in range(len(doc) // BS):
            h = hash((h, tuple(doc[i * BS : (i + 1) * BS]))) & (2**64 - 1)
            out.append(h.to_bytes(8, "big") * 4 if self.bytes_hashes else h)
        return out

    def stored(self) -> dict[str, Any]:
        rng = self.rng
        doc = rng.choice(self.docs)
        hashes = self.engine_hashes(doc)
        start = 0 if rng.random() < 0.4 else rng.randrange(len(hashes))
        end = rng.randrange(start, len(hashes)) + 1
        parent: Any = hashes[start - 1] if start else None
        if rng.random() < 0.05:
            parent = rng.getrandbits(64)  # never seen: skipped
        tokens = doc[start * BS : end * BS]
        event: dict[str, Any] = {
            "type": "BlockStored",
            "block_hashes": hashes[start:end],
            "parent_block_hash": parent,
            "token_ids": tokens,
            "block_size": BS,
            "lora_id": None,
            "medium": "GPU",
            "lora_name": None,
        }
        roll = rng.random()
        if roll < 0.04:
            event["block_size"] = rng.choice([BS * 2, 1, 0, -BS, 2**64 - 1])
        elif roll < 0.07:
            event["token_ids"] = tokens + [1]
        elif roll < 0.10:
            event["lora_name"] = rng.choice(["sql", "", "ünï"])
        elif roll < 0.12:
            event["lora_id"] = rng.choice([0, 3, 2**64 - 1, -7])
        elif roll < 0.16:
            event["medium"] = rng.choice(["CPU", None, "gpu", "ÜPU"])
        elif roll < 0.18:
            event["extra_keys"] = [None] * (end - start)
        elif roll < 0.20:
            event["extra_keys"] = [None] + [["mm", 1]] * (end - start - 1)  # the Python path reads these
        elif roll < 0.22:
            del event["lora_id"], event["lora_name"], event["medium"]
        if rng.random() < 0.85:
            event["group_idx"] = rng.choice([0, 0, 0, 1, None, 2**64 - 1])
        self.live.extend(hashes[start:end])
        return event

    def removed(self) -> dict[str, Any]:
        rng = self.rng
        if self.live and rng.random() < 0.9:
            count = rng.randrange(1, 9)
            gone, self.live = self.live[:count], self.live[count:]
        else:
            gone = [rng.getrandbits(64) for _ in range(rng.randrange(1, 4))]
        event: dict[str, Any] = {"type": "BlockRemoved", "block_hashes": gone, "medium": "GPU", "group_idx": 0}
        if rng.random() < 0.08:
            event["medium"] = rng.choice(["CPU", None])
        if rng.random() < 0.05:
            event["group_idx"] = rng.choice([1, None])
        return event

    def event(self) -> Any:
        rng = self.rng
        roll = rng.random()
        event: Any
        if roll < 0.55:
            event = self.stored()
        elif roll < 0.98:
            event = self.removed()
        else:
            event = {"type": "AllBlocksCleared"}
            self.live = []
        roll = rng.random()
        if roll < 0.05:  # the tag last
            event = {k: v for k, v in event.items() if k != "type"} | {"type": event["type"]}
        elif roll < 0.08:
            event["future_field"] = [1, {"x": None, "y": b"\x00"}, "ok", 2.5]
        elif roll < 0.10:
            event = [event["type"], *[v for k, v in event.items() if k != "type"]]  # older vLLM: Python path
        elif roll < 0.11 and event["type"] == "BlockStored":
            event["token_ids"] = [float(t) for t in event["token_ids"]] or [1.0]  # the generic path rejects it
        return event

    def message(self) -> Frames:
        rng = self.rng
        roll = rng.random()
        if roll < 0.03:
            self.seq += rng.randrange(2, 5)  # lost batches
        elif roll < 0.05:
            self.seq -= 1  # a duplicate
        elif roll < 0.055:
            self.seq = 0  # a new engine process
            self.live = []
        events = [self.event() for _ in range(rng.choice([1, 1, 1, 2, 3, 6]))]
        payload = msgpack.packb([rng.choice([1.5, 1700000000.25, 3]), events, rng.choice([0, None, 2])])
        frames = [b"kv", self.seq.to_bytes(8, "big", signed=True), payload]
        self.seq += 1
        if rng.random() < 0.02:
            frames[2] = payload[: rng.randrange(len(payload))]  # cut short: malformed
        return frames


@pytest.mark.parametrize("seed", range(8))
def test_random_streams_give_the_same_state_message_by_message(seed: int) -> None:
    """The Python path on the pure-Python applier (its translations a dict) against the compiled path, with routed
    requests' predictions in between (stores confirm them: through the compiled path's sink, or the index)."""
    stream = Stream(seed)
    py_index, py_applier = fresh(pure=True, on_gap="clear" if seed % 3 == 0 else "keep")
    c_index, c_applier = fresh(on_gap="clear" if seed % 3 == 0 else "keep")
    taken = 0
    messages = [stream.message() for _ in range(600)]
    routed = random.Random(seed + 100)
    through_sink = 0
    for frames in messages:
        if routed.random() < 0.1:  # the router sends a request: predictions that later stores confirm
            doc = routed.choice(stream.docs)
            predicted = chain_hashes(doc, BS, root_hash(None))[: routed.randrange(1, len(doc) // BS + 1)]
            py_index.record_routed("w", predicted)
            c_index.record_routed("w", predicted)
        python_path(py_applier, frames)
        taken += compiled(c_applier, frames)
        assert state(c_index, c_applier) == state(py_index, py_applier), msgpack.unpackb(frames[2])
        sink = c_applier._sink
        through_sink += sink is not None and sink.valid and sink.fast
    assert through_sink > len(messages) // 2  # the compiled path reached the index through its sink
    stats = c_applier.stats
    assert stats.stored_blocks > 300 and stats.removed_blocks > 100 and stats.skipped_blocks and stats.ignored_events
    assert taken > 0.75 * len(messages)  # the compiled path took most messages
    assert taken < len(messages)  # and some went the Python way


def test_many_translations_are_pruned_the_same_way() -> None:
    """Stores whose removals never come: the translation table outgrows 2 * capacity + 1024 and is pruned."""
    rng = random.Random(5)
    py_index, py_applier = fresh(pure=True)
    c_index, c_applier = fresh()
    for seq in range(300):
        tokens = [rng.randrange(1000) for _ in range(BS * 8)]
        hashes = [rng.getrandbits(64) for _ in range(8)]
        events = [
            {
                "type": "BlockStored",
                "block_hashes": hashes[:4],
                "parent_block_hash": None,
                "token_ids": tokens[:16],
                "block_size": BS,
            },
            {
                "type": "BlockStored",
                "block_hashes": hashes[4:],
                "parent_block_hash": hashes[3],
                "token_ids": tokens[16:],
                "block_size": BS,
            },
            {"type": "BlockRemoved", "block_hashes": hashes[:1]},
        ]
        frames = [b"kv", seq.to_bytes(8, "big"), msgpack.packb([1.0, events, 0])]
        python_path(py_applier, frames)
        assert not native.wire.apply_message(py_applier, frames)  # a dict table: left to the Python path
        assert compiled(c_applier, frames)
        assert state(c_index, c_applier) == state(py_index, py_applier)
    assert len(c_applier._ours) < 2 * CAPACITY + 1024
    assert type(c_applier._ours) is native.wire.Translations and type(py_applier._ours) is dict  # pruned: same type


def _engine_keys(rng: random.Random) -> list[Any]:
    """Engine hashes as vLLM sends them (ints up to 2**64 - 1, bytes) and keys the C cells cannot hold."""
    edges = [0, 1, 2**63 - 1, 2**63, 2**64 - 1, True]
    outside = [-1, -(2**63), 2**64, 2**70, -(2**90), b"", b"\x00" * 32, "s", (1, 2), 1.5]
    return edges + outside + [rng.getrandbits(64) for _ in range(300)] + [rng.getrandbits(8) for _ in range(60)]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_translations_answer_as_a_dict(seed: int) -> None:
    """``_kvwire.Translations`` against a dict on random sets, reads, pops, deletions, updates and clears: growth past
    many resizes, shrinking back, deletions inside probe clusters; values outside int64 go to its dict part."""
    assert native.wire is not None
    rng = random.Random(seed)
    keys = _engine_keys(rng)
    table = native.wire.Translations()
    ref: dict[Any, Any] = {}
    for step in range(30_000):
        e = rng.choice(keys)
        op = rng.random()
        if step > 20_000 and op < 0.6:  # the last third mostly empties the table
            op = 0.8
        if op < 0.4:
            h = rng.choice([0, -1, 2**63 - 1, -(2**63), rng.getrandbits(64) - 2**63])
            if rng.random() < 0.02:
                h = rng.choice([2**63, -(2**63) - 1, "x"])  # not an int64: kept in the dict part
            table[e] = h
            ref[e] = h
        elif op < 0.45:
            pairs = [(rng.choice(keys), rng.getrandbits(63)) for _ in range(rng.randrange(5))]
            table.update(iter(pairs))
            ref.update(pairs)
        elif op < 0.6:
            assert table.get(e) == ref.get(e) and table.get(e, 7) == ref.get(e, 7) and (e in table) == (e in ref)
        elif op < 0.8:
            assert table.pop(e, None) == ref.pop(e, None)
        elif e in ref:
            assert table[e] == ref[e]
            del table[e]
            del ref[e]
        else:
            with pytest.raises(KeyError):
                del table[e]
            with pytest.raises(KeyError):
                table[e]
        if step % 997 == 0:
            assert len(table) == len(ref) and dict(table.items()) == ref and table == ref
            assert set(table) == set(ref) and set(table.keys()) == set(ref)  # True and 1: one key, as in a dict
        if step == 15_000:
            table.clear()
            ref.clear()
            assert len(table) == 0 and table.cells_allocated() == 64
    assert dict(table.items()) == ref
    grown = native.wire.Translations()
    for i in range(100_000):
        grown[i * 7919] = -i
    big = grown.cells_allocated()
    assert big >= 200_000 and len(grown) == 100_000
    for i in range(100_000):
        assert grown.pop(i * 7919) == -i
    assert len(grown) == 0 and grown.cells_allocated() <= 128 and big > 1000 * grown.cells_allocated()


def test_hashes_equal_the_request_side_hashes() -> None:
    """What the compiled path stores is what a request with the same tokens looks up (and the LoRA namespace)."""
    index, applier = fresh()
    tokens = [2**64 - 1, -(2**63), 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]
    events = [
        {
            "type": "BlockStored",
            "block_hashes": [1, 2],
            "parent_block_hash": None,
            "token_ids": tokens[:8],
            "block_size": BS,
            "medium": "GPU",
        },
        {"type": "BlockStored", "block_hashes": [3], "parent_block_hash": 2, "token_ids": tokens[8:], "block_size": BS},
        {
            "type": "BlockStored",
            "block_hashes": [b"x" * 32],
            "parent_block_hash": None,
            "token_ids": tokens[:4],
            "block_size": BS,
            "lora_name": "sql",
        },
        {
            "type": "BlockStored",
            "block_hashes": [b"y" * 32],
            "parent_block_hash": None,
            "token_ids": tokens[:4],
            "block_size": BS,
            "lora_id": 7,
        },
    ]
    assert compiled(applier, [b"kv", (0).to_bytes(8, "big"), msgpack.packb([1.0, events, 0])])
    assert index.overlap(chain_hashes_py(tokens, BS)) == {"w": 3}
    assert index.overlap(chain_hashes(tokens[:4], BS, root_hash("sql"))) == {"w": 1}
    assert index.overlap(chain_hashes(tokens[:4], BS, root_hash("7"))) == {"w": 1}
    assert applier._ours[3] == chain_hashes_py(tokens, BS)[-1]


# -- fuzzing ------------------------------------------------------------------------------------------------------------


def mutate(rng: random.Random, payload: bytes) -> bytes:
    data = bytearray(payload)
    kind = rng.randrange(6)
    if kind == 0 or not data:
        return bytes(data[: rng.randrange(len(data) + 1)])  # truncated
    if kind == 1:
        for _ in range(rng.randrange(1, 4)):  # bit flips
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    elif kind == 2:
        data[rng.randrange(len(data))] = rng.randrange(256)  # one byte replaced
    elif kind == 3:
        data.insert(rng.randrange(len(data) + 1), rng.randrange(256))  # one byte inserted
    elif kind == 4:
        del data[rng.randrange(len(data))]
    else:  # a length-like byte set to a big value
        at = rng.randrange(len(data))
        data[at : at + 1] = rng.choice(
            [
                b"\xdd\xff\xff\xff\xff",
                b"\xdc\xff\xff",
                b"\xdb\x7f\xff\xff\xff",
                b"\xc6\xff\xff\xff\xf0",
                b"\xdf\x00\x01\x00\x00",
                b"\xc9\xff\xff\xff\xff\x01",
            ]
        )
    return bytes(data)


def test_fuzzed_messages_are_applied_the_same_or_refused() -> None:
    """Valid messages mutated at random: the compiled path either applies them exactly as the Python path does, or
    refuses them and the Python path decides (which is then the same by construction). No crash, no exception."""
    rng = random.Random(99)
    stream = Stream(1000)
    base = [stream.message() for _ in range(6)]
    samples = [stream.message() for _ in range(40)]
    accepted = refused = 0
    for case in range(3000):
        frames = rng.choice(samples)
        fuzzed = [frames[0], frames[1], mutate(rng, frames[2])]
        py_index, py_applier = fresh()
        c_index, c_applier = fresh()
        for m in base:
            python_path(py_applier, m)
            compiled(c_applier, m)
        python_path(py_applier, fuzzed)
        if compiled(c_applier, fuzzed):
            accepted += 1
        else:
            refused += 1
        assert state(c_index, c_applier) == state(py_index, py_applier), (case, fuzzed[2].hex())
    assert accepted > 100 and refused > 1000, (accepted, refused)


def _f64(x: float) -> bytes:
    return b"\xcb" + struct.pack(">d", x)


def _key(name: str) -> bytes:
    return msgpack.packb(name)


def _stored_map(extra: bytes = b"", entries: int = 5) -> bytes:
    """A fixmap header for ``entries`` keys and the first four of a valid BlockStored (tag, hashes, tokens, size)."""
    return (
        bytes([0x80 | entries])
        + _key("type")
        + _key("BlockStored")
        + _key("block_hashes")
        + msgpack.packb([1])
        + _key("token_ids")
        + msgpack.packb([1, 2, 3, 4])
        + _key("block_size")
        + msgpack.packb(BS)
        + extra
    )


def _batch(*events: bytes, n: int | None = None) -> bytes:
    count = len(events) if n is None else n
    return b"\x93" + _f64(1.0) + b"\xdd" + count.to_bytes(4, "big") + b"".join(events) + b"\x00"


HOSTILE: list[bytes] = [
    b"",
    b"\xc1",
    b"\x93",
    b"\x93\xcb\x3f\xf0",  # float cut short
    b"\xdd\xff\xff\xff\xff",  # an array of 4 billion items in 5 bytes
    b"\x92" + _f64(1.0) + b"\xdd\xff\xff\xff\xff" + b"\x80",  # 4 billion events claimed
    b"\x92" + _f64(1.0) + b"\x91\xdf\xff\xff\xff\xff",  # a map of 4 billion entries
    b"\x92" + _f64(1.0) + b"\x91\x81\xdb\xff\xff\xff\xff" + b"type",  # a key of 4 GB
    _batch(_stored_map(_key("zz") + b"\x91" * 100_000 + b"\xc0")),  # nested 100,000 deep in an unknown field
    _batch(_stored_map(_key("zz") + b"\x91" * 31 + b"\xc0")),  # nested 31 deep: fine
    _batch(_stored_map(_key("zz") + b"\x91" * 40 + b"\xc0")),  # 40 deep: refused (the Python path reads it)
    _batch(_stored_map(_key("zz") + b"\xc1")),  # an unused type byte
    _batch(_stored_map(_key("zz") + b"\xc9\xff\xff\xff\xff\x01")),  # an ext of 4 GB
    _batch(_stored_map(_key("zz") + b"\xd8\x01" + b"\x00" * 16)),  # a fixext16: skipped
    _batch(_stored_map(_key("zz") + b"\xa1\xff")),  # invalid UTF-8 in a skipped value
    _batch(_stored_map(b"\xa2z\xff" + b"\xc0")),  # invalid UTF-8 in an unknown key
    _batch(_stored_map(_key("medium") + b"\xa3G\xffU")),  # invalid UTF-8 in the medium
    _batch(_stored_map(_key("lora_name") + b"\xa3s\xffl")),
    _batch(_stored_map(b"\x07" + b"\xc0")),  # an integer key
    _batch(_stored_map(_key("block_hashes") + msgpack.packb([2]))),  # a key twice
    _batch(_stored_map(_key("type") + _key("BlockStored"))),  # the tag twice
    _batch(_stored_map(_key("medium") + msgpack.packb(5))),  # wrong types
    _batch(_stored_map(_key("group_idx") + msgpack.packb(1.5))),
    _batch(_stored_map(_key("parent_block_hash") + msgpack.packb("p"))),
    _batch(_stored_map(_key("extra_keys") + msgpack.packb({"a": 1}))),
    _batch(_stored_map(_key("lora_id") + b"\xc3")),
    _batch(_stored_map(), n=2),  # one event fewer than claimed
    _batch(_stored_map(entries=4)),  # the batch's rank then read as a key
    _batch(_stored_map(entries=6)),  # a key past the end
    _batch(b"\x81" + _key("type") + _key("BlockRemoved")),  # no block_hashes
    _batch(b"\x82" + _key("type") + _key("BlockRemoved") + _key("block_hashes") + b"\xdc\xff\xff\x01"),
    _batch(b"\x82" + _key("type") + _key("BlockRemoved") + _key("block_hashes") + b"\x91\xc6\xff\xff\xff\xf0\x00"),
    _batch(b"\x82" + _key("type") + _key("BlockRemoved") + _key("block_hashes") + b"\x91\xcf\x00"),  # int cut short
    _batch(b"\x82" + _key("type") + _key("BlockRemoved") + _key("block_hashes") + b"\x91\xc3"),  # a bool hash
    _batch(b"\x81" + _key("type") + _key("Other")),
    _batch(b"\x80"),  # no tag
    _batch(b"\x90"),  # an array-like event without its tag
    msgpack.packb([1.0, []]) + b"\x00",  # trailing bytes
    msgpack.packb([1.0, [], 1.5]),  # a float rank
    msgpack.packb([True, []]),  # a bool ts
    msgpack.packb({"ts": 1.0, "events": []}),
    msgpack.packb([1.0, [], 0, "more"]),  # a fourth item: the Python path reads it
    msgpack.packb([float("nan"), [], 0]),
    msgpack.packb(
        [
            1.0,
            [
                {
                    "type": "BlockStored",
                    "block_hashes": [1],
                    "parent_block_hash": None,
                    "token_ids": [1, 2, 3, 4.0],
                    "block_size": BS,
                }
            ],
            0,
        ]
    ),
    msgpack.packb(
        [
            1.0,
            [
                {
                    "type": "BlockStored",
                    "block_hashes": [1],
                    "parent_block_hash": None,
                    "token_ids": [2**64 - 1, -(2**63), 0, -1],
                    "block_size": BS,
                }
            ],
            0,
        ]
    ),  # valid extremes
]


@pytest.mark.parametrize("number", range(len(HOSTILE)))
def test_hostile_payloads_are_refused_or_applied_the_same(number: int) -> None:
    payload = HOSTILE[number]
    frames = [b"kv", (0).to_bytes(8, "big"), payload]
    py_index, py_applier = fresh()
    c_index, c_applier = fresh()
    python_path(py_applier, frames)
    compiled(c_applier, frames)
    assert state(c_index, c_applier) == state(py_index, py_applier)


@pytest.mark.parametrize(
    "frames",
    [
        [b"kv", (0).to_bytes(8, "big")],
        [b"kv", (0).to_bytes(7, "big"), msgpack.packb([1.0, []])],
        [b"kv", (0).to_bytes(8, "big"), msgpack.packb([1.0, []]), b"more"],
        [b"kv", (0).to_bytes(8, "big"), bytearray(msgpack.packb([1.0, []]))],
        [b"kv", memoryview((0).to_bytes(8, "big")), msgpack.packb([1.0, []])],
    ],
)
def test_odd_frames_are_left_to_the_python_path(frames: list[Any]) -> None:
    _, applier = fresh()
    assert native.wire is not None
    assert native.wire.apply_message(applier, frames) is False
    assert applier.stats.batches == 0


def test_a_token_id_that_changes_the_list_while_it_is_hashed_is_refused() -> None:
    """The compiled block hash reads the list's items again after anything that may run Python code: a token id
    whose ``__hash__`` empties the list gets an error, not a read of freed memory."""
    tokens: list[int] = []

    class Shrinking(int):
        def __hash__(self) -> int:
            tokens.clear()
            return int.__hash__(self)

    tokens.extend([1, 2, Shrinking(3)] + list(range(4, 40)))
    with pytest.raises(RuntimeError):
        chain_hashes(tokens, 4)


# -- draining the socket ------------------------------------------------------------------------------------------------


def test_drain_reads_the_socket_and_applies_the_same() -> None:
    """``drain`` on a real SUB socket (libzmq's own receive): the same state as the Python path on the same
    messages, including messages of 1, 2 and 4 frames and malformed ones (handed to the fallback, in order)."""
    import zmq

    from litellm_disagg.routing.kv.event_subscriber import compiled_drain

    drain = compiled_drain(KVEventWire.VLLM)
    assert drain is not None and native.wire is not None
    stream = Stream(77)
    messages: list[Frames] = [stream.message() for _ in range(300)]
    for at, odd in ((10, [b"kv"]), (50, [b"kv", (1).to_bytes(8, "big")]), (90, [b"kv", b"\x00" * 8, b"\x90", b"x"])):
        messages.insert(at, odd)
    ctx = zmq.Context()
    try:
        pub = ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.SNDHWM, 0)
        port = pub.bind_to_random_port("tcp://127.0.0.1")
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.RCVHWM, 0)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(f"tcp://127.0.0.1:{port}")
        while not sub.poll(10):  # a PUB drops what it sends before the SUB joined
            pub.send_multipart([b"probe"])
        while sub.poll(50):
            sub.recv_multipart()
        for frames in messages:
            pub.send_multipart(frames)
        py_index, py_applier = fresh()
        c_index, c_applier = fresh()
        for frames in messages:
            python_path(py_applier, frames)
        handed: list[Frames] = []

        def fallback(frames: Frames) -> None:
            handed.append(frames)
            python_path(c_applier, frames)

        received = applied = 0
        while received < len(messages):
            assert sub.poll(5000), (received, len(messages))
            got, done = drain(c_applier, sub.underlying, 7, fallback)
            assert got <= 7
            received += got
            applied += done
        assert state(c_index, c_applier) == state(py_index, py_applier)
        assert received == len(messages) and applied + len(handed) == received
        assert [b"kv"] in handed and [b"kv", b"\x00" * 8, b"\x90", b"x"] in handed
        assert applied > 0.75 * len(messages)
        assert drain(c_applier, sub.underlying, 10, fallback) == (0, 0)  # nothing waiting: returns at once
        sub.close(0)
        pub.close(0)
    finally:
        ctx.term()

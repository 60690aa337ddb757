"""vLLM's KV cache events as they arrive on the wire, decoded into the engine-neutral events of ``engines.base``.

Pure: bytes in, events out.

vLLM's ``ZmqEventPublisher`` sends one message per event batch, three frames::

    topic            bytes (the ``topic`` of --kv-events-config; ours is ``kv``)
    sequence number  8 bytes, big-endian, +1 per batch, starting at 0 when the engine starts
    payload          msgpack of the batch

The batch is a msgspec *array-like* struct ``[ts, events, data_parallel_rank]`` (the rank may be missing or nil).
Each event is a msgspec *tagged* struct. vLLM 0.32 encodes them as maps whose ``"type"`` key names the class, fields
with default values omitted::

    {"type": "BlockStored", "block_hashes": [...], "parent_block_hash": h | nil, "token_ids": [...],
     "block_size": n, "lora_id": ..., "medium": "GPU", "lora_name": ..., "extra_keys": [...], "group_idx": 0, ...}
    {"type": "BlockRemoved", "block_hashes": [...], "medium": "GPU", "group_idx": 0}
    {"type": "AllBlocksCleared"}

Older vLLM releases encoded events array-like (``["BlockStored", block_hashes, parent_block_hash, token_ids,
block_size, lora_id, medium, ...]``); both shapes are read. Block hashes are ints (the default,
``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``) or bytes. A ``BlockStored`` carries only the blocks the engine newly
cached; ``parent_block_hash`` is the engine's hash of the block before them (nil at the start of a sequence).
Event types this module does not know are skipped; a payload that is not a batch raises ``MalformedBatch`` (with the
batch's sequence number when its frame was readable).

Decoding, fast path first: typed ``msgspec`` decoders read a batch straight into structs (no intermediate dicts,
no per-field checks in Python), one for map-encoded events, then one for the older array-like shape. Whatever both
reject (an event type this module does not know, a field of an unexpected type, a missing field, bytes that are not
msgpack) is read again by the generic path, which takes any msgpack, skips unknown events, tolerates odd optional
fields and raises ``MalformedBatch`` for what is not a batch. For every payload the typed decoders accept, both paths
give equal events; the generic path only runs for the rare payloads they reject.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgpack  # type: ignore[import-untyped]  # no stubs; plain unpackb
import msgspec

from litellm_disagg.engines.base import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EngineHash,
    EventBatch,
    KVEvent,
    MalformedBatch,
)


def parse_seq(frame: bytes) -> int:
    if len(frame) != 8:
        raise MalformedBatch(f"sequence frame has {len(frame)} bytes, expected 8")
    return int.from_bytes(frame, "big", signed=True)


def decode_message(frames: Sequence[bytes]) -> EventBatch:
    """One ZMQ message (``[topic, seq, payload]``) as a batch."""
    if len(frames) != 3:
        raise MalformedBatch(f"expected 3 frames (topic, seq, payload), got {len(frames)}")
    frame = frames[1]
    if len(frame) != 8:
        parse_seq(frame)  # raises
    seq = int.from_bytes(frame, "big", signed=True)
    try:
        return decode_payload(seq, frames[2])
    except MalformedBatch as exc:
        exc.seq = seq
        raise


def decode_payload(seq: int, payload: bytes) -> EventBatch:
    # Written out in one function: a few calls per batch would cost as much as decoding a small batch.
    try:
        wire: _MapBatch | _ArrayBatch = _decode_map_batch(payload)
    except Exception:  # msgspec.DecodeError/ValidationError, or TypeError for a payload that is not a buffer
        try:
            wire = _decode_array_batch(payload)
        except Exception:
            return _decode_generic(seq, payload)
    events: list[KVEvent] = []
    for e in wire.events:
        if isinstance(e, (_Stored, _ArrayStored)):
            lora = e.lora_name
            if lora is None and e.lora_id is not None:
                lora = str(e.lora_id)
            fields = (
                e.block_hashes,
                e.parent_block_hash,
                e.token_ids,
                e.block_size,
                e.medium,
                lora,
                e.group_idx,
                e.extra_keys,
            )
            events.append(_tuple_new(BlockStored, fields))
        elif isinstance(e, (_Removed, _ArrayRemoved)):
            events.append(_tuple_new(BlockRemoved, (e.block_hashes, e.medium, e.group_idx)))
        else:
            events.append(_CLEARED)
    batch = _batch_new(EventBatch)
    _set_seq(batch, seq)
    _set_ts(batch, wire.ts)
    _set_events(batch, events)
    _set_rank(batch, wire.data_parallel_rank)
    return batch


# -- fast path: typed msgspec decoders ---------------------------------------------------------------------------------
#
# The structs mirror vLLM's wire types; unknown map keys (fields newer vLLM releases add) are ignored, as are extra
# trailing array items. Optional fields are as lenient as the generic path allows for the types declared here (missing
# -> None); values of any other type fail validation and the payload goes to the generic path, which reads them as it
# always did. Structs are untracked by the cyclic GC (``gc=False``): they hold no cycles and live for one call.


class _Stored(msgspec.Struct, tag="BlockStored", tag_field="type", kw_only=True, gc=False):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None = None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None


class _Removed(msgspec.Struct, tag="BlockRemoved", tag_field="type", kw_only=True, gc=False):
    block_hashes: list[int | bytes]
    medium: str | None = None
    group_idx: int | None = None


class _Cleared(msgspec.Struct, tag="AllBlocksCleared", tag_field="type", gc=False):
    pass


class _MapBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[_Stored | _Removed | _Cleared]
    data_parallel_rank: int | None = None


# Older vLLM: array-like events, the tag first, then the fields in declaration order.


class _ArrayStored(msgspec.Struct, tag="BlockStored", array_like=True, gc=False):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None


class _ArrayRemoved(msgspec.Struct, tag="BlockRemoved", array_like=True, gc=False):
    block_hashes: list[int | bytes]
    medium: str | None = None
    group_idx: int | None = None


class _ArrayCleared(msgspec.Struct, tag="AllBlocksCleared", array_like=True, gc=False):
    pass


class _ArrayBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[_ArrayStored | _ArrayRemoved | _ArrayCleared]
    data_parallel_rank: int | None = None


_decode_map_batch = msgspec.msgpack.Decoder(_MapBatch).decode
_decode_array_batch = msgspec.msgpack.Decoder(_ArrayBatch).decode

_tuple_new = tuple.__new__
_CLEARED = AllBlocksCleared()

# EventBatch built without its generated __init__ (a frozen dataclass sets each field through object.__setattr__,
# about as slow as decoding a small batch): the slots' own descriptors, which bypass the frozen __setattr__.
_batch_new = object.__new__
_slot = vars(EventBatch)
_set_seq = _slot["seq"].__set__
_set_ts = _slot["ts"].__set__
_set_events = _slot["events"].__set__
_set_rank = _slot["data_parallel_rank"].__set__


# -- generic path: any msgpack, checked field by field -----------------------------------------------------------------


def _decode_generic(seq: int, payload: bytes) -> EventBatch:
    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise MalformedBatch(f"payload is not msgpack: {exc}") from exc
    if not isinstance(raw, list) or len(raw) < 2 or not isinstance(raw[1], list):
        raise MalformedBatch("payload is not an event batch [ts, events, data_parallel_rank]")
    ts, raw_events = raw[0], raw[1]
    rank = raw[2] if len(raw) > 2 and isinstance(raw[2], int) else None
    events: list[KVEvent] = []
    for item in raw_events:
        event = _event(item)
        if event is not None:
            events.append(event)
    return EventBatch(
        seq=seq, ts=float(ts) if isinstance(ts, (int, float)) else 0.0, events=events, data_parallel_rank=rank
    )


def _event(item: Any) -> KVEvent | None:
    if isinstance(item, dict):
        kind = item.get("type")
        if kind == "BlockStored":
            return _stored(item)
        if kind == "BlockRemoved":
            return BlockRemoved(
                _hashes(item.get("block_hashes")), _opt_str(item.get("medium")), _opt_int(item.get("group_idx"))
            )
        if kind == "AllBlocksCleared":
            return AllBlocksCleared()
        return None
    if isinstance(item, list) and item:
        return _array_event(item)
    return None


def _stored(item: dict[str, Any]) -> BlockStored:
    get = item.get
    hashes, token_ids, block_size = get("block_hashes"), get("token_ids"), get("block_size")
    if type(hashes) is not list or type(token_ids) is not list or type(block_size) is not int:
        raise MalformedBatch("BlockStored without block_hashes, token_ids or block_size")
    _hashes(hashes)
    if not all(type(t) is int for t in token_ids):
        raise MalformedBatch("BlockStored token_ids are not all integers")
    parent, medium, group, extra = get("parent_block_hash"), get("medium"), get("group_idx"), get("extra_keys")
    lora = get("lora_name")
    if lora is None:
        lora_id = get("lora_id")
        lora = None if lora_id is None else str(lora_id)
    return BlockStored(
        hashes,
        parent if isinstance(parent, (int, bytes)) else None,
        token_ids,
        block_size,
        medium if type(medium) is str else None,
        None if lora is None else str(lora),
        group if type(group) is int else None,
        extra if type(extra) is list else None,
    )


# Older vLLM: events are arrays, tag first, then the fields in declaration order.
_STORED_FIELDS = (
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
)
_REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")


def _array_event(item: list[Any]) -> KVEvent | None:
    kind = item[0]
    if kind == "BlockStored":
        return _stored(dict(zip(_STORED_FIELDS, item[1:], strict=False)))
    if kind == "BlockRemoved":
        fields = dict(zip(_REMOVED_FIELDS, item[1:], strict=False))
        return BlockRemoved(
            _hashes(fields.get("block_hashes")), _opt_str(fields.get("medium")), _opt_int(fields.get("group_idx"))
        )
    if kind == "AllBlocksCleared":
        return AllBlocksCleared()
    return None


def _hashes(value: Any) -> list[EngineHash]:
    """The engine's block hashes, each an int or bytes (what the typed decoders accept): anything else (a list, a map,
    a float) is refused here, so a batch is never applied halfway and then fails on an unhashable key."""
    if not isinstance(value, list):
        raise MalformedBatch("block_hashes is not a list")
    if not all(isinstance(h, (int, bytes)) for h in value):
        raise MalformedBatch("block_hashes holds something other than integers or bytes")
    return value


def _opt_hash(value: Any) -> EngineHash | None:
    return value if isinstance(value, (int, bytes)) else None


def _opt_str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _opt_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None

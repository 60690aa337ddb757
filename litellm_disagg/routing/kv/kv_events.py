"""vLLM's KV cache events as they arrive on the wire, decoded into typed objects. Pure: bytes in, events out.

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
Event types this module does not know are skipped; a payload that is not a batch raises ``MalformedBatch``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import msgpack

EngineHash = int | bytes
"""A block hash as the engine publishes it: salted per engine process, meaningful only to that engine."""


class MalformedBatch(ValueError):
    """A payload that is not a vLLM KV event batch."""


class BlockStored(NamedTuple):
    block_hashes: list[EngineHash]
    parent_block_hash: EngineHash | None
    token_ids: list[int]
    block_size: int
    medium: str | None = None
    lora_name: str | None = None
    """The LoRA adapter's name (vLLM's ``lora_name``, else its ``lora_id`` as text); None for the base model."""
    group_idx: int | None = None
    extra_keys: list[Any] | None = None
    """Per block: None, or what else the engine hashed (multimodal inputs, cache salt, adapter)."""


class BlockRemoved(NamedTuple):
    block_hashes: list[EngineHash]
    medium: str | None = None
    group_idx: int | None = None


class AllBlocksCleared(NamedTuple):
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared
"""Events are named tuples (cheap to build: a busy engine sends tens of thousands a second)."""


@dataclass(frozen=True, slots=True)
class EventBatch:
    seq: int
    ts: float
    events: list[KVEvent]
    data_parallel_rank: int | None = None


def parse_seq(frame: bytes) -> int:
    if len(frame) != 8:
        raise MalformedBatch(f"sequence frame has {len(frame)} bytes, expected 8")
    return int.from_bytes(frame, "big", signed=True)


def decode_message(frames: list[bytes]) -> EventBatch:
    """One ZMQ message (``[topic, seq, payload]``) as a batch."""
    if len(frames) != 3:
        raise MalformedBatch(f"expected 3 frames (topic, seq, payload), got {len(frames)}")
    return decode_payload(parse_seq(frames[1]), frames[2])


def decode_payload(seq: int, payload: bytes) -> EventBatch:
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
    if not isinstance(value, list):
        raise MalformedBatch("block_hashes is not a list")
    return value


def _opt_hash(value: Any) -> EngineHash | None:
    return value if isinstance(value, (int, bytes)) else None


def _opt_str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _opt_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None

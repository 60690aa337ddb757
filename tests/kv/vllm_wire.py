"""KV event messages encoded as vLLM 0.32's ZmqEventPublisher sends them (msgspec: array-like batch, map-encoded
tagged events, default-valued trailing fields omitted). ``test_kv_events`` checks these bytes against vLLM's own
encoder output (recorded goldens, and live when vLLM is importable)."""

from __future__ import annotations

from typing import Any

import msgpack

Event = dict[str, Any]


def stored(
    hashes: list[Any],
    parent: Any,
    token_ids: list[int],
    block_size: int,
    *,
    medium: str | None = "GPU",
    lora_id: int | None = None,
    lora_name: str | None = None,
    extra_keys: list[Any] | None = None,
    group_idx: int | None = 0,
) -> Event:
    event: Event = {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "token_ids": token_ids,
        "block_size": block_size,
        "lora_id": lora_id,
        "medium": medium,
        "lora_name": lora_name,
    }
    if extra_keys is not None:
        event["extra_keys"] = extra_keys
    if group_idx is not None:
        event["group_idx"] = group_idx
    return event


def removed(hashes: list[Any], *, medium: str | None = "GPU", group_idx: int | None = 0) -> Event:
    event: Event = {"type": "BlockRemoved", "block_hashes": hashes, "medium": medium}
    if group_idx is not None:
        event["group_idx"] = group_idx
    return event


def cleared() -> Event:
    return {"type": "AllBlocksCleared"}


def payload(events: list[Event], ts: float = 1.5, rank: int | None = 0) -> bytes:
    return msgpack.packb([float(ts), events, rank], use_bin_type=True)


def message(seq: int, events: list[Event], *, topic: bytes = b"kv", ts: float = 1.5) -> list[bytes]:
    return [topic, seq.to_bytes(8, "big"), payload(events, ts)]

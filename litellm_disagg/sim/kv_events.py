"""vLLM's KV cache events, and their wire encoding, byte for byte.

vLLM (``vllm/distributed/kv_events.py``) encodes with msgspec: the batch is an array-like struct
``[ts, events, data_parallel_rank]``; each event is a tagged struct, encoded as a map whose first key is
``"type"`` (the class name) followed by its fields in declaration order, fields with defaults omitted when they
equal the default. The fields the engine's block pool sets are the ones written here, in that order::

    BlockStored       type, block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name,
                      extra_keys (one None per block), group_idx
    BlockRemoved      type, block_hashes, medium, group_idx
    AllBlocksCleared  type

The publisher stamps ``data_parallel_rank`` (0). Frames on the wire: ``(topic, 8-byte big-endian sequence number,
payload)`` (see ``publisher.py``). Encoding with plain msgpack in this order gives the same bytes as vLLM's encoder,
so a subscriber written for real vLLM (msgspec decoder or plain msgpack) reads the simulator unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack  # type: ignore[import-untyped]  # no stubs; plain packb/unpackb

from litellm_disagg.sim.hashing import BlockHash

MEDIUM_GPU = "GPU"


@dataclass(frozen=True)
class BlockStored:
    block_hashes: tuple[BlockHash, ...]
    parent_block_hash: BlockHash | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_id: int | None = None
    medium: str | None = MEDIUM_GPU


@dataclass(frozen=True)
class BlockRemoved:
    block_hashes: tuple[BlockHash, ...]
    medium: str | None = MEDIUM_GPU


@dataclass(frozen=True)
class AllBlocksCleared:
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


def _wire(event: KVEvent) -> dict[str, Any]:
    if isinstance(event, BlockStored):
        return {
            "type": "BlockStored",
            "block_hashes": list(event.block_hashes),
            "parent_block_hash": event.parent_block_hash,
            "token_ids": list(event.token_ids),
            "block_size": event.block_size,
            "lora_id": event.lora_id,
            "medium": event.medium,
            "lora_name": None,
            "extra_keys": [None] * len(event.block_hashes),
            "group_idx": 0,
        }
    if isinstance(event, BlockRemoved):
        return {
            "type": "BlockRemoved",
            "block_hashes": list(event.block_hashes),
            "medium": event.medium,
            "group_idx": 0,
        }
    return {"type": "AllBlocksCleared"}


def encode_batch(ts: float, events: Sequence[KVEvent], data_parallel_rank: int = 0) -> bytes:
    """One event batch as vLLM's publisher sends it (the third frame)."""
    payload = msgpack.packb([float(ts), [_wire(e) for e in events], data_parallel_rank], use_bin_type=True)
    assert isinstance(payload, bytes)
    return payload


def decode_batch(payload: bytes) -> tuple[float, list[KVEvent], int | None]:
    """The inverse of ``encode_batch`` for the fields this module knows; also reads real vLLM batches
    (map-encoded events; unknown event types are skipped)."""
    ts, raw_events, rank = msgpack.unpackb(payload, raw=False)
    events: list[KVEvent] = []
    for raw in raw_events:
        kind = raw.get("type") if isinstance(raw, dict) else None
        if kind == "BlockStored":
            events.append(
                BlockStored(
                    tuple(raw["block_hashes"]),
                    raw["parent_block_hash"],
                    tuple(raw["token_ids"]),
                    raw["block_size"],
                    raw.get("lora_id"),
                    raw.get("medium"),
                )
            )
        elif kind == "BlockRemoved":
            events.append(BlockRemoved(tuple(raw["block_hashes"]), raw.get("medium")))
        elif kind == "AllBlocksCleared":
            events.append(AllBlocksCleared())
    return float(ts), events, rank

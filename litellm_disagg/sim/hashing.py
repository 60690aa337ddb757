"""Chained block hashes over token ids: a block's hash covers its own tokens and, through its parent, every token
before it, so equal hashes mean equal prefixes. 64-bit unsigned ints, as vLLM publishes them in KV events
(``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``, the default). Unsalted: every simulated engine hashes a prefix alike.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence

BlockHash = int

_ROOT = b"litellm-disagg-sim/root"


def hash_block(parent: BlockHash | None, token_ids: Sequence[int]) -> BlockHash:
    prefix = _ROOT if parent is None else parent.to_bytes(8, "big")
    digest = hashlib.blake2b(prefix + array("q", token_ids).tobytes(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def extend_hashes(hashes: list[BlockHash], token_ids: Sequence[int], block_size: int) -> None:
    """Append to ``hashes`` the hashes of the full blocks of ``token_ids`` it does not cover yet (in place)."""
    full = len(token_ids) // block_size
    for i in range(len(hashes), full):
        parent = hashes[i - 1] if i > 0 else None
        hashes.append(hash_block(parent, token_ids[i * block_size : (i + 1) * block_size]))


def block_hashes(token_ids: Sequence[int], block_size: int) -> list[BlockHash]:
    """The hashes of the full blocks of ``token_ids`` (a trailing partial block has none)."""
    out: list[BlockHash] = []
    extend_hashes(out, token_ids, block_size)
    return out

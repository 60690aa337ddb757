"""Chained block hashes over token ids, computed by the router itself.

A prompt's token ids are cut into full blocks of ``block_size`` tokens (a trailing partial block has no hash, as in
vLLM's prefix cache) and each block is hashed together with its parent's hash, so one hash stands for the whole
prefix up to the end of its block: equal hashes mean equal prefixes.

Why our own hash: vLLM salts its block hashes per engine process, so the router can neither reproduce them from a
request nor compare them across workers. The KV-event path rebuilds these same hashes from the ``token_ids`` each
``BlockStored`` event carries (``chain_hashes(token_ids, block_size, parent=<our hash of the event's parent>)``),
so a hash built from a request equals the hash built from an event for the same tokens.

The hash function is CPython's tuple hash over ``(parent, (t0, t1, ...))``: a 64-bit xxHash-style mix that runs in C,
about 0.2 us per 16-token block (8k tokens in about 0.1 ms). Integers and tuples of integers hash the same in every
process (``PYTHONHASHSEED`` only affects str and bytes). Hashes never leave the router process, so only consistency
within one interpreter matters; they are not meant to be stored or compared across Python versions.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

from litellm_disagg.routing.kv.native import core as _native

if TYPE_CHECKING:
    from litellm_disagg.routing.kv.turn_prefix import TurnPrefix

BlockHash = int
"""One block's chained hash (a signed 64-bit int, as ``hash()`` returns)."""


def root_hash(namespace: str | None = None) -> BlockHash:
    """The parent of a sequence's first block. A ``namespace`` (e.g. a LoRA adapter name) starts a separate chain,
    so the same tokens under different adapters never share hashes."""
    seed = b"litellm-disagg/kv/root" if namespace is None else b"litellm-disagg/kv/ns/" + namespace.encode("utf-8")
    return int.from_bytes(hashlib.blake2b(seed, digest_size=8).digest(), "big", signed=True)


ROOT: BlockHash = root_hash()

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def chain_hashes(token_ids: Sequence[int], block_size: int, parent: BlockHash = ROOT) -> list[BlockHash]:
    """The hashes of the full blocks of ``token_ids``, chained from ``parent`` (``ROOT``: the start of a sequence).

    Hashing the blocks ``[a, b]`` from ``ROOT`` gives the same hashes as hashing ``[a]`` from ``ROOT`` and then
    ``[b]`` from the last hash of ``[a]``: how a ``BlockStored`` event that continues a cached prefix is rebuilt.
    The compiled core (``native.py``) computes the same values without building tuples, when it is built.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be positive, got {block_size}")
    if _native is not None and _INT64_MIN <= parent <= _INT64_MAX:
        return _native.chain_hashes(token_ids, block_size, parent)  # type: ignore[no-any-return]
    return chain_hashes_py(token_ids, block_size, parent)


def chain_hashes_py(token_ids: Sequence[int], block_size: int, parent: BlockHash = ROOT) -> list[BlockHash]:
    """``chain_hashes`` in pure Python: the definition the compiled core must equal."""
    # Block i's hash is hash((hash of block i - 1, tuple(token_ids[i * block_size : (i + 1) * block_size]))). ``zip``
    # over one shared iterator cuts those tuples in C (dropping a trailing partial block) from a list or a tuple
    # alike, and the comprehension chains them: about twice as fast as slicing in a loop, and the same values.
    h = parent
    return [h := hash((h, block)) for block in zip(*[iter(token_ids)] * block_size, strict=False)]


class PromptBlocks:
    """One request's prompt tokens and, per block size, their chained hashes (computed on first use, then kept).

    Workers of one model normally share a block size; if they do not, each size is hashed once per request.
    ``token_ids`` is kept as given when it is a list or a tuple (copying 8k ids would cost tens of microseconds per
    decision): the caller hands it over and must not change it afterwards. ``known``: a remembered turn that
    ``token_ids`` starts with (``turn_prefix.py``); its blocks' hashes are taken from it and only the rest is hashed.
    ``PromptBlocks.after(known, tail)``: the ids ``known.ids + tail``, kept apart (joined only if ``token_ids`` is
    read; the hashes never need it).
    """

    __slots__ = ("_hashes", "_ids", "_tail", "known", "namespace", "num_tokens")

    def __init__(self, token_ids: Sequence[int], *, namespace: str | None = None, known: TurnPrefix | None = None):
        self._ids: Sequence[int] | None = token_ids if isinstance(token_ids, list | tuple) else tuple(token_ids)
        self._tail: Sequence[int] | None = None
        self.num_tokens = len(self._ids)
        self.namespace = namespace
        self.known = known
        self._hashes: dict[int, list[BlockHash]] = {}

    @classmethod
    def after(cls, known: TurnPrefix, tail: Sequence[int], *, namespace: str | None = None) -> PromptBlocks:
        """The prompt ``known.ids + tail`` (a remembered turn and the ids after it), not joined."""
        blocks = cls.__new__(cls)
        blocks._ids = None
        blocks._tail = tail if isinstance(tail, list | tuple) else tuple(tail)
        blocks.num_tokens = len(known.ids) + len(blocks._tail)
        blocks.namespace = namespace
        blocks.known = known
        blocks._hashes = {}
        return blocks

    @property
    def token_ids(self) -> Sequence[int]:
        if self._ids is None:
            assert self.known is not None and self._tail is not None
            self._ids = [*self.known.ids, *self._tail]
        return self._ids

    def hashes(self, block_size: int) -> list[BlockHash]:
        found = self._hashes.get(block_size)
        if found is None:
            parent = ROOT if self.namespace is None else root_hash(self.namespace)
            known = self.known
            if known is not None and len(known.ids) >= block_size:
                head = known.hashes(block_size, parent)
                done = len(head) * block_size
                if self._ids is not None:
                    rest: Sequence[int] = self._ids[done:]
                else:  # the remembered ids past its last full block, then the tail
                    assert self._tail is not None
                    rest = [*known.ids[done:], *self._tail]
                found = head + chain_hashes(rest, block_size, head[-1])
            else:
                found = chain_hashes(self.token_ids, block_size, parent)
            self._hashes[block_size] = found
        return found

    def num_blocks(self, block_size: int) -> int:
        return self.num_tokens // block_size

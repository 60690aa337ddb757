"""The paged KV cache: fixed-size blocks, reference counts, and a prefix cache with LRU eviction.

Contract (the scheduler is the only caller):

- ``cached_prefix(hashes)``: how many leading blocks of a chained hash list are cached. Side-effect free.
- ``can_allocate(hit_blocks, n)``: whether taking those cached blocks plus ``n`` fresh ones would succeed.
- ``take_cached(hashes)``: reference the cached blocks for these hashes (they stop being evictable).
- ``allocate(n)``: ``n`` fresh blocks, evicting least recently freed cached blocks (``BlockRemoved``); None if short.
- ``cache_full_block(...)``: a block's tokens are all computed: enter it in the prefix cache (``BlockStored``).
- ``free(block_ids)``: drop one reference each; a block with no references becomes free but keeps its cached
  content until evicted. Pass a request's blocks in order: the tail is freed first so it is evicted first.
- ``reset_prefix_cache()``: forget every cached block (``AllBlocksCleared``); refused while blocks are in use.

Free blocks, cached or not, sit in one queue; allocation takes from its head (the least recently freed), like vLLM.
Usage is the referenced share of the cache (what ``vllm:kv_cache_usage_perc`` reports).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from litellm_disagg.sim.hashing import BlockHash
from litellm_disagg.sim.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    block_hash: BlockHash | None = None


class BlockPool:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        enable_prefix_caching: bool = True,
        on_event: Callable[[KVEvent], None] | None = None,
    ):
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._on_event = on_event
        self._blocks = [Block(i) for i in range(num_blocks)]
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._cached: dict[BlockHash, int] = {}
        self.evictions = 0

    # -- queries -----------------------------------------------------------------------------------------------------

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_cached(self) -> int:
        return len(self._cached)

    @property
    def usage(self) -> float:
        return 1.0 - len(self._free) / self.num_blocks

    def ref_count(self, block_id: int) -> int:
        return self._blocks[block_id].ref_count

    def is_cached(self, block_hash: BlockHash) -> bool:
        return block_hash in self._cached

    def cached_prefix(self, hashes: Sequence[BlockHash]) -> int:
        if not self.enable_prefix_caching:
            return 0
        n = 0
        for h in hashes:
            if h not in self._cached:
                break
            n += 1
        return n

    def can_allocate(self, hit_hashes: Sequence[BlockHash], num_new: int) -> bool:
        evictable_hits = sum(1 for h in hit_hashes if self._blocks[self._cached[h]].ref_count == 0)
        return len(self._free) - evictable_hits >= num_new

    # -- changes -----------------------------------------------------------------------------------------------------

    def take_cached(self, hashes: Sequence[BlockHash]) -> list[int]:
        ids: list[int] = []
        for h in hashes:
            block = self._blocks[self._cached[h]]
            if block.ref_count == 0:
                del self._free[block.block_id]
            block.ref_count += 1
            ids.append(block.block_id)
        return ids

    def allocate(self, num: int) -> list[int] | None:
        if num > len(self._free):
            return None
        ids: list[int] = []
        evicted: list[BlockHash] = []
        for _ in range(num):
            block_id, _ = self._free.popitem(last=False)
            block = self._blocks[block_id]
            if block.block_hash is not None:
                del self._cached[block.block_hash]
                evicted.append(block.block_hash)
                block.block_hash = None
            block.ref_count = 1
            ids.append(block_id)
        if evicted:
            self.evictions += len(evicted)
            self._emit(BlockRemoved(tuple(evicted)))
        return ids

    def cache_full_blocks(
        self, block_ids: Sequence[int], hashes: Sequence[BlockHash], parent: BlockHash | None, token_ids: Sequence[int]
    ) -> None:
        """Enter full, computed blocks in the prefix cache, in order (``token_ids``: all their tokens; ``parent``: the
        hash of the block before the first one). One ``BlockStored`` per contiguous run of newly cached blocks.

        A block whose hash is already cached (another request computed the same prefix at the same time) stays out
        of the cache and is simply freed later.
        """
        if not self.enable_prefix_caching:
            return
        run: list[BlockHash] = []
        run_start = 0
        for i, (block_id, h) in enumerate(zip(block_ids, hashes, strict=True)):
            block = self._blocks[block_id]
            if block.block_hash is None and h not in self._cached:
                block.block_hash = h
                self._cached[h] = block_id
                if not run:
                    run_start = i
                run.append(h)
                continue
            self._flush_run(run, run_start, hashes, parent, token_ids)
            run = []
        self._flush_run(run, run_start, hashes, parent, token_ids)

    def _flush_run(
        self,
        run: list[BlockHash],
        start: int,
        hashes: Sequence[BlockHash],
        parent: BlockHash | None,
        token_ids: Sequence[int],
    ) -> None:
        if run:
            run_parent = hashes[start - 1] if start > 0 else parent
            tokens = token_ids[start * self.block_size : (start + len(run)) * self.block_size]
            self._emit(BlockStored(tuple(run), run_parent, tuple(tokens), self.block_size))

    def free(self, block_ids: Sequence[int]) -> None:
        for block_id in reversed(block_ids):
            block = self._blocks[block_id]
            if block.ref_count <= 0:
                raise RuntimeError(f"block {block_id} freed more often than taken")
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free[block_id] = None

    def reset_prefix_cache(self) -> bool:
        if len(self._free) != self.num_blocks:
            return False
        for block in self._blocks:
            block.block_hash = None
        self._cached.clear()
        self._emit(AllBlocksCleared())
        return True

    def _emit(self, event: KVEvent) -> None:
        if self._on_event is not None:
            self._on_event(event)

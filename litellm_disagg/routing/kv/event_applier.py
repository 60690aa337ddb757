"""EventApplier: one worker's KV event batches, applied to the prefix index. Pure: no I/O, no clock.

What it does with each event:

- ``BlockStored``: rebuilds the router's own chained hashes from the event's ``token_ids``, starting from the router's
  hash of ``parent_block_hash`` (looked up in this worker's engine-hash -> router-hash table; the start of a sequence
  when the parent is nil), and marks them held. Blocks it cannot rebuild are skipped and counted: an unknown parent
  (the router started after the engine, so the prefix was cached before it listened; entries fill in as new
  prefixes arrive), a block size other than the worker's, null blocks (sliding-window groups: fewer hashes than
  token blocks), or blocks whose engine hash covers more than tokens (``extra_keys``: multimodal inputs, cache salt),
  which a request's token hashes could never match;
- ``BlockRemoved``: translates the engine hashes and unmarks them;
- ``AllBlocksCleared``: drops everything the worker held.

Only events for the configured media (``GPU``; nil counts as GPU) and KV cache group (0) are applied; others are
counted and ignored (a CPU-offload tier's removal must not unmark the GPU copy).

Sequence numbers: the next batch must be ``last + 1``. A jump means batches were lost (a slow subscriber past the
publisher's high-water mark, a reconnect): logged and counted, and then ``on_gap`` decides: ``keep`` (default) keeps
the entries — the per-worker LRU bound is the engine's capacity and follows roughly its eviction order, so entries
whose removal was lost age out as the engine stores new blocks — while ``clear`` drops the worker's entries. A number that goes back means a new
engine process (sequences restart at 0): everything about the worker is dropped. The first batch after start-up is
accepted whatever its number (nothing to replay).
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass
from typing import Literal

from litellm_disagg.routing.kv.block_hash import ROOT, BlockHash, chain_hashes, root_hash
from litellm_disagg.routing.kv.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, EngineHash, EventBatch
from litellm_disagg.routing.kv.prefix_index import PrefixIndex

logger = logging.getLogger(__name__)

GapPolicy = Literal["keep", "clear"]


@dataclass
class ApplierStats:
    batches: int = 0
    stored_blocks: int = 0
    removed_blocks: int = 0
    clears: int = 0
    gaps: int = 0
    restarts: int = 0
    malformed: int = 0
    skipped_blocks: int = 0
    """Stored blocks that could not be rebuilt (unknown parent, other block size, null blocks, extra keys)."""
    ignored_events: int = 0
    """Events for another medium or KV cache group."""
    last_seq: int | None = None


class EventApplier:
    def __init__(
        self,
        worker_id: str,
        index: PrefixIndex,
        *,
        block_size: int,
        capacity_blocks: int,
        media: Collection[str | None] = ("GPU", None),
        kv_group: int = 0,
        on_gap: GapPolicy = "keep",
    ):
        self.worker_id = worker_id
        self.index = index
        self.block_size = block_size
        self.media = frozenset(media)
        self.kv_group = kv_group
        self.on_gap = on_gap
        self.stats = ApplierStats()
        self._ours: dict[EngineHash, BlockHash] = {}
        self._max_translations = 2 * capacity_blocks + 1024

    # -- batches ------------------------------------------------------------------------------------------------------

    def apply(self, batch: EventBatch) -> None:
        if not self._in_sequence(batch.seq):
            return
        self.stats.batches += 1
        for event in batch.events:
            if isinstance(event, BlockStored):
                self._stored(event)
            elif isinstance(event, BlockRemoved):
                self._removed(event)
            elif isinstance(event, AllBlocksCleared):
                self._cleared()

    def lost(self, seq: int | None = None) -> None:
        """A message that could not be decoded: its events are lost, as in a gap."""
        self.stats.malformed += 1
        if seq is not None:
            self._in_sequence(seq)
        self._gap(f"undecodable batch {seq}")

    # -- sequence -----------------------------------------------------------------------------------------------------

    def _in_sequence(self, seq: int) -> bool:
        last = self.stats.last_seq
        if last is not None and seq <= last:
            if seq == last:
                return False  # a duplicate
            self.stats.restarts += 1
            logger.warning(
                "worker %s: KV event sequence went back (%d after %d): engine restarted, entries dropped",
                self.worker_id,
                seq,
                last,
            )
            self._drop_all()
        elif last is not None and seq != last + 1:
            self._gap(f"batches {last + 1}..{seq - 1} lost")
        self.stats.last_seq = seq
        return True

    def _gap(self, what: str) -> None:
        self.stats.gaps += 1
        if self.on_gap == "clear":
            logger.warning("worker %s: KV events lost (%s): its prefix entries dropped", self.worker_id, what)
            self.index.cleared(self.worker_id)
        else:
            logger.warning(
                "worker %s: KV events lost (%s): its prefix entries may be stale until they age out",
                self.worker_id,
                what,
            )

    def _drop_all(self) -> None:
        self._ours.clear()
        self.index.cleared(self.worker_id)

    # -- events -------------------------------------------------------------------------------------------------------

    def _wanted(self, medium: str | None, group: int | None) -> bool:
        return medium in self.media and (group is None or group == self.kv_group)

    def _stored(self, event: BlockStored) -> None:
        engine_hashes = event.block_hashes
        count = len(engine_hashes)
        if not self._wanted(event.medium, event.group_idx):
            self.stats.ignored_events += 1
            return
        size = self.block_size
        if event.block_size != size or len(event.token_ids) != count * size:
            self.stats.skipped_blocks += count
            return
        if event.parent_block_hash is None:
            parent = ROOT if event.lora_name is None else root_hash(event.lora_name)
        else:
            found = self._ours.get(event.parent_block_hash)
            if found is None:
                self.stats.skipped_blocks += count
                return
            parent = found
        usable = count
        extra = event.extra_keys
        if extra:
            usable = next((i for i, keys in enumerate(extra) if keys is not None), count)
        tokens = event.token_ids if usable == count else event.token_ids[: usable * size]
        ours = chain_hashes(tokens, size, parent)
        translations = self._ours
        translations.update(zip(engine_hashes, ours, strict=False))
        self.index.stored(self.worker_id, ours)
        self.stats.stored_blocks += usable
        self.stats.skipped_blocks += count - usable
        if len(translations) > self._max_translations:
            self._prune_translations()

    def _removed(self, event: BlockRemoved) -> None:
        if not self._wanted(event.medium, event.group_idx):
            self.stats.ignored_events += 1
            return
        pop = self._ours.pop
        ours = [h for e in event.block_hashes if (h := pop(e, None)) is not None]
        if ours:
            self.index.removed(self.worker_id, ours)
            self.stats.removed_blocks += len(ours)

    def _cleared(self) -> None:
        self.stats.clears += 1
        self._drop_all()

    def _prune_translations(self) -> None:
        """Removals were lost (the table outgrew the cache): keep only what the index still holds for the worker."""
        holds = self.index.holds
        self._ours = {e: h for e, h in self._ours.items() if holds(self.worker_id, h)}

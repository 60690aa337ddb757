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

A vLLM message can take a compiled path instead (``_kvwire.apply_message``, when built: see ``native.py``): it reads
the message's bytes and does what ``apply(decode_message(frames))`` does, calling back into this class for the
sequence check, clears, the chain root, translation pruning and the index; what it does not recognise it leaves to
``apply``. It reads the applier's own tables, so the two paths may be mixed on one worker's stream.

Sequence numbers: the next batch must be ``last + 1``. A jump means batches were lost (a slow subscriber past the
publisher's high-water mark, a reconnect): logged and counted, and then ``on_gap`` decides: ``keep`` (default) keeps
the entries — the per-worker LRU bound is the engine's capacity and follows roughly its eviction order, so entries
whose removal was lost age out as the engine stores new blocks — while ``clear`` drops the worker's entries. A number that goes back means a new
engine process (sequences restart at 0): everything about the worker is dropped. The first batch after start-up is
accepted whatever its number (nothing to replay).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, MutableMapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from litellm_disagg.engines.base import AllBlocksCleared, BlockRemoved, BlockStored, EngineHash, EventBatch
from litellm_disagg.routing.kv.block_hash import ROOT, BlockHash, chain_hashes, root_hash
from litellm_disagg.routing.kv.native import wire as _wire
from litellm_disagg.routing.kv.prefix_index import PrefixIndex

logger = logging.getLogger(__name__)

GapPolicy = Literal["keep", "clear"]

_adapter_root = lru_cache(maxsize=256)(root_hash)
"""A LoRA adapter's chain root (a blake2b digest: worth keeping, as every sequence under the adapter starts there)."""

_translations: Callable[[], MutableMapping[EngineHash, BlockHash]] = _wire.Translations if _wire is not None else dict
"""The engine-hash -> router-hash table: ``_kvwire.Translations`` (C integers, dict methods) when the compiled
KV-event path is built, else a dict (the reference it is tested against; ``apply_message`` leaves an applier with a
dict to the Python path)."""


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
    last_batch_ts: float | None = None
    """The engine's timestamp of the last batch applied (unix time)."""
    last_applied_at: float | None = None
    """When it was applied (unix time): the difference is the event lag."""


class EventApplier:
    _table: Callable[[], MutableMapping[EngineHash, BlockHash]] = _translations
    """The engine-hash -> router-hash table's type (tests set ``dict``, the reference, on an instance)."""

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
        self._ours: MutableMapping[EngineHash, BlockHash] = self._table()
        self._max_translations = 2 * capacity_blocks + 1024
        self._sink: object = None
        """The compiled path's handle on the index for this worker (``PrefixIndex.precise_sink``), made on first use."""

    # -- batches ------------------------------------------------------------------------------------------------------

    def apply(self, batch: EventBatch) -> None:
        seq = batch.seq
        stats = self.stats
        last = stats.last_seq
        if last is not None and seq == last + 1:  # the common case, without a call
            stats.last_seq = seq
        elif not self._in_sequence(seq):
            return
        stats.batches += 1
        stats.last_batch_ts, stats.last_applied_at = batch.ts, time.time()
        # Consecutive events of one kind reach the index as one call: an engine step often stores blocks for several
        # requests, and vLLM evicts blocks one BlockRemoved at a time. Translations are updated event by event, so a
        # later event in the batch sees an earlier one's blocks; the index gets the same blocks in the same order (only
        # its trim past capacity, and the translation table's check, run once per run instead of once per event).
        run: list[BlockHash] | None = None
        run_stores = False
        for event in batch.events:
            if isinstance(event, BlockStored):
                ours = self._stored(event)
                stores = True
            elif isinstance(event, BlockRemoved):
                ours = self._removed(event)
                stores = False
            else:
                if isinstance(event, AllBlocksCleared):
                    if run is not None:
                        self._flush(run, run_stores)
                        run = None
                    self._cleared()
                continue
            if not ours:
                continue
            if run is None:
                run, run_stores = ours, stores
            elif stores is run_stores:
                run += ours
            else:
                self._flush(run, run_stores)
                run, run_stores = ours, stores
        if run is None:
            return
        if run_stores:  # _flush, written out: most batches end with their only run
            self.index.stored(self.worker_id, run)
            if len(self._ours) > self._max_translations:
                self._prune_translations()
        else:
            self.index.removed(self.worker_id, run)

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

    def _stored(self, event: BlockStored) -> list[BlockHash] | None:
        """Our hashes of the event's blocks (translations updated, index not yet), or None if none apply."""
        engine_hashes, engine_parent, tokens, block_size, medium, lora_name, group, extra = event
        stats = self.stats
        count = len(engine_hashes)
        # Inlined on purpose, here and in _removed (one call per event adds up): wanted media and KV cache group.
        if medium not in self.media or (group is not None and group != self.kv_group):
            stats.ignored_events += 1
            return None
        size = self.block_size
        if block_size != size or len(tokens) != count * size:
            stats.skipped_blocks += count
            return None
        if engine_parent is None:
            parent = self._chain_root(lora_name)
        else:
            found = self._ours.get(engine_parent)
            if found is None:
                stats.skipped_blocks += count
                return None
            parent = found
        usable = count
        if extra:
            usable = next((i for i, keys in enumerate(extra) if keys is not None), count)
            if usable < count:
                stats.skipped_blocks += count - usable
                tokens = tokens[: usable * size]
        ours = chain_hashes(tokens, size, parent)
        self._ours.update(zip(engine_hashes, ours, strict=False))
        stats.stored_blocks += usable
        return ours

    @staticmethod
    def _chain_root(lora_name: str | None) -> BlockHash:
        """The parent of a sequence's first block: the base model's root, or the LoRA adapter's."""
        return ROOT if lora_name is None else _adapter_root(lora_name)

    def _removed(self, event: BlockRemoved) -> list[BlockHash] | None:
        """Our hashes of the event's blocks that we knew (translations dropped, index not yet updated)."""
        engine_hashes, medium, group = event
        if medium not in self.media or (group is not None and group != self.kv_group):
            self.stats.ignored_events += 1
            return None
        pop = self._ours.pop
        ours = [h for e in engine_hashes if (h := pop(e, None)) is not None]
        self.stats.removed_blocks += len(ours)
        return ours

    def _flush(self, ours: list[BlockHash], stored: bool) -> None:
        if stored:
            self.index.stored(self.worker_id, ours)
            if len(self._ours) > self._max_translations:
                self._prune_translations()
        else:
            self.index.removed(self.worker_id, ours)

    def _cleared(self) -> None:
        self.stats.clears += 1
        self._drop_all()

    def _prune_translations(self) -> None:
        """Removals were lost (the table outgrew the cache): keep only what the index still holds for the worker."""
        holds, worker_id = self.index.holds, self.worker_id
        kept = self._table()
        for e, h in self._ours.items():
            if holds(worker_id, h):
                kept[e] = h
        self._ours = kept

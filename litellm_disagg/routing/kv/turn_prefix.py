"""A conversation's previous turn, kept whole: its next turn reuses the ids and block hashes of everything before it.

A next turn's prompt renders as the previous turn's conversation with the answer appended (what ``remember``
renders when the answer completes), followed by the new question. Segment-wise tokenization (``token_cache.py``)
already finds every earlier segment in the cache, but still scans the whole rendered text for added tokens, looks
up every segment and joins 8k ids into a new list, and the router then hashes every block again: about a third of
a second turn's tokenization and decision. A ``TurnPrefix`` holds, for one such rendered text, the ids of its
segments up to its last cut and their block hashes, so the next turn only scans, encodes and hashes what follows.

Why the ids are exact: ``SegmentEncoder.split`` cuts where the tokenizer's own added-token scan (leftmost-longest,
from the start) finds a cut token. Let ``T`` be the remembered text, ``c`` the start of its last cut match, and
``m`` the length of the longest added token. If a new prompt ``P`` starts with the whole of ``T`` and
``len(T) - c >= m``, the scans of ``T`` and ``P`` agree at every position up to and including ``c``: a match starting
at ``p <= c`` is at most ``m`` long, so it ends within ``T``, where ``P`` and ``T`` are the same text. So ``P``'s
segments before ``c`` are ``T``'s, ``P`` is cut at ``c`` too, and the scan restarted at ``c`` finds ``P``'s remaining
cuts. The ids before ``c`` are the same cached segments' ids; the block hashes of those ids are a function of them.
A prompt that does not start with ``T`` (a template that renders a past answer differently, an edited history) is
simply not matched, and takes the usual path.

How a turn is found: by what the caller knows of the conversation, not by the text (where ``T`` ends in a new prompt
depends on the template). ``tokenizer.py`` keys a remembered chat by the number of its messages and the text of its
last one (the answer); a next turn looks up the number of messages up to its last assistant message and that
message's text. The match is then checked on the whole text (``startswith``), so a key shared by two conversations
(two identical answers) costs a miss, never a wrong id.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

from litellm_disagg.routing.kv.block_hash import BlockHash, chain_hashes
from litellm_disagg.sized_lru import SizedLRU


@dataclass(eq=False)
class TurnPrefix:
    """A remembered rendered text ``text``, cut at ``cut`` (the start of its last segment), and the ids of
    ``text[:cut]``. ``hashes`` keeps their block hashes per block size and parent."""

    owner: int
    """The ``SegmentEncoder`` (tokenizer) whose ids these are."""
    turn: Hashable
    """What identifies the conversation at this turn (the caller's key)."""
    text: str
    cut: int
    ids: list[int]
    _hashes: dict[tuple[int, BlockHash], list[BlockHash]] = field(default_factory=dict, repr=False)

    @property
    def key(self) -> tuple[int, Hashable]:
        return self.owner, self.turn

    def hashes(self, block_size: int, parent: BlockHash) -> list[BlockHash]:
        """The chained hashes of the full blocks of ``ids`` (computed once per block size and parent)."""
        found = self._hashes.get((block_size, parent))
        if found is None:
            found = self._hashes[(block_size, parent)] = chain_hashes(self.ids, block_size, parent)
        return found


class Tokens:
    """A prompt's token ids; ``prefix``: the remembered turn they start with (``ids[:len(prefix.ids)] ==
    prefix.ids``), whose block hashes the router reuses.

    ``Tokens.after(prefix, tail)`` keeps the remembered turn's ids and the ids after them apart: a next turn's 8k ids
    are joined into one list (an 8k-int copy and incref: 30-60 us of a second turn, cold) only when someone reads
    ``ids``; the router reads ``tail`` and the prefix's block hashes (``PromptBlocks.after``) and never needs it."""

    __slots__ = ("_ids", "_tail", "num_tokens", "prefix")

    def __init__(self, ids: list[int], prefix: TurnPrefix | None = None):
        self._ids: list[int] | None = ids
        self._tail: list[int] | None = None
        self.prefix = prefix
        self.num_tokens = len(ids)

    @classmethod
    def after(cls, prefix: TurnPrefix, tail: list[int]) -> Tokens:
        """The ids ``prefix.ids + tail``, not joined until read (the caller hands ``tail`` over)."""
        tokens = cls.__new__(cls)
        tokens._ids = None
        tokens._tail = tail
        tokens.prefix = prefix
        tokens.num_tokens = len(prefix.ids) + len(tail)
        return tokens

    @property
    def ids(self) -> list[int]:
        """All the ids (joined on first use, then kept)."""
        if self._ids is None:
            assert self.prefix is not None and self._tail is not None
            self._ids = self.prefix.ids + self._tail
        return self._ids

    @property
    def tail(self) -> list[int]:
        """The ids after ``prefix``'s (all of them without a prefix)."""
        if self._tail is None:
            assert self._ids is not None
            self._tail = self._ids if self.prefix is None else self._ids[len(self.prefix.ids) :]
        return self._tail

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Tokens):
            return NotImplemented
        return self.prefix is other.prefix and self.ids == other.ids

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Tokens({self.num_tokens} ids, prefix={'yes' if self.prefix is not None else 'no'})"


@dataclass
class TurnPrefixStats:
    hits: int = 0
    """Prompts that started with a remembered turn."""
    stored: int = 0
    evicted: int = 0


class TurnPrefixes:
    """Bounded LRU of ``TurnPrefix`` by tokenizer and turn; thread-safe (``remember`` runs in a worker thread, lookups
    on the event loop). ``max_tokens`` bounds the sum of the kept ids."""

    def __init__(self, max_tokens: int):
        if max_tokens < 1:
            raise ValueError("max_tokens must be positive")
        self.max_tokens = max_tokens
        self.stats = TurnPrefixStats()
        self._lru: SizedLRU[tuple[int, Hashable], TurnPrefix] = SizedLRU(max_tokens, lambda p: len(p.ids))

    @property
    def tokens(self) -> int:
        return self._lru.total

    def __len__(self) -> int:
        return len(self._lru)

    def put(self, prefix: TurnPrefix) -> None:
        if self._lru.put(prefix.key, prefix):
            self.stats.stored += 1
            self.stats.evicted = self._lru.evicted

    def find(self, owner: int, turn: Hashable, text: str) -> TurnPrefix | None:
        """The turn ``turn`` remembered by ``owner``, if ``text`` starts with its text; else None."""
        key = (owner, turn)
        lru = self._lru
        with lru.lock:
            prefix = lru.entries.get(key)
            if prefix is None or not text.startswith(prefix.text):
                return None
            lru.entries.move_to_end(key)
            self.stats.hits += 1
            return prefix

    def clear(self) -> None:
        self._lru.clear()

"""Incremental tokenization: a prompt that extends (or shares pieces with) one seen before only tokenizes what is new.

A multi-turn conversation resends its whole history each turn; re-tokenizing 8k tokens costs 10-20 ms. Here the
rendered prompt is cut into **segments**, each starting at an occurrence of one of the tokenizer's added tokens (a
chat template's ``<|im_start|>``, ``<|eot_id|>``, ``</s>`` ...), each segment is encoded on its own, through a bounded
LRU cache keyed by the segment's text, and the ids are concatenated. A new turn then reuses the segments of every
earlier message and encodes only its own.

Why that gives exactly the ids a whole encoding gives (Hugging Face ``tokenizers``, the library of every "fast"
tokenizer): encoding first finds the added tokens in the raw text (leftmost-longest, non-overlapping, one scan
from the start) and splits the text around them; every piece in between is then normalized, pre-tokenized and
modelled on its own. So if each cut falls where that scan finds an added token, cutting there changes nothing:

- the cuts are the starts of that scan's matches (this module repeats the scan: one regex, alternatives longest
  first), so the scan restarted at a cut finds the same matches up to the next cut;
- a match whose token strips whitespace on its left (``lstrip``) could reach back over a cut: such tokens are never
  cut at; a token that strips on its right stops at the next cut, which starts with no whitespace (tokens whose text
  starts with whitespace are never cut at either); ``single_word`` tokens look at their neighbours across a cut: a
  tokenizer with one (matched on raw text) is not segmented at all;
- the one position-dependent step of the pipeline we know of is "is this piece at the start of the text" (``Metaspace``
  ``prepend_scheme: first``): a piece after a cut follows the cut's added token, so it is never at the start either
  way;
- the post-processor adds nothing without special tokens: segmenting is only used for ``add_special_tokens=False``
  (chat requests, vLLM's default), and only when the tokenizer has no truncation, padding or
  ``split_special_tokens``.

Checks on top of that reasoning: ``SegmentEncoder.build`` compares segment-wise with whole encoding on probe texts
(several rendered chat messages, every cut token between words, spaces and newlines, non-ASCII text) and returns None
(whole encoding only) on any difference; and the first ``VERIFY_FIRST`` segmented prompts of each tokenizer are also
encoded whole and compared: a difference disables segmenting for that tokenizer (and the whole encoding is used).
"""

from __future__ import annotations

import itertools
import logging
import re
from collections.abc import Collection, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from litellm_disagg.routing.kv.block_hash import ROOT
from litellm_disagg.routing.kv.piece_cache import PieceEncoder
from litellm_disagg.routing.kv.turn_prefix import Tokens, TurnPrefix, TurnPrefixes
from litellm_disagg.sized_lru import SizedLRU

logger = logging.getLogger(__name__)

VERIFY_FIRST = 4
"""Segmented prompts per tokenizer that are also encoded whole and compared (a mismatch disables segmenting)."""

_PROBE_WORDS = (
    "Hello world", " leading space", "trailing spaces  ", "\n\nnew lines\n", "tabs\tand  double  spaces",
    "digits 12345 67.89", "café naïve über", "日本語のテキスト", "emoji 🙂👍", "code: def f(x):\n    return x  # ok",
    "punctuation!?;:'\"", "",
)  # fmt: skip


@dataclass
class CacheStats:
    hits: int = 0
    """Segments found in the cache."""
    misses: int = 0
    """Segments encoded."""
    hit_tokens: int = 0
    """Tokens served from the cache."""
    evicted: int = 0
    """Segments dropped to stay within the bound."""


class TokenCache:
    """Bounded LRU of segment token ids, shared by every tokenizer of a ``PromptTokenizer`` (keys carry the
    tokenizer's identity); thread-safe. ``max_tokens`` bounds the sum of the cached segments' lengths; a segment
    longer than that is not cached."""

    def __init__(self, max_tokens: int):
        if max_tokens < 1:
            raise ValueError("max_tokens must be positive")
        self.max_tokens = max_tokens
        self.stats = CacheStats()
        # Evicted ids are freed by ``release_dropped`` (from the worker threads' encodes), not in the ``put`` of a
        # next turn tokenized on the event loop: freeing an 8k-token segment's tuple costs ~50 us of decrefs.
        self._lru: SizedLRU[tuple[int, str], tuple[int, ...]] = SizedLRU(max_tokens, len, defer_drops=True)
        self._entries = self._lru.entries
        self._lock = self._lru.lock

    @property
    def tokens(self) -> int:
        """Tokens cached now."""
        return self._lru.total

    def __len__(self) -> int:
        return len(self._entries)

    def get_many(self, owner: int, texts: Sequence[str]) -> list[tuple[int, ...] | None]:
        """The cached ids of each text (None where absent); hits become the most recently used."""
        entries = self._entries
        out: list[tuple[int, ...] | None] = []
        with self._lock:
            for text in texts:
                key = (owner, text)
                found = entries.get(key)
                if found is not None:
                    entries.move_to_end(key)
                    self.stats.hits += 1
                    self.stats.hit_tokens += len(found)
                else:
                    self.stats.misses += 1
                out.append(found)
        return out

    def get_mostly_cached(
        self, owner: int, texts: Sequence[str], max_missing_chars: int
    ) -> list[tuple[int, ...] | None] | None:
        """``get_many(owner, texts)`` when at most ``max_missing_chars`` characters of ``texts`` are not cached; else
        None, with nothing changed (no statistics, no change of the LRU order): ``missing_chars`` and ``get_many``
        in one pass."""
        entries = self._entries
        stats = self.stats
        with self._lock:
            keys = [(owner, text) for text in texts]
            found = [entries.get(key) for key in keys]
            if sum(len(text) for text, ids in zip(texts, found, strict=True) if ids is None) > max_missing_chars:
                return None
            for key, ids in zip(keys, found, strict=True):
                if ids is not None:
                    entries.move_to_end(key)
                    stats.hits += 1
                    stats.hit_tokens += len(ids)
                else:
                    stats.misses += 1
        return found

    def peek_many(self, owner: int, texts: Sequence[str]) -> list[tuple[int, ...] | None]:
        """The cached ids of each text (None where absent), as a peek: no statistics, no change of the LRU order."""
        entries = self._entries
        with self._lock:
            return [entries.get((owner, text)) for text in texts]

    def missing_chars(self, owner: int, texts: Sequence[str]) -> int:
        """How many characters of ``texts`` are not cached (a peek: no statistics, no change of the LRU order)."""
        entries = self._entries
        with self._lock:
            return sum(len(text) for text in texts if (owner, text) not in entries)

    def missing(self, owner: int, texts: Sequence[str]) -> list[str]:
        """The texts of ``texts`` that are not cached, each once (a peek: no statistics, no change of the LRU order)."""
        entries = self._entries
        with self._lock:
            return list(dict.fromkeys(text for text in texts if (owner, text) not in entries))

    def put(self, owner: int, text: str, ids: tuple[int, ...]) -> None:
        self._lru.put((owner, text), ids)
        self.stats.evicted = self._lru.evicted

    def release_dropped(self) -> int:
        """Frees the evicted segments' ids (deferred: see ``__init__``); returns how many."""
        return self._lru.release_dropped()

    def clear(self) -> None:
        self._lru.clear()
        self._lru.release_dropped()


_owners = itertools.count(1)


class SegmentEncoder:
    """One tokenizer's segment-wise encoding (``add_special_tokens=False``) through a ``TokenCache``.

    Build it with ``build`` (None when the tokenizer does not qualify or fails the probe). ``encode(text)`` returns
    the ids or None when the tokenizer's state no longer allows segmenting (the caller then encodes whole). Not
    thread-safe on its own: call it under the lock that serializes the tokenizer's use.
    """

    def __init__(
        self,
        tokenizer: Any,
        cache: TokenCache,
        cut_at: Sequence[str],
        scan: Sequence[str],
        prefixes: TurnPrefixes | None = None,
    ):
        self.tokenizer = tokenizer
        self.cache = cache
        self.prefixes = prefixes
        """Remembered turns (``turn_prefix.py``): a next turn reuses their ids and block hashes (None: not kept)."""
        self.owner = next(_owners)
        self.cut_at = frozenset(cut_at)
        """Added tokens a segment may start with."""
        self._longest = max((len(t) for t in scan), default=0)
        """The longest added token: a remembered turn is cut at least this far from its end."""
        # One alternation of every added token matched on raw text, longest first: at each position Python's regex
        # takes the first alternative that matches, so this is the tokenizer's leftmost-longest scan.
        self._scan = re.compile("|".join(re.escape(t) for t in sorted(scan, key=len, reverse=True))) if scan else None
        backend = tokenizer.backend_tokenizer
        self._backend = backend
        self._encode_batch = getattr(backend, "encode_batch_fast", None) or backend.encode_batch
        self.pieces: PieceEncoder | None = None
        """New ASCII segments encoded piece by piece through a cache (``piece_cache.py``); None: by the tokenizer."""
        self.enabled = True
        self.to_verify = VERIFY_FIRST

    # -- building -----------------------------------------------------------------------------------------------------

    @classmethod
    def build(
        cls, tokenizer: Any, cache: TokenCache, prefixes: TurnPrefixes | None = None, pieces: bool = True
    ) -> SegmentEncoder | None:
        """A segment encoder for ``tokenizer`` if it qualifies (a ``tokenizers`` backend, no ``single_word`` added
        token on raw text, nothing to truncate, pad or split specials) and segment-wise encoding equals whole
        encoding on the probe texts; else None. ``pieces``: new ASCII segments encoded piece-wise where
        ``piece_cache.py`` can vouch for the tokenizer."""
        try:
            from tokenizers import Tokenizer
        except ImportError:  # pragma: no cover - transformers' fast tokenizers need it
            return None
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if not isinstance(backend, Tokenizer) or getattr(tokenizer, "split_special_tokens", False):
            return None
        try:
            added = list(backend.get_added_tokens_decoder().values())
        except Exception:  # an old tokenizers without it
            return None
        raw = [t for t in added if not t.normalized]
        if any(t.single_word or not t.content for t in raw):
            logger.info("tokenizer has a single-word added token: prompts are tokenized whole")
            return None
        cut_at = [t.content for t in raw if not t.lstrip and not t.content[0].isspace()]
        encoder = cls(tokenizer, cache, cut_at, [t.content for t in raw], prefixes)
        try:
            problem = encoder._probe()
        except Exception as exc:
            problem = f"probe failed: {exc}"
        if problem is not None:
            logger.info("segment-wise tokenization disabled: %s", problem)
            return None
        if not pieces:
            return encoder
        probes = encoder._probe_texts()
        probes += [text.encode("ascii", "ignore").decode() for text in probes]  # the cases piece-wise encoding takes
        try:
            encoder.pieces = PieceEncoder.build(
                tokenizer, encoder._scan, encoder._encode_batch, encoder.encode_whole, probes
            )
        except Exception as exc:  # a tokenizer this module reads wrongly: segments are encoded by the tokenizer
            logger.info("piece-wise tokenization disabled: %s", exc)
        return encoder

    def _probe(self) -> str | None:
        """None if segment-wise encoding equals whole encoding on every probe text, else what differs."""
        for text in self._probe_texts():
            whole = self.encode_whole(text)  # first: the tokenizer's own call also resets truncation and padding
            if not self.usable():
                return "the tokenizer truncates, pads or splits special tokens"
            segmented = self._encode_segments(self.split(text), use_cache=False)
            if segmented != whole:
                return f"probe {text[:60]!r}...: segment-wise ids differ from whole encoding"
        return None

    def _probe_texts(self) -> list[str]:
        texts: list[str] = []
        contents = sorted(self.cut_at) or [""]
        words = [w for w in _PROBE_WORDS if w]
        glued = []
        for i, token in enumerate(contents):
            a, b = words[i % len(words)], words[(i + 3) % len(words)]
            glued.append(f"{a}{token}{b} {token} x\n{token}\n\n{token}  y{token}{token}{b}{token}")
        texts.append("".join(glued))
        texts.append(" " + "".join(f"{t} {w}" for t, w in zip(itertools.cycle(contents), words, strict=False)))
        roles = itertools.cycle(("user", "assistant"))
        conversations = [
            [{"role": "system", "content": _PROBE_WORDS[0]}]
            + [{"role": next(roles), "content": w} for w in _PROBE_WORDS[1:]],
            [{"role": r, "content": w} for r, w in zip(itertools.cycle(("user", "assistant")), words, strict=False)],
            [{"role": "user", "content": " ".join(words)}, {"role": "assistant", "content": "ok"}],
        ]
        for messages in conversations:
            for generation_prompt in (True, False):
                try:
                    rendered = self.tokenizer.apply_chat_template(
                        messages, tokenize=False, add_generation_prompt=generation_prompt
                    )
                except Exception:  # no template, or one that refuses these roles: the other probes still count
                    continue
                if isinstance(rendered, str):
                    texts.append(rendered)
        return texts

    # -- encoding -----------------------------------------------------------------------------------------------------

    def split(self, text: str, start: int = 0) -> list[str]:
        """``text[start:]`` cut before every occurrence of a cut token that the tokenizer's own scan finds (empty
        pieces dropped). Their concatenation is ``text[start:]``. ``start`` must be where that scan, run from the
        start of ``text``, finds a cut token (or 0): the scan restarted there finds the same matches after it."""
        if self._scan is None or not self.cut_at:
            return [text[start:]] if len(text) > start else []
        cut_at = self.cut_at
        cuts = [m.start() for m in self._scan.finditer(text, start) if m.group() in cut_at]
        if not cuts:
            return [text[start:]] if len(text) > start else []
        bounds = [start, *cuts, len(text)] if cuts[0] > start else [*cuts, len(text)]
        return [text[a:b] for a, b in itertools.pairwise(bounds) if b > a]

    def usable(self) -> bool:
        """Whether the tokenizer's current state still allows segmenting."""
        backend = self._backend
        return (
            self.enabled
            and backend.truncation is None
            and backend.padding is None
            and not backend.encode_special_tokens
            and not getattr(self.tokenizer, "split_special_tokens", False)
        )

    def encode(self, text: str) -> list[int] | None:
        """The ids of ``text`` without special tokens, segment-wise through the cache; None when segmenting is not
        usable now (encode whole)."""
        if not self.usable():
            return None
        self.cache.release_dropped()  # in the caller's worker thread: off the event loop's next turns
        segments = self.split(text)
        ids = self._encode_segments(segments, use_cache=True)
        if self.to_verify > 0 and len(segments) > 1:
            self.to_verify -= 1
            whole = self.encode_whole(text)
            if whole != ids:
                self.enabled = False
                logger.warning("segment-wise tokenization differs from whole encoding: disabled for this tokenizer")
                return whole
        return ids

    def encode_cached(self, text: str, max_new_chars: int, turn: Hashable = None) -> Tokens | None:
        """``encode(text)`` when it is cheap now, else None with nothing changed (call ``encode``, in a thread).

        Cheap: segmenting usable, this tokenizer's first prompts already verified against whole encoding, and at most
        ``max_new_chars`` of the text's segments not in the cache (a conversation's next turn: its new messages).
        The ids are ``encode``'s: the same segments through the same cache. When ``text`` starts with the text of the
        remembered turn ``turn`` (``turn_prefix.py``), that turn's ids up to its last cut are taken whole and only
        what follows is split and looked up; the result then carries that turn, whose block hashes the router
        reuses. (``tokenizers``
        encodes a batch of one in the calling thread and a batch of several on its thread pool; encoding a turn's
        two new messages one call each instead cost the same process CPU in the micro-benchmark and more wall time:
        not done.)"""
        if self.to_verify > 0 or not self.usable():
            return None
        prefix = None
        if turn is not None and self.prefixes is not None:
            prefix = self.prefixes.find(self.owner, turn, text)
        segments = self.split(text, prefix.cut if prefix is not None else 0)
        found = self.cache.get_mostly_cached(self.owner, segments, max_new_chars)
        if found is None:
            return None
        ids = self._encode_segments(segments, use_cache=True, found=found)
        return Tokens(ids) if prefix is None else Tokens.after(prefix, ids)

    def remember(self, text: str, block_sizes: Collection[int] = (), turn: Hashable = None) -> int:
        """Encodes and caches the segments of ``text`` not cached yet, without joining any ids; returns how many.

        For a text that a later prompt will contain: a conversation's history with the assistant's answer appended,
        rendered when the answer completes, so that the next turn finds the answer's segments cached and encodes
        only its new question. The ids cached are each segment's own encoding, exactly what ``encode`` would cache
        for the same segment text (the cache is keyed by that text: a later prompt that renders differently simply
        does not hit). With a ``turn`` key (and a store of turns), ``text`` is also remembered whole under it
        (``turn_prefix.py``), with its block hashes for ``block_sizes``, for ``encode_cached(..., turn=...)``."""
        if not self.usable():
            return 0
        self.cache.release_dropped()  # in the caller's worker thread: off the event loop's next turns
        segments = self.split(text)
        texts = self.cache.missing(self.owner, segments)
        fresh: dict[str, tuple[int, ...]] = {}
        if texts:
            for segment, encoding in zip(texts, self._encode_batch(texts, add_special_tokens=False), strict=True):
                fresh[segment] = tuple(encoding.ids)
                self.cache.put(self.owner, segment, fresh[segment])
        if self.prefixes is not None and turn is not None:
            self._keep_turn(turn, text, segments, fresh, block_sizes)
        return len(texts)

    def _keep_turn(
        self,
        turn: Hashable,
        text: str,
        segments: list[str],
        fresh: dict[str, tuple[int, ...]],
        block_sizes: Collection[int],
    ) -> None:
        """Remember ``text`` as ``turn`` (``turn_prefix.py``): cut at the start of a segment at least the longest added token
        from its end, with the ids before the cut and their block hashes for ``block_sizes`` (from ``ROOT``)."""
        assert self.prefixes is not None
        tail = 0
        kept = len(segments)
        while kept > 0 and tail < self._longest:
            kept -= 1
            tail += len(segments[kept])
        if kept == 0 or tail < self._longest:
            return
        head = segments[:kept]
        found = self.cache.peek_many(self.owner, head)
        ids: list[int] = []
        for segment, cached in zip(head, found, strict=True):
            segment_ids = cached if cached is not None else fresh.get(segment)
            if segment_ids is None:  # evicted meanwhile (or too long to cache): its own encoding, as encode would
                segment_ids = tuple(self._encode_batch([segment], add_special_tokens=False)[0].ids)
            ids.extend(segment_ids)
        prefix = TurnPrefix(self.owner, turn, text, len(text) - tail, ids)
        for size in block_sizes:
            prefix.hashes(size, ROOT)
        self.prefixes.put(prefix)

    def encode_whole(self, text: str) -> list[int]:
        """The reference: the tokenizer's own call, as for any prompt."""
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if not isinstance(ids, list):
            raise ValueError("tokenizer returned something other than a list of token ids")
        return ids

    def _encode_segments(
        self,
        segments: list[str],
        *,
        use_cache: bool,
        found: list[tuple[int, ...] | None] | None = None,
    ) -> list[int]:
        """The segments' ids joined: cached ones looked up (``use_cache``; ``found``: already looked up), the
        others encoded (piece-wise where ``piece_cache.py`` vouches for it, the rest in one batch call) and cached."""
        if found is None:
            found = self.cache.get_many(self.owner, segments) if use_cache else [None] * len(segments)
        missing = [i for i, ids in enumerate(found) if ids is None]
        if missing and use_cache and self.pieces is not None:
            left = []
            for i in missing:
                ids = self._piece_wise(segments[i])
                if ids is None:
                    left.append(i)
                    continue
                found[i] = fresh = tuple(ids)
                self.cache.put(self.owner, segments[i], fresh)
            missing = left
        if missing:
            encodings = self._encode_batch([segments[i] for i in missing], add_special_tokens=False)
            for i, encoding in zip(missing, encodings, strict=True):
                fresh = tuple(encoding.ids)
                found[i] = fresh
                if use_cache:
                    self.cache.put(self.owner, segments[i], fresh)
        out: list[int] = []
        for ids in found:
            if ids is not None:  # always: every miss was filled above
                out.extend(ids)
        return out

    def _piece_wise(self, segment: str) -> list[int] | None:
        """``segment``'s ids from the piece encoder, or None (the tokenizer encodes it)."""
        pieces = self.pieces
        if pieces is None:
            return None
        try:
            return pieces.encode(segment)
        except Exception:  # a bug, or a tokenizer read wrongly: never the request's failure
            logger.exception("piece-wise tokenization failed: turned off for this tokenizer")
            self.pieces = None
            return None
